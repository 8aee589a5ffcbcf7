/*
 * Visitors of the one record walk (_recordwalk.h) for the storage engine, in C:
 *
 * scan_records(data, count, base_offset, base_timestamp, max_timestamp, log_append_time,
 *              strict) -> None | (index, reason, offset, structural)   produce validation
 * scan_keys(data, count) -> [(key, offset_delta, tombstone)]   for compaction
 * batch_columns(data, start, end, include_headers) -> tuple | None   Arrow buffers for readers
 * encode_records(records, base_timestamp) -> bytes | None   the records section of a new batch
 * plain_batch(records, crc32c, header_type) -> (bytes, header) | None   a whole plain batch
 * plain_records(items, now_ms, record_type, unset) -> list | None   JSON produce's records
 *
 * The Python twins are in core_log.recordscan (over core_log.batch.walk_records); they agree
 * with these on every input (tests/core_log/test_recordwalk.py); encode_records's twin is
 * core_log.batch.encode_records_py (tests/core_log/test_encode_records.py), plain_records's
 * is api.records_codec.to_record (tests/api/test_plain_records.py).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "_recordwalk.h"

static PyObject *no_fault(void) { Py_RETURN_NONE; }

/* scan_records(data, count, base_offset, base_timestamp, max_timestamp, log_append_time,
 *              strict) -> None | (index, reason, offset, structural)
 * Walks every record with rw_record() (the rules are in _recordwalk.h) and checks every
 * timestamp; ``strict`` (a producer's batch) also wants offset deltas 0..count-1. Returns the
 * first fault, or None. The walk runs without the GIL: concurrent produce requests validate
 * their batches in parallel. Twin: core_log.batch.walk_records. */
static PyObject *scan_records(PyObject *self, PyObject *args) {
    Py_buffer buf;
    Py_ssize_t count;
    long long base_offset, base_ts, max_ts;
    int append_time, strict;
    if (!PyArg_ParseTuple(args, "y*nLLLpp", &buf, &count, &base_offset, &base_ts, &max_ts,
                          &append_time, &strict))
        return NULL;
    rw_batch b = {base_offset, base_ts, max_ts, append_time};
    const uint8_t *d = (const uint8_t *)buf.buf;
    size_t n = (size_t)buf.len, pos = 0;
    const char *why = NULL;
    Py_ssize_t i = 0;
    rw_rec r;
    int structural = 1;
    r.offset = -1;
    Py_BEGIN_ALLOW_THREADS
    for (i = 0; i < count; i++) {
        r.offset = -1;
        why = rw_record(d, n, &pos, &b, &r);
        if (why != NULL) break;
        if (strict && r.off_delta != i) { why = "offset deltas must be 0..n-1"; break; }
        if (!r.ts_ok) { why = "timestamp out of range"; structural = 0; break; }
    }
    if (why == NULL && pos != n) { why = "trailing bytes after the last record"; r.offset = -1; }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&buf);
    if (why == NULL) return no_fault();
    return Py_BuildValue("(nsLO)", i, why, (long long)r.offset, structural ? Py_True : Py_False);
}

/* scan_keys(data, count) -> list[(key: bytes | None, offset_delta: int, tombstone: bool)]
 * for compaction: rw_record()'s rules, timestamps unchecked (keys need none). Raises
 * ValueError on a record it rejects. */
static PyObject *scan_keys(PyObject *self, PyObject *args) {
    Py_buffer buf;
    Py_ssize_t count;
    if (!PyArg_ParseTuple(args, "y*n", &buf, &count)) return NULL;
    const uint8_t *d = (const uint8_t *)buf.buf;
    size_t n = (size_t)buf.len, pos = 0;
    rw_batch b = {0, 0, 0, 0};
    const char *why = NULL;
    PyObject *out = PyList_New(0);
    if (out == NULL) goto error;
    for (Py_ssize_t i = 0; i < count; i++) {
        rw_rec r;
        why = rw_record(d, n, &pos, &b, &r);
        if (why != NULL) goto bad;
        PyObject *key;
        if (r.klen < 0) {
            key = Py_NewRef(Py_None);
        } else {
            key = PyBytes_FromStringAndSize((const char *)d + r.kpos, (Py_ssize_t)r.klen);
            if (key == NULL) goto error;
        }
        PyObject *item = Py_BuildValue("(NLO)", key, (long long)r.off_delta,
                                       r.vlen < 0 ? Py_True : Py_False);
        if (item == NULL) goto error;
        int rc = PyList_Append(out, item);
        Py_DECREF(item);
        if (rc < 0) goto error;
    }
    if (pos != n) {
        why = "trailing bytes after the last record";
        goto bad;
    }
    PyBuffer_Release(&buf);
    return out;
bad:
    PyErr_SetString(PyExc_ValueError, why);
error:
    Py_XDECREF(out);
    PyBuffer_Release(&buf);
    return NULL;
}

/* ---------------------------------------------------------------------------------------
 * batch_columns(data, start_offset, end_offset, include_headers) -> tuple | None
 *
 * Column-wise decode of whole record batches back to back (a binary fetch answer), for
 * readers that want Arrow arrays rather than Record objects. Records with an offset in
 * [start_offset, end_offset) are kept; control batches are skipped; a trailing partial batch
 * is ignored. Returns None if a batch is compressed (the caller decompresses and calls again).
 *
 * The tuple, every buffer little-endian and laid out as Arrow expects:
 *   0 rows            int
 *   1 next_offset     int   where the next fetch starts: min(end, past the last batch walked)
 *   2 offsets         bytes int64[rows]
 *   3 timestamps_us   bytes int64[rows]   CreateTime: base + delta; LogAppendTime: maxTimestamp
 *   4 ts_types        bytes int32[rows]   0 CreateTime, 1 LogAppendTime
 *   5 key_offsets     bytes int32[rows+1]
 *   6 key_data        bytes
 *   7 key_validity    bytes bitmap | None (None: no null key)
 *   8-10 value_offsets, value_data, value_validity (same shapes)
 *   11 header_offsets bytes int32[rows+1]       (11-16 are None without include_headers)
 *   12 hkey_offsets   bytes int32[headers+1]
 *   13 hkey_data      bytes
 *   14 hvalue_offsets bytes int32[headers+1]
 *   15 hvalue_data    bytes
 *   16 hvalue_validity bytes bitmap | None
 * Raises ValueError on a malformed batch. Runs without the GIL; the Python twin is
 * core_log.recordscan.batch_columns_py.
 * ------------------------------------------------------------------------------------- */

typedef struct {
    char *p;
    Py_ssize_t len;
    Py_ssize_t cap;
} Buf;

static int buf_reserve(Buf *b, Py_ssize_t extra) {
    if (b->len + extra <= b->cap) return 1;
    Py_ssize_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra) cap *= 2;
    char *np = (char *)realloc(b->p, (size_t)cap);
    if (np == NULL) return 0;
    b->p = np;
    b->cap = cap;
    return 1;
}

static int buf_put(Buf *b, const void *src, Py_ssize_t n) {
    if (!buf_reserve(b, n)) return 0;
    if (n) memcpy(b->p + b->len, src, (size_t)n);
    b->len += n;
    return 1;
}

static int put_i64(Buf *b, int64_t v) { return buf_put(b, &v, 8); }
static int put_i32(Buf *b, int32_t v) { return buf_put(b, &v, 4); }

/* A validity bitmap grown bit by bit; `any_null` says whether it is needed at all. */
typedef struct {
    Buf bits;
    Py_ssize_t n;
    int any_null;
} Bitmap;

static int bitmap_push(Bitmap *m, int valid) {
    if ((m->n & 7) == 0) {
        uint8_t zero = 0;
        if (!buf_put(&m->bits, &zero, 1)) return 0;
    }
    if (valid)
        m->bits.p[m->n >> 3] |= (char)(1u << (m->n & 7));
    else
        m->any_null = 1;
    m->n++;
    return 1;
}

enum { COL_OFFSETS, COL_TS, COL_TSTYPE, COL_KOFF, COL_KDATA, COL_VOFF, COL_VDATA, COL_HOFF,
       COL_HKOFF, COL_HKDATA, COL_HVOFF, COL_HVDATA, N_BUFS };

typedef struct {
    Buf b[N_BUFS];
    Bitmap kvalid, vvalid, hvvalid;
    Py_ssize_t rows;
    int64_t next_offset;
    int64_t fault_offset; /* the record a failure is about, or -1 */
} Columns;

static void columns_free(Columns *c) {
    for (int i = 0; i < N_BUFS; i++) free(c->b[i].p);
    free(c->kvalid.bits.p);
    free(c->vvalid.bits.p);
    free(c->hvvalid.bits.p);
}

static uint32_t be32(const uint8_t *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}
static uint64_t be64(const uint8_t *p) { return ((uint64_t)be32(p) << 32) | be32(p + 4); }

/* Append one nullable byte string to (offsets, data, validity). */
static int put_bytes(Buf *offs, Buf *data, Bitmap *valid, const uint8_t *src, int64_t len) {
    if (len >= 0 && !buf_put(data, src, (Py_ssize_t)len)) return 0;
    if (data->len > INT32_MAX) return 0;
    return put_i32(offs, (int32_t)data->len) && bitmap_push(valid, len >= 0);
}

static const char OOM[] = "out of memory (or over 2 GiB in one column)";

/* Returns NULL and fills c, or the reason of a failure. *compressed is set (and NULL returned)
 * when a batch is compressed. */
static const char *columns_walk(const uint8_t *p, Py_ssize_t n, int64_t start, int64_t end,
                                int headers, Columns *c, int *compressed) {
    Py_ssize_t pos = 0;
    c->next_offset = start;
    /* A first pass over the batch headers: any compression means the caller decompresses. */
    for (Py_ssize_t q = 0; n - q >= 61;) {
        int64_t blen = (int32_t)be32(p + q + 8);
        if (blen < 49 || blen > n - q - 12) break;
        if (((p[q + 21] << 8) | p[q + 22]) & 0x07) { *compressed = 1; return NULL; }
        q += 12 + (Py_ssize_t)blen;
    }
    if (!put_i32(&c->b[COL_KOFF], 0) || !put_i32(&c->b[COL_VOFF], 0)) return OOM;
    if (headers && (!put_i32(&c->b[COL_HOFF], 0) || !put_i32(&c->b[COL_HKOFF], 0) ||
                    !put_i32(&c->b[COL_HVOFF], 0)))
        return OOM;
    int32_t nheaders = 0;
    while (n - pos >= 61) {
        const uint8_t *h = p + pos;
        int64_t base = (int64_t)be64(h);
        int64_t blen = (int32_t)be32(h + 8);
        if (blen < 49 || blen > n - pos - 12) break; /* trailing partial batch */
        if (h[16] != 2) return "unsupported batch magic";
        if (base >= end) break;
        int attributes = (h[21] << 8) | h[22];
        int64_t last_delta = (int32_t)be32(h + 23);
        int64_t base_ts = (int64_t)be64(h + 27);
        int64_t max_ts = (int64_t)be64(h + 35);
        int64_t count = (int32_t)be32(h + 57);
        int append_time = (attributes & 0x08) != 0;
        int control = (attributes & 0x20) != 0;
        Py_ssize_t batch_end = pos + 12 + (Py_ssize_t)blen;
        if (last_delta < 0 || count < 0) return "invalid batch header";
        int64_t batch_next;
        if (__builtin_add_overflow(base, last_delta + 1, &batch_next))
            return "invalid batch header";
        if (!control && batch_next > start) {
            const uint8_t *sec = p + pos + 61;
            size_t sn = (size_t)(batch_end - pos - 61), sp = 0;
            rw_batch b = {base, base_ts, max_ts, append_time};
            for (int64_t i = 0; i < count; i++) {
                rw_rec r;
                r.offset = -1;
                const char *why = rw_record(sec, sn, &sp, &b, &r);
                if (why != NULL) {
                    c->fault_offset = r.offset;
                    return why;
                }
                if (r.offset < start || r.offset >= end) continue;
                int64_t ts_us;
                if (!r.ts_ok || __builtin_mul_overflow(r.timestamp, (int64_t)1000, &ts_us)) {
                    c->fault_offset = r.offset;
                    return "timestamp out of range";
                }
                if (!put_i64(&c->b[COL_OFFSETS], r.offset) || !put_i64(&c->b[COL_TS], ts_us) ||
                    !put_i32(&c->b[COL_TSTYPE], append_time) ||
                    !put_bytes(&c->b[COL_KOFF], &c->b[COL_KDATA], &c->kvalid, sec + r.kpos, r.klen) ||
                    !put_bytes(&c->b[COL_VOFF], &c->b[COL_VDATA], &c->vvalid, sec + r.vpos, r.vlen))
                    return OOM;
                if (headers) {
                    size_t hp = r.hpos;
                    for (int64_t k = 0; k < r.hcount; k++) {
                        const uint8_t *hk, *hv;
                        int64_t hklen, hvlen;
                        rw_header(sec, r.end, &hp, &hk, &hklen, &hv, &hvlen);
                        if (!buf_put(&c->b[COL_HKDATA], hk, (Py_ssize_t)hklen) ||
                            c->b[COL_HKDATA].len > INT32_MAX ||
                            !put_i32(&c->b[COL_HKOFF], (int32_t)c->b[COL_HKDATA].len))
                            return OOM;
                        if (!put_bytes(&c->b[COL_HVOFF], &c->b[COL_HVDATA], &c->hvvalid, hv, hvlen))
                            return OOM;
                        if (nheaders == INT32_MAX) return OOM;
                        nheaders++;
                    }
                    if (!put_i32(&c->b[COL_HOFF], nheaders)) return OOM;
                }
                c->rows++;
            }
            if (sp != sn) return "trailing bytes after the last record";
        }
        if (batch_next > c->next_offset) c->next_offset = batch_next;
        pos = batch_end;
    }
    if (c->next_offset > end) c->next_offset = end;
    return NULL;
}

static PyObject *bytes_of(Buf *b) { return PyBytes_FromStringAndSize(b->p ? b->p : "", b->len); }

static PyObject *validity_of(Bitmap *m) {
    if (!m->any_null) Py_RETURN_NONE;
    return bytes_of(&m->bits);
}

static PyObject *batch_columns(PyObject *self, PyObject *args) {
    Py_buffer buf;
    long long start, end;
    int headers;
    if (!PyArg_ParseTuple(args, "y*LLp", &buf, &start, &end, &headers)) return NULL;
    Columns c;
    memset(&c, 0, sizeof c);
    c.fault_offset = -1;
    int compressed = 0;
    const char *why;
    Py_BEGIN_ALLOW_THREADS
    why = columns_walk((const uint8_t *)buf.buf, buf.len, start, end, headers, &c, &compressed);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&buf);
    PyObject *out = NULL;
    if (why != NULL) {
        if (why == OOM) PyErr_NoMemory();
        else PyErr_Format(PyExc_ValueError, "offset %lld: %s", (long long)c.fault_offset, why);
    } else if (compressed) {
        out = Py_NewRef(Py_None);
    } else if (headers) {
        out = Py_BuildValue("(nLNNNNNNNNNNNNNNN)", c.rows, (long long)c.next_offset,
                            bytes_of(&c.b[COL_OFFSETS]), bytes_of(&c.b[COL_TS]),
                            bytes_of(&c.b[COL_TSTYPE]), bytes_of(&c.b[COL_KOFF]),
                            bytes_of(&c.b[COL_KDATA]), validity_of(&c.kvalid),
                            bytes_of(&c.b[COL_VOFF]), bytes_of(&c.b[COL_VDATA]),
                            validity_of(&c.vvalid), bytes_of(&c.b[COL_HOFF]),
                            bytes_of(&c.b[COL_HKOFF]), bytes_of(&c.b[COL_HKDATA]),
                            bytes_of(&c.b[COL_HVOFF]), bytes_of(&c.b[COL_HVDATA]),
                            validity_of(&c.hvvalid));
    } else {
        out = Py_BuildValue("(nLNNNNNNNNNOOOOOO)", c.rows, (long long)c.next_offset,
                            bytes_of(&c.b[COL_OFFSETS]), bytes_of(&c.b[COL_TS]),
                            bytes_of(&c.b[COL_TSTYPE]), bytes_of(&c.b[COL_KOFF]),
                            bytes_of(&c.b[COL_KDATA]), validity_of(&c.kvalid),
                            bytes_of(&c.b[COL_VOFF]), bytes_of(&c.b[COL_VDATA]),
                            validity_of(&c.vvalid), Py_None, Py_None, Py_None, Py_None, Py_None,
                            Py_None);
    }
    columns_free(&c);
    return out;
}

/* ---- encode_records: the records section of a batch, from Record objects ------------------
 *
 * The per-record hot loop of every JSON produce (≈ 3 µs a record in Python for 100-byte
 * values, ≈ 0.1 µs here). Byte for byte what core_log.batch.encode_records_py writes: per
 * record a varint length, attributes 0, zig-zag varints of the timestamp delta and the offset
 * delta (0..n-1), key and value as length (-1: null) + bytes, then the headers (count; name
 * as UTF-8 with its length; value or -1). Anything off the typed path — a key or value that is
 * not exactly bytes or None, a header that is not (str, bytes | None), a timestamp delta or a
 * length outside int64, a name that is not encodable — returns None and the caller runs the
 * Python twin, which then raises or writes exactly what it always did. */

/* bytes of a zig-zag varint of n, written at out (room for 10) */
static size_t ez_varint(uint8_t *out, int64_t n) {
    uint64_t z = ((uint64_t)n << 1) ^ (uint64_t)(n >> 63);
    size_t k = 0;
    while (z >= 0x80) {
        out[k++] = (uint8_t)((z & 0x7F) | 0x80);
        z >>= 7;
    }
    out[k++] = (uint8_t)z;
    return k;
}

static size_t ez_len(int64_t n) {
    uint8_t tmp[10];
    return ez_varint(tmp, n);
}

typedef struct {
    uint8_t *p;
    size_t len, cap;
} ez_buf;

static int ez_reserve(ez_buf *b, size_t more) {
    if (more > SIZE_MAX / 2 - b->len) return -1;
    if (b->len + more <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + more) cap *= 2;
    uint8_t *p = (uint8_t *)PyMem_Realloc(b->p, cap);
    if (p == NULL) return -1;
    b->p = p;
    b->cap = cap;
    return 0;
}

static void ez_put(ez_buf *b, const void *src, size_t n) {
    if (n) memcpy(b->p + b->len, src, n);
    b->len += n;
}

static void ez_put_varint(ez_buf *b, int64_t n) { b->len += ez_varint(b->p + b->len, n); }

/* bytes or None -> (ptr, len), len -1 for None; 0 on success, 1 if neither */
static int ez_bytes(PyObject *o, const char **ptr, Py_ssize_t *len) {
    if (o == Py_None) {
        *ptr = NULL;
        *len = -1;
        return 0;
    }
    if (!PyBytes_CheckExact(o)) return 1;
    *ptr = PyBytes_AS_STRING(o);
    *len = PyBytes_GET_SIZE(o);
    return 0;
}

static PyObject *s_key, *s_value, *s_headers, *s_timestamp;

/* 1: not on the typed path (fall back), -1: error set, 0: appended */
static int ez_record(ez_buf *b, PyObject *rec, int64_t base_ts, Py_ssize_t delta) {
    PyObject *key = NULL, *value = NULL, *headers = NULL, *ts = NULL;
    int rc = 1;
    key = PyObject_GetAttr(rec, s_key);
    value = key ? PyObject_GetAttr(rec, s_value) : NULL;
    headers = value ? PyObject_GetAttr(rec, s_headers) : NULL;
    ts = headers ? PyObject_GetAttr(rec, s_timestamp) : NULL;
    if (ts == NULL) {
        PyErr_Clear(); /* the twin raises the same AttributeError */
        goto done;
    }
    const char *kp, *vp;
    Py_ssize_t kl, vl;
    if (ez_bytes(key, &kp, &kl) || ez_bytes(value, &vp, &vl)) goto done;
    if (!PyLong_CheckExact(ts)) goto done;
    int overflow = 0;
    long long t = PyLong_AsLongLongAndOverflow(ts, &overflow);
    if (overflow || (t == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        goto done;
    }
    int64_t d;
    if (__builtin_sub_overflow((int64_t)t, base_ts, &d)) goto done;
    if (!PyTuple_CheckExact(headers)) goto done;
    Py_ssize_t nh = PyTuple_GET_SIZE(headers);
    /* size of the headers part, checking every header's types */
    size_t hsize = ez_len(nh);
    for (Py_ssize_t i = 0; i < nh; i++) {
        PyObject *h = PyTuple_GET_ITEM(headers, i);
        if (!PyTuple_CheckExact(h) || PyTuple_GET_SIZE(h) != 2) goto done;
        PyObject *name = PyTuple_GET_ITEM(h, 0);
        if (!PyUnicode_CheckExact(name)) goto done;
        Py_ssize_t nl;
        if (PyUnicode_AsUTF8AndSize(name, &nl) == NULL) {
            PyErr_Clear(); /* e.g. a lone surrogate: the twin raises UnicodeEncodeError */
            goto done;
        }
        const char *hp = NULL;
        Py_ssize_t hl = 0;
        if (ez_bytes(PyTuple_GET_ITEM(h, 1), &hp, &hl)) goto done;
        hsize += ez_len(nl) + (size_t)nl + (hl < 0 ? 1 : ez_len(hl) + (size_t)hl);
    }
    size_t body = 1 + ez_len(d) + ez_len(delta) + (kl < 0 ? 1 : ez_len(kl) + (size_t)kl) +
                  (vl < 0 ? 1 : ez_len(vl) + (size_t)vl) + hsize;
    if (body > (size_t)INT64_MAX) goto done;
    if (ez_reserve(b, body + 10)) {
        PyErr_NoMemory();
        rc = -1;
        goto done;
    }
    ez_put_varint(b, (int64_t)body);
    b->p[b->len++] = 0; /* attributes */
    ez_put_varint(b, d);
    ez_put_varint(b, delta);
    ez_put_varint(b, kl);
    if (kl > 0) ez_put(b, kp, (size_t)kl);
    ez_put_varint(b, vl);
    if (vl > 0) ez_put(b, vp, (size_t)vl);
    ez_put_varint(b, nh);
    for (Py_ssize_t i = 0; i < nh; i++) {
        PyObject *h = PyTuple_GET_ITEM(headers, i);
        Py_ssize_t nl = 0, hl = 0;
        const char *np = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(h, 0), &nl), *hp = NULL;
        ez_bytes(PyTuple_GET_ITEM(h, 1), &hp, &hl); /* checked above */
        ez_put_varint(b, nl);
        ez_put(b, np, (size_t)nl);
        ez_put_varint(b, hl);
        if (hl > 0) ez_put(b, hp, (size_t)hl);
    }
    rc = 0;
done:
    Py_XDECREF(key);
    Py_XDECREF(value);
    Py_XDECREF(headers);
    Py_XDECREF(ts);
    return rc;
}

/* encode_records(records, base_timestamp) -> bytes | None (None: run the Python twin) */
static PyObject *encode_records(PyObject *self, PyObject *args) {
    PyObject *records, *seq;
    long long base_ts;
    if (!PyArg_ParseTuple(args, "OL", &records, &base_ts)) return NULL;
    seq = PySequence_Fast(records, "records must be a sequence");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    ez_buf b = {NULL, 0, 0};
    PyObject *out = NULL;
    if (ez_reserve(&b, (size_t)n * 128 + 64)) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        int rc = ez_record(&b, items[i], (int64_t)base_ts, i);
        if (rc < 0) goto done;
        if (rc > 0) {
            out = Py_NewRef(Py_None);
            goto done;
        }
    }
    out = PyBytes_FromStringAndSize((const char *)b.p, (Py_ssize_t)b.len);
done:
    PyMem_Free(b.p);
    Py_DECREF(seq);
    return out;
}

/* ---- plain_batch: a whole batch of plain records, and its header ------------------------------
 *
 * One v2 batch as core_log.batch.build_batch writes it with its defaults (base offset 0,
 * leader epoch -1, attributes 0, offset deltas 0..n-1, no producer id, epoch or sequence),
 * and its header as core_log.batch.parse_header reads it — for records the log's producer
 * checks cannot refuse (core_log.batch.built_headers): no record headers, every timestamp in
 * 0..MAX_TIMESTAMP_MS. A one-record JSON produce built its batch and header in ≈ 15 Python
 * calls (≈ 30 k instructions); here one. Anything else — a record with headers, a timestamp
 * out of range or not an int, a key or value off encode_records's typed path, no records or
 * too many — returns None and the caller builds and checks in Python, as before. The CRC-32C
 * is the ``crc32c`` callable the caller passes (the same one core_log.batch signs with). */

#define PB_HEADER 61
#define PB_MAX_TIMESTAMP 253402300799999LL
#define PB_MAX_RECORDS 1000000

static void pb_be(uint8_t *out, uint64_t v, int bytes) {
    for (int i = bytes - 1; i >= 0; i--) {
        out[i] = (uint8_t)(v & 0xFF);
        v >>= 8;
    }
}

/* A BatchHeader (a named tuple: a tuple subclass) of ``n`` integers, built as tuple.__new__
 * builds a subclass's instance (tp_alloc, then the items): calling the class went through its
 * Python __new__ and a 13-value format, ≈ 5.5 k instructions a request of the 10 k plain_batch
 * took (callgrind, benchmarks.request_cost --server). */
static PyObject *pb_header(PyObject *header_type, const long long *values, int n) {
    PyTypeObject *t = (PyTypeObject *)header_type;
    if (!PyType_Check(header_type) || !(t->tp_flags & Py_TPFLAGS_TUPLE_SUBCLASS)) {
        PyErr_SetString(PyExc_TypeError, "header_type must be a tuple subclass");
        return NULL;
    }
    PyObject *h = t->tp_alloc(t, n);
    if (h == NULL) return NULL;
    for (int i = 0; i < n; i++) {
        PyObject *v = PyLong_FromLongLong(values[i]);
        if (v == NULL) {
            Py_DECREF(h);
            return NULL;
        }
        PyTuple_SET_ITEM(h, i, v);
    }
    return h;
}

/* plain_batch(records, crc32c, header_type) -> (bytes, header) | None */
static PyObject *plain_batch(PyObject *self, PyObject *args) {
    PyObject *records, *crc_fn, *header_type, *seq;
    if (!PyArg_ParseTuple(args, "OOO", &records, &crc_fn, &header_type)) return NULL;
    seq = PySequence_Fast(records, "records must be a sequence");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    ez_buf b = {NULL, 0, 0};
    PyObject *out = NULL, *data = NULL, *view = NULL, *crc = NULL, *header = NULL;
    long long base_ts = 0, max_ts = 0;
    if (n < 1 || n > PB_MAX_RECORDS) goto fallback;
    for (Py_ssize_t i = 0; i < n; i++) { /* headers empty, timestamps in range */
        PyObject *h = PyObject_GetAttr(items[i], s_headers);
        if (h == NULL) {
            PyErr_Clear();
            goto fallback;
        }
        int empty = PyTuple_CheckExact(h) && PyTuple_GET_SIZE(h) == 0;
        Py_DECREF(h);
        if (!empty) goto fallback;
        PyObject *ts = PyObject_GetAttr(items[i], s_timestamp);
        if (ts == NULL) {
            PyErr_Clear();
            goto fallback;
        }
        int overflow = 0;
        long long t = PyLong_CheckExact(ts) ? PyLong_AsLongLongAndOverflow(ts, &overflow) : -1;
        Py_DECREF(ts);
        if (overflow || t < 0 || t > PB_MAX_TIMESTAMP) {
            PyErr_Clear();
            goto fallback;
        }
        if (i == 0) base_ts = max_ts = t;
        if (t > max_ts) max_ts = t;
    }
    if (ez_reserve(&b, PB_HEADER + (size_t)n * 128 + 64)) {
        PyErr_NoMemory();
        goto done;
    }
    b.len = PB_HEADER;
    for (Py_ssize_t i = 0; i < n; i++) {
        int rc = ez_record(&b, items[i], (int64_t)base_ts, i);
        if (rc < 0) goto done;
        if (rc > 0) goto fallback;
    }
    if (b.len - 12 > (size_t)INT32_MAX) goto fallback;
    uint8_t *p = b.p;
    memset(p, 0, PB_HEADER);
    pb_be(p + 8, (uint64_t)(b.len - 12), 4);    /* batchLength */
    pb_be(p + 12, (uint64_t)(int64_t)-1, 4);    /* partitionLeaderEpoch */
    p[16] = 2;                                  /* magic */
    pb_be(p + 23, (uint64_t)(n - 1), 4);        /* lastOffsetDelta */
    pb_be(p + 27, (uint64_t)base_ts, 8);        /* baseTimestamp */
    pb_be(p + 35, (uint64_t)max_ts, 8);         /* maxTimestamp */
    pb_be(p + 43, (uint64_t)(int64_t)-1, 8);    /* producerId */
    pb_be(p + 51, (uint64_t)(int64_t)-1, 2);    /* producerEpoch */
    pb_be(p + 53, (uint64_t)(int64_t)-1, 4);    /* baseSequence */
    pb_be(p + 57, (uint64_t)n, 4);              /* recordCount */
    view = PyMemoryView_FromMemory((char *)p + 21, (Py_ssize_t)(b.len - 21), PyBUF_READ);
    if (view == NULL) goto done;
    crc = PyObject_CallOneArg(crc_fn, view);
    if (crc == NULL) goto done;
    unsigned long c = PyLong_AsUnsignedLong(crc);
    if (c == (unsigned long)-1 && PyErr_Occurred()) goto done;
    pb_be(p + 17, (uint64_t)c, 4);
    data = PyBytes_FromStringAndSize((const char *)p, (Py_ssize_t)b.len);
    if (data == NULL) goto done;
    const long long fields[13] = {0, (long long)(b.len - 12), -1, 2, (long long)c, 0,
                                  (long long)(n - 1), base_ts, max_ts, -1, -1, -1,
                                  (long long)n};
    header = pb_header(header_type, fields, 13);
    if (header == NULL) goto done;
    out = PyTuple_Pack(2, data, header);
    goto done;
fallback:
    out = Py_NewRef(Py_None);
done:
    Py_XDECREF(view);
    Py_XDECREF(crc);
    Py_XDECREF(data);
    Py_XDECREF(header);
    PyMem_Free(b.p);
    Py_DECREF(seq);
    return out;
}

/* ---- plain_records: JSON produce's decoded records -> (partition, Record) ------------------
 *
 * The twin of ``[to_record(r, now_ms, ...) for r in items]`` (api/records_codec.py) for items
 * of the common shape — no key_b64, no value_b64, no headers — (≈ 1.3 µs a record in Python,
 * a function call, three attribute tests and a dataclass __init__ per record). ``items`` are
 * msgspec structs the body decoder has validated; per item: the value's raw JSON text as
 * bytes (``null``: a tombstone), the key's UTF-8 bytes, the timestamp or ``now_ms``, and
 * a ``record_type`` (core_log.batch.Record: value, key, headers, timestamp, offset) made
 * as its __init__ makes it. Any item off that shape or of an unexpected type
 * makes it return None: the caller runs the twin over the whole list, which decides (and
 * raises) exactly as before. */

static PyObject *s_key_b64, *s_value_b64, *s_partition, *s_offset, *s_empty, *s_minus_one;

static PyObject *plain_records(PyObject *self, PyObject *args) {
    PyObject *items, *now, *record_type, *unset;
    if (!PyArg_ParseTuple(args, "O!O!O!O", &PyList_Type, &items, &PyLong_Type, &now,
                          &PyType_Type, &record_type, &unset))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(items);
    PyObject *out = PyList_New(n);
    if (out == NULL) return NULL;
    PyObject *a[7]; /* key, key_b64, value, value_b64, headers, partition, timestamp */
    PyObject *const names[7] = {s_key,     s_key_b64,   s_value,    s_value_b64,
                                s_headers, s_partition, s_timestamp};
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyList_GET_ITEM(items, i), *value = NULL, *key = NULL, *rec = NULL;
        int k;
        for (k = 0; k < 7; k++) a[k] = NULL;
        for (k = 0; k < 7; k++) {
            a[k] = PyObject_GetAttr(item, names[k]);
            if (a[k] == NULL) {
                PyErr_Clear();
                goto fallback;
            }
        }
        if (a[1] != unset || a[3] != unset || a[4] != Py_None) goto fallback;
        if (!(a[5] == Py_None || PyLong_CheckExact(a[5]))) goto fallback;
        if (!(a[6] == Py_None || PyLong_CheckExact(a[6]))) goto fallback;
        /* value: unset -> None; raw JSON text -> bytes; "null" -> None */
        if (a[2] == unset) {
            value = Py_NewRef(Py_None);
        } else {
            Py_buffer vb;
            if (PyObject_GetBuffer(a[2], &vb, PyBUF_SIMPLE) < 0) {
                PyErr_Clear();
                goto fallback;
            }
            if (vb.len == 4 && memcmp(vb.buf, "null", 4) == 0)
                value = Py_NewRef(Py_None);
            else
                value = PyBytes_FromStringAndSize((const char *)vb.buf, vb.len);
            PyBuffer_Release(&vb);
            if (value == NULL) goto error;
        }
        /* key: unset or None -> None; str -> its UTF-8 */
        if (a[0] == unset || a[0] == Py_None) {
            key = Py_NewRef(Py_None);
        } else if (PyUnicode_CheckExact(a[0])) {
            Py_ssize_t kl;
            const char *kp = PyUnicode_AsUTF8AndSize(a[0], &kl);
            if (kp == NULL) {
                PyErr_Clear(); /* not encodable: the twin raises */
                goto fallback;
            }
            key = PyBytes_FromStringAndSize(kp, kl);
            if (key == NULL) goto error;
        } else {
            goto fallback;
        }
        {
            /* Record's __init__ (a dataclass's, in Python) is most of the twin's cost: the
             * instance is made as object.__new__(Record) and its five slots set as
             * __init__ sets them */
            PyObject *ts = a[6] == Py_None ? now : a[6];
            rec = PyBaseObject_Type.tp_new((PyTypeObject *)record_type, s_empty, NULL);
            if (rec == NULL) goto error;
            if (PyObject_SetAttr(rec, s_value, value) < 0 ||
                PyObject_SetAttr(rec, s_key, key) < 0 ||
                PyObject_SetAttr(rec, s_headers, s_empty) < 0 ||
                PyObject_SetAttr(rec, s_timestamp, ts) < 0 ||
                PyObject_SetAttr(rec, s_offset, s_minus_one) < 0)
                goto error;
            PyObject *pair = PyTuple_Pack(2, a[5], rec);
            if (pair == NULL) goto error;
            PyList_SET_ITEM(out, i, pair);
        }
        Py_DECREF(rec);
        Py_DECREF(value);
        Py_DECREF(key);
        for (k = 0; k < 7; k++) Py_DECREF(a[k]);
        continue;
    fallback:
        Py_XDECREF(value);
        Py_XDECREF(key);
        for (k = 0; k < 7; k++) Py_XDECREF(a[k]);
        Py_DECREF(out);
        Py_RETURN_NONE;
    error:
        Py_XDECREF(rec);
        Py_XDECREF(value);
        Py_XDECREF(key);
        for (k = 0; k < 7; k++) Py_XDECREF(a[k]);
        Py_DECREF(out);
        return NULL;
    }
    return out;
}

static PyMethodDef methods[] = {
    {"plain_records", plain_records, METH_VARARGS,
     "plain_records(items, now_ms, record_type, unset): [(partition, Record)] of decoded JSON "
     "records of the common shape, or None if one is not (the caller runs the Python twin)"},
    {"plain_batch", plain_batch, METH_VARARGS,
     "plain_batch(records, crc32c, header_type): (a whole batch of records without headers and "
     "with timestamps in range, its header) as build_batch writes and parse_header reads them, "
     "or None (the caller builds and checks in Python)"},
    {"encode_records", encode_records, METH_VARARGS,
     "encode_records(records, base_timestamp): the records section of a batch (offset deltas "
     "0..n-1), or None when a record is off the typed path (the caller runs the Python twin)"},
    {"scan_keys", scan_keys, METH_VARARGS,
     "scan_keys(data, count): [(key, offset_delta, tombstone)] of a validated records section"},
    {"scan_records", scan_records, METH_VARARGS,
     "scan_records(data, count, base_offset, base_timestamp, max_timestamp, log_append_time, "
     "strict): the first fault of a records section as (index, reason, offset, structural), "
     "or None"},
    {"batch_columns", batch_columns, METH_VARARGS,
     "batch_columns(data, start_offset, end_offset, include_headers): Arrow column buffers of "
     "the records in [start, end) of whole uncompressed batches, or None if one is compressed"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_recordscan", NULL, -1, methods};

PyMODINIT_FUNC PyInit__recordscan(void) {
    s_key = PyUnicode_InternFromString("key");
    s_value = PyUnicode_InternFromString("value");
    s_headers = PyUnicode_InternFromString("headers");
    s_timestamp = PyUnicode_InternFromString("timestamp");
    s_key_b64 = PyUnicode_InternFromString("key_b64");
    s_value_b64 = PyUnicode_InternFromString("value_b64");
    s_partition = PyUnicode_InternFromString("partition");
    s_offset = PyUnicode_InternFromString("offset");
    s_minus_one = PyLong_FromLong(-1);
    s_empty = PyTuple_New(0);
    if (!s_key || !s_value || !s_headers || !s_timestamp || !s_key_b64 || !s_value_b64 ||
        !s_partition || !s_offset || !s_minus_one || !s_empty)
        return NULL;
    return PyModule_Create(&module);
}
