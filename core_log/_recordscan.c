/*
 * Structural validation of the records section of a Kafka record batch v2, in C.
 *
 * scan_records(data: bytes-like, count: int, max_headers: int) -> None
 *   Walks `count` records (see core_log/batch.py for the layout), checking every varint,
 *   every length against the record's end, offset deltas 0..count-1, header counts and UTF-8
 *   header keys, and that the records end exactly at the end of `data`.
 *   Raises ValueError("record N: reason") on the first violation.
 *
 * The pure-Python twin is core_log.recordscan.scan_records_py; the two must agree (tested).
 *
 * scan_keys(data, count) -> [(key, offset_delta, tombstone)]   for compaction
 * batch_columns(data, start, end, include_headers) -> tuple | None   Arrow buffers for readers
 *   (see its comment below; twin: core_log.recordscan.batch_columns_py)
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const uint8_t *p;
    Py_ssize_t pos;
    Py_ssize_t end;
} Cursor;

/* Zig-zag varint of at most 10 bytes within [pos, end). Returns 0 on failure. */
static int read_varint(Cursor *c, int64_t *out) {
    uint64_t z = 0;
    int shift = 0;
    while (c->pos < c->end) {
        uint8_t b = c->p[c->pos++];
        if (shift == 63 && b > 1) return 0;
        z |= (uint64_t)(b & 0x7F) << shift;
        if (b < 0x80) {
            *out = (int64_t)(z >> 1) ^ -(int64_t)(z & 1);
            return 1;
        }
        shift += 7;
        if (shift > 63) return 0;
    }
    return 0;
}

static int skip_bytes(Cursor *c, int64_t len, int nullable) {
    if (len == -1 && nullable) return 1;
    if (len < 0 || len > c->end - c->pos) return 0;
    c->pos += (Py_ssize_t)len;
    return 1;
}

static int valid_utf8(const uint8_t *s, Py_ssize_t n) {
    Py_ssize_t i = 0;
    while (i < n) {
        uint8_t b = s[i];
        int extra;
        uint32_t cp;
        if (b < 0x80) { i++; continue; }
        else if ((b & 0xE0) == 0xC0) { extra = 1; cp = b & 0x1F; }
        else if ((b & 0xF0) == 0xE0) { extra = 2; cp = b & 0x0F; }
        else if ((b & 0xF8) == 0xF0) { extra = 3; cp = b & 0x07; }
        else return 0;
        if (i + extra >= n) return 0; /* continuation bytes past the end */
        for (int k = 1; k <= extra; k++) {
            uint8_t cb = s[i + k];
            if ((cb & 0xC0) != 0x80) return 0;
            cp = (cp << 6) | (cb & 0x3F);
        }
        if ((extra == 1 && cp < 0x80) || (extra == 2 && cp < 0x800) ||
            (extra == 3 && (cp < 0x10000 || cp > 0x10FFFF)) ||
            (cp >= 0xD800 && cp <= 0xDFFF))
            return 0;
        i += extra + 1;
    }
    return 1;
}

/* The walk itself touches no Python object, so it runs without the GIL: concurrent produce
 * requests validate their batches in parallel. Returns NULL on success, else the reason and
 * the failing record index in *at. */
static const char *walk(const uint8_t *p, Py_ssize_t n, Py_ssize_t count, Py_ssize_t max_headers,
                        Py_ssize_t *at) {
    Cursor all = {p, 0, n};
    for (Py_ssize_t i = 0; i < count; i++) {
        int64_t length, ts_delta, off_delta, klen, vlen, hcount;
        *at = i;
        if (!read_varint(&all, &length)) return "bad record length varint";
        if (length < 1 || length > n - all.pos) return "record length runs past the batch";
        Cursor c = {p, all.pos, all.pos + (Py_ssize_t)length};
        c.pos++; /* attributes */
        if (!read_varint(&c, &ts_delta)) return "bad timestamp delta";
        if (!read_varint(&c, &off_delta)) return "bad offset delta";
        if (off_delta != i) return "offset deltas must be 0..n-1";
        if (!read_varint(&c, &klen) || !skip_bytes(&c, klen, 1)) return "key runs past the record";
        if (!read_varint(&c, &vlen) || !skip_bytes(&c, vlen, 1))
            return "value runs past the record";
        if (!read_varint(&c, &hcount) || hcount < 0 || hcount > max_headers)
            return "invalid header count";
        for (int64_t h = 0; h < hcount; h++) {
            int64_t hklen, hvlen;
            if (!read_varint(&c, &hklen) || hklen < 0 || hklen > c.end - c.pos)
                return "header key runs past the record";
            if (!valid_utf8(p + c.pos, (Py_ssize_t)hklen)) return "header key is not UTF-8";
            c.pos += (Py_ssize_t)hklen;
            if (!read_varint(&c, &hvlen) || !skip_bytes(&c, hvlen, 1))
                return "header value runs past the record";
        }
        if (c.pos != c.end) return "record length does not match its fields";
        all.pos = c.end;
    }
    *at = count;
    if (all.pos != n) return "trailing bytes after the last record";
    return NULL;
}

static PyObject *scan_records(PyObject *self, PyObject *args) {
    Py_buffer buf;
    Py_ssize_t count, max_headers, at = 0;
    const char *why;
    if (!PyArg_ParseTuple(args, "y*nn", &buf, &count, &max_headers)) return NULL;
    Py_BEGIN_ALLOW_THREADS
    why = walk((const uint8_t *)buf.buf, buf.len, count, max_headers, &at);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&buf);
    if (why != NULL) {
        PyErr_Format(PyExc_ValueError, "record %zd: %s", at, why);
        return NULL;
    }
    Py_RETURN_NONE;
}

/* scan_keys(data, count) -> list[(key: bytes | None, offset_delta: int, tombstone: bool)]
 * for a records section already validated (by the log); raises ValueError if it is not. */
static PyObject *scan_keys(PyObject *self, PyObject *args) {
    Py_buffer buf;
    Py_ssize_t count;
    if (!PyArg_ParseTuple(args, "y*n", &buf, &count)) return NULL;
    const uint8_t *p = (const uint8_t *)buf.buf;
    Py_ssize_t n = buf.len;
    PyObject *out = PyList_New(0);
    if (out == NULL) goto error;
    Cursor all = {p, 0, n};
    for (Py_ssize_t i = 0; i < count; i++) {
        int64_t length, ts_delta, off_delta, klen, vlen;
        if (!read_varint(&all, &length) || length < 1 || length > n - all.pos) goto bad;
        Cursor c = {p, all.pos, all.pos + (Py_ssize_t)length};
        c.pos++;
        if (!read_varint(&c, &ts_delta) || !read_varint(&c, &off_delta)) goto bad;
        if (!read_varint(&c, &klen) || klen < -1 || klen > c.end - c.pos) goto bad;
        PyObject *key;
        if (klen < 0) {
            key = Py_NewRef(Py_None);
        } else {
            key = PyBytes_FromStringAndSize((const char *)p + c.pos, (Py_ssize_t)klen);
            if (key == NULL) goto error;
            c.pos += (Py_ssize_t)klen;
        }
        if (!read_varint(&c, &vlen)) { Py_DECREF(key); goto bad; }
        PyObject *item = Py_BuildValue("(NLO)", key, (long long)off_delta, vlen < 0 ? Py_True : Py_False);
        if (item == NULL) goto error;
        int rc = PyList_Append(out, item);
        Py_DECREF(item);
        if (rc < 0) goto error;
        all.pos = c.end;
    }
    PyBuffer_Release(&buf);
    return out;
bad:
    PyErr_SetString(PyExc_ValueError, "records section is not valid");
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
        int64_t batch_next = base + last_delta + 1;
        if (!control && batch_next > start) {
            Cursor all = {p, pos + 61, batch_end};
            for (int64_t i = 0; i < count; i++) {
                int64_t length, ts_delta, off_delta, klen, vlen, hcount;
                if (!read_varint(&all, &length) || length < 1 || length > all.end - all.pos)
                    return "record length runs past the batch";
                Cursor r = {p, all.pos + 1, all.pos + (Py_ssize_t)length};
                all.pos = r.end;
                if (!read_varint(&r, &ts_delta) || !read_varint(&r, &off_delta))
                    return "bad timestamp or offset delta";
                int64_t offset = base + off_delta;
                if (offset < start) continue;
                if (offset >= end) break;
                Py_ssize_t kpos, vpos;
                if (!read_varint(&r, &klen) || klen < -1 || klen > r.end - r.pos)
                    return "key runs past the record";
                kpos = r.pos;
                r.pos += klen > 0 ? (Py_ssize_t)klen : 0;
                if (!read_varint(&r, &vlen) || vlen < -1 || vlen > r.end - r.pos)
                    return "value runs past the record";
                vpos = r.pos;
                r.pos += vlen > 0 ? (Py_ssize_t)vlen : 0;
                int64_t ts = append_time ? max_ts : base_ts + ts_delta;
                if (!put_i64(&c->b[COL_OFFSETS], offset) || !put_i64(&c->b[COL_TS], ts * 1000) ||
                    !put_i32(&c->b[COL_TSTYPE], append_time) ||
                    !put_bytes(&c->b[COL_KOFF], &c->b[COL_KDATA], &c->kvalid, p + kpos, klen) ||
                    !put_bytes(&c->b[COL_VOFF], &c->b[COL_VDATA], &c->vvalid, p + vpos, vlen))
                    return OOM;
                if (headers) {
                    if (!read_varint(&r, &hcount) || hcount < 0 || hcount > r.end - r.pos)
                        return "invalid header count";
                    for (int64_t k = 0; k < hcount; k++) {
                        int64_t hklen, hvlen;
                        if (!read_varint(&r, &hklen) || hklen < 0 || hklen > r.end - r.pos)
                            return "header key runs past the record";
                        if (!valid_utf8(p + r.pos, (Py_ssize_t)hklen)) return "header key is not UTF-8";
                        if (!buf_put(&c->b[COL_HKDATA], p + r.pos, (Py_ssize_t)hklen) ||
                            c->b[COL_HKDATA].len > INT32_MAX ||
                            !put_i32(&c->b[COL_HKOFF], (int32_t)c->b[COL_HKDATA].len))
                            return OOM;
                        r.pos += (Py_ssize_t)hklen;
                        if (!read_varint(&r, &hvlen) || hvlen < -1 || hvlen > r.end - r.pos)
                            return "header value runs past the record";
                        if (!put_bytes(&c->b[COL_HVOFF], &c->b[COL_HVDATA], &c->hvvalid,
                                       p + r.pos, hvlen))
                            return OOM;
                        r.pos += hvlen > 0 ? (Py_ssize_t)hvlen : 0;
                        if (nheaders == INT32_MAX) return OOM;
                        nheaders++;
                    }
                    if (!put_i32(&c->b[COL_HOFF], nheaders)) return OOM;
                }
                c->rows++;
            }
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
    int compressed = 0;
    const char *why;
    Py_BEGIN_ALLOW_THREADS
    why = columns_walk((const uint8_t *)buf.buf, buf.len, start, end, headers, &c, &compressed);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&buf);
    PyObject *out = NULL;
    if (why != NULL) {
        if (why == OOM) PyErr_NoMemory();
        else PyErr_SetString(PyExc_ValueError, why);
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

static PyMethodDef methods[] = {
    {"scan_keys", scan_keys, METH_VARARGS,
     "scan_keys(data, count): [(key, offset_delta, tombstone)] of a validated records section"},
    {"scan_records", scan_records, METH_VARARGS,
     "scan_records(data, count, max_headers): validate a records section or raise ValueError"},
    {"batch_columns", batch_columns, METH_VARARGS,
     "batch_columns(data, start_offset, end_offset, include_headers): Arrow column buffers of "
     "the records in [start, end) of whole uncompressed batches, or None if one is compressed"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_recordscan", NULL, -1, methods};

PyMODINIT_FUNC PyInit__recordscan(void) { return PyModule_Create(&module); }
