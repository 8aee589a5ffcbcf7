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
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

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

static PyMethodDef methods[] = {
    {"scan_keys", scan_keys, METH_VARARGS,
     "scan_keys(data, count): [(key, offset_delta, tombstone)] of a validated records section"},
    {"scan_records", scan_records, METH_VARARGS,
     "scan_records(data, count, max_headers): validate a records section or raise ValueError"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_recordscan", NULL, -1, methods};

PyMODINIT_FUNC PyInit__recordscan(void) { return PyModule_Create(&module); }
