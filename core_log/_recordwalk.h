/*
 * The one walk over the records section of a Kafka record batch v2, shared by every C reader.
 *
 * Produce validation (_recordscan.c scan_records), compaction keys (scan_keys), Arrow columns
 * (batch_columns) and JSON rendering (_recordjson.c) all read records through rw_record(), so
 * they accept and reject exactly the same bytes: what produce accepts, every reader can serve.
 * The Python twin of this walk is core_log.batch.walk_records (same rules, same reasons); the
 * differential tests in tests/core_log/test_recordwalk.py hold the two together.
 *
 * The rules, for each record (see core_log/batch.py for the layout):
 *   - the length is a varint >= 1 that fits in the section; every field varint lies inside
 *     the record, and the fields end exactly at the record's end;
 *   - key and value lengths are -1 (null) or 0..what is left of the record;
 *   - 0..RW_MAX_HEADERS header pairs; a header key is 0..RW_MAX_HEADER_KEY_BYTES of UTF-8,
 *     a header value -1 or 0..what is left;
 *   - the offset delta is >= 0 and base offset + delta does not overflow 64 bits;
 *   - the timestamp (maxTimestamp under LogAppendTime, else baseTimestamp + delta, checked)
 *     is -1 (none) or 0..RW_MAX_TIMESTAMP_MS (9999-12-31T23:59:59.999Z): every reader can
 *     render it (Java's Instant, Python's datetime, Arrow's int64 microseconds).
 * Structural faults (everything but the timestamp) make the rest of the section unreadable;
 * a timestamp fault is one record's, and the walk can go on past it.
 *
 * Checked arithmetic needs the GCC/Clang builtins: a compiler without them is an error, not a
 * silent fall back to the slow pure-Python path.
 */
#ifndef LOGBUS_RECORDWALK_H
#define LOGBUS_RECORDWALK_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__has_builtin)
#if !__has_builtin(__builtin_add_overflow) || !__has_builtin(__builtin_mul_overflow)
#error "Logbus's record walk needs __builtin_add_overflow and __builtin_mul_overflow"
#endif
#elif !defined(__GNUC__) || __GNUC__ < 5
#error "Logbus's record walk needs GCC >= 5 or Clang (checked-arithmetic builtins)"
#endif

#define RW_MAX_HEADERS 1024                     /* = core_log.limits.MAX_HEADERS_PER_RECORD */
#define RW_MAX_HEADER_KEY_BYTES (64 * 1024)     /* = core_log.limits.MAX_HEADER_KEY_BYTES */
#define RW_MAX_TIMESTAMP_MS 253402300799999LL   /* = core_log.limits.MAX_TIMESTAMP_MS */
#define RW_NO_TIMESTAMP (-1)

/* The batch header fields a record walk needs. */
typedef struct {
    int64_t base_offset;
    int64_t base_timestamp;
    int64_t max_timestamp;
    int log_append_time;
} rw_batch;

/* One record, as rw_record() found it: positions are into the section. */
typedef struct {
    size_t end;         /* just past the record */
    int64_t off_delta;
    int64_t offset;     /* absolute */
    int64_t timestamp;  /* absolute; valid only if ts_ok */
    int ts_ok;
    int64_t klen;       /* -1: null */
    size_t kpos;
    int64_t vlen;       /* -1: null */
    size_t vpos;
    int64_t hcount;
    size_t hpos;        /* the first header, after the count */
} rw_rec;

/* Zig-zag varint of at most 10 bytes / 64 bits at d[*pos], below end. 0 on success. */
static inline int rw_varint(const uint8_t *d, size_t end, size_t *pos, int64_t *value) {
    size_t p = *pos;
    if (p >= end) return -1;
    uint8_t b = d[p++];
    uint64_t z = b & 0x7F;
    if (b >= 0x80) {
        int shift = 7;
        for (;;) {
            if (p >= end) return -1;
            b = d[p++];
            if (shift == 63 && (b & 0x7F) > 1) return -1; /* more than 64 bits */
            z |= (uint64_t)(b & 0x7F) << shift;
            if (b < 0x80) break;
            shift += 7;
            if (shift > 63) return -1; /* longer than 10 bytes */
        }
    }
    *value = (int64_t)(z >> 1) ^ -(int64_t)(z & 1);
    *pos = p;
    return 0;
}

/* Length of the valid UTF-8 sequence at s[0] (s[0] >= 0x80), or 0: exactly the sequences
 * Python's strict decoder accepts (no overlongs, no surrogates, nothing above U+10FFFF). */
static inline size_t rw_utf8_seq(const uint8_t *s, size_t avail) {
    uint8_t c = s[0];
    if (c >= 0xC2 && c <= 0xDF) return (avail >= 2 && (s[1] & 0xC0) == 0x80) ? 2 : 0;
    if (c >= 0xE0 && c <= 0xEF) {
        if (avail < 3 || (s[2] & 0xC0) != 0x80) return 0;
        uint8_t lo = 0x80, hi = 0xBF;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
        return (s[1] >= lo && s[1] <= hi) ? 3 : 0;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        if (avail < 4 || (s[2] & 0xC0) != 0x80 || (s[3] & 0xC0) != 0x80) return 0;
        uint8_t lo = 0x80, hi = 0xBF;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
        return (s[1] >= lo && s[1] <= hi) ? 4 : 0;
    }
    return 0;
}

static inline int rw_utf8_valid(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        while (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (w & 0x8080808080808080ULL) break;
            i += 8;
        }
        if (i >= n) break;
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        size_t k = rw_utf8_seq(s + i, n - i);
        if (k == 0) return 0;
        i += k;
    }
    return 1;
}

static inline int rw_timestamp_ok(int64_t ts) {
    return ts == RW_NO_TIMESTAMP || (ts >= 0 && ts <= RW_MAX_TIMESTAMP_MS);
}

/* A length-prefixed nullable field at *pos inside [.., end). */
static inline int rw_field(const uint8_t *d, size_t end, size_t *pos, int64_t *len) {
    if (rw_varint(d, end, pos, len) < 0) return -1;
    if (*len == -1) return 0;
    if (*len < 0 || (uint64_t)*len > end - *pos) return -1;
    *pos += (size_t)*len;
    return 0;
}

/* The record at d[*pos] of a section of n bytes. Returns NULL and fills r (and moves *pos past
 * the record), or the reason it is unreadable (*pos is then undefined; r->offset is set once
 * the offset delta was read, so the caller presets it to -1). A bad timestamp is not
 * a failure here: r->ts_ok says, and the caller decides (it matters only for records it
 * serves). Touches no Python object: callers run it without the GIL. */
static const char *rw_record(const uint8_t *d, size_t n, size_t *pos, const rw_batch *b,
                             rw_rec *r) {
    int64_t length, ts_delta;
    size_t p = *pos;
    if (rw_varint(d, n, &p, &length) < 0) return "bad record length varint";
    if (length < 1 || (uint64_t)length > n - p) return "record length runs past the section";
    size_t end = p + (size_t)length;
    r->end = end;
    p++; /* attributes: unused in v2 */
    if (rw_varint(d, end, &p, &ts_delta) < 0) return "bad timestamp delta";
    if (rw_varint(d, end, &p, &r->off_delta) < 0) return "bad offset delta";
    int64_t offset;
    if (r->off_delta < 0 || __builtin_add_overflow(b->base_offset, r->off_delta, &offset))
        return "offset delta out of range";
    r->offset = offset;
    r->kpos = p;
    if (rw_field(d, end, &p, &r->klen) < 0) return "key runs past the record";
    if (r->klen >= 0) r->kpos = p - (size_t)r->klen;
    r->vpos = p;
    if (rw_field(d, end, &p, &r->vlen) < 0) return "value runs past the record";
    if (r->vlen >= 0) r->vpos = p - (size_t)r->vlen;
    if (rw_varint(d, end, &p, &r->hcount) < 0 || r->hcount < 0 || r->hcount > RW_MAX_HEADERS)
        return "invalid header count";
    r->hpos = p;
    for (int64_t h = 0; h < r->hcount; h++) {
        int64_t hklen, hvlen;
        if (rw_varint(d, end, &p, &hklen) < 0 || hklen < 0 || (uint64_t)hklen > end - p)
            return "header key runs past the record";
        if (hklen > RW_MAX_HEADER_KEY_BYTES) return "header key too long";
        if (!rw_utf8_valid(d + p, (size_t)hklen)) return "header key is not UTF-8";
        p += (size_t)hklen;
        if (rw_field(d, end, &p, &hvlen) < 0) return "header value runs past the record";
    }
    if (p != end) return "record length does not match its fields";
    if (b->log_append_time) {
        r->timestamp = b->max_timestamp;
        r->ts_ok = rw_timestamp_ok(r->timestamp);
    } else {
        r->ts_ok = !__builtin_add_overflow(b->base_timestamp, ts_delta, &r->timestamp) &&
                   rw_timestamp_ok(r->timestamp);
    }
    *pos = end;
    return NULL;
}

/* The next header of a record rw_record() accepted: key at *k (*klen bytes), value at *v
 * (*vlen bytes, -1: null). *hp starts at r->hpos. */
static inline void rw_header(const uint8_t *d, size_t end, size_t *hp, const uint8_t **k,
                             int64_t *klen, const uint8_t **v, int64_t *vlen) {
    *klen = 0;
    *vlen = -1;
    (void)rw_varint(d, end, hp, klen);
    *k = d + *hp;
    *hp += (size_t)*klen;
    (void)rw_varint(d, end, hp, vlen);
    *v = d + *hp;
    if (*vlen > 0) *hp += (size_t)*vlen;
}

#endif
