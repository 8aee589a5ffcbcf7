/* The records section of a Kafka v2 batch -> JSON objects, one per record, in C.
 *
 * The Python twin and the wrapper are core_log/recordjson.py; read its docstring for the
 * output format. This file does one thing: walk the records of one (decompressed) section
 * with the one record walk every reader shares (_recordwalk.h; its Python twin is
 * core_log.batch.walk_records), and write for each record at or after ``start_offset`` (at
 * most ``max_records``) its JSON object with ``extra`` appended inside it.
 *
 * A record the walk rejects stops it: what came before is returned with the fault (reason,
 * offset, structural), and the caller decides. The walk runs without the GIL: it touches no
 * Python object, writes into a raw-malloc'd buffer and reports faults as static messages.
 *
 * The JSON validator (is a value embedded raw, or sent as base64?) is strict RFC 8259:
 * iterative, nesting limited to MAX_DEPTH, UTF-8 validated, no NaN/Infinity, lone surrogate
 * escapes rejected, whitespace around the value allowed, nothing after it.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "_recordwalk.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#define MAX_DEPTH 512


/* -- output buffer ------------------------------------------------------------------------ */

typedef struct {
    char *p;
    size_t len;
    size_t cap;
    int oom;
} out_t;

static int out_reserve(out_t *o, size_t extra) {
    if (o->oom) return -1;
    if (extra <= o->cap - o->len) return 0;
    size_t need = o->len + extra;
    if (need < o->len) { o->oom = 1; return -1; }
    size_t cap = o->cap ? o->cap : 4096;
    while (cap < need) {
        if (cap > SIZE_MAX / 2) { cap = need; break; }
        cap *= 2;
    }
    char *p = PyMem_RawRealloc(o->p, cap);
    if (p == NULL) { o->oom = 1; return -1; }
    o->p = p;
    o->cap = cap;
    return 0;
}

static inline int out_put(out_t *o, const void *src, size_t n) {
    if (out_reserve(o, n) < 0) return -1;
    memcpy(o->p + o->len, src, n);
    o->len += n;
    return 0;
}

/* A valid JSON value embedded as it is, but with its line breaks made spaces: in valid JSON a
 * raw CR or LF can only be whitespace between tokens (inside strings they must be escaped), so
 * this changes no value, and one record stays one line of NDJSON and one SSE data line. */
static int out_put_json(out_t *o, const char *src, size_t n) {
    if (out_reserve(o, n) < 0) return -1;
    char *dst = o->p + o->len;
    memcpy(dst, src, n);
    if (memchr(src, '\n', n) != NULL || memchr(src, '\r', n) != NULL) {
        for (size_t i = 0; i < n; i++)
            if (dst[i] == '\n' || dst[i] == '\r') dst[i] = ' ';
    }
    o->len += n;
    return 0;
}

#define PUT_LIT(o, s) out_put((o), (s), sizeof(s) - 1)

/* "00" .. "99": an integer is written two digits per division (half the dependent divides of
 * one digit at a time, which were a third of the walk's time on 1,000 records of 100 bytes). */
static const char DIGIT_PAIRS[] =
    "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
    "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
    "8081828384858687888990919293949596979899";

/* ``v`` in decimal, ending just before ``end``; returns where it starts (at most 20 chars). */
static char *fmt_int(char *end, int64_t v) {
    char *q = end;
    uint64_t u = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
    while (u >= 100) {
        unsigned pair = (unsigned)(u % 100);
        u /= 100;
        q -= 2;
        memcpy(q, DIGIT_PAIRS + 2 * pair, 2);
    }
    if (u >= 10) {
        q -= 2;
        memcpy(q, DIGIT_PAIRS + 2 * u, 2);
    } else {
        *--q = (char)('0' + u);
    }
    if (v < 0) *--q = '-';
    return q;
}

static int out_int(out_t *o, int64_t v) {
    char tmp[24];
    char *e = tmp + sizeof(tmp);
    char *q = fmt_int(e, v);
    return out_put(o, q, (size_t)(e - q));
}

/* An integer written once and copied while it repeats: the records of a batch mostly share
 * their timestamp (one produce request's records are stamped alike; LogAppendTime stamps the
 * whole batch). */
typedef struct {
    int64_t value;
    int valid;
    size_t len;
    char text[24];
} int_memo_t;

static int out_int_memo(out_t *o, int_memo_t *m, int64_t v) {
    if (!m->valid || m->value != v) {
        char *e = m->text + sizeof(m->text);
        char *q = fmt_int(e, v);
        m->len = (size_t)(e - q);
        memmove(m->text, q, m->len);
        m->value = v;
        m->valid = 1;
    }
    return out_put(o, m->text, m->len);
}

static const char HEX[] = "0123456789abcdef";

/* A JSON string of valid UTF-8 ``s``, escaped as orjson does: \" \\ \n \r \t \b \f, other
 * control characters as \u00XX, everything else (DEL, non-ASCII) as it is. */
static int out_string(out_t *o, const uint8_t *s, size_t n) {
    if (n > (SIZE_MAX - 2) / 6 || out_reserve(o, n * 6 + 2) < 0) return -1;
    char *w = o->p + o->len;
    *w++ = '"';
    for (size_t i = 0; i < n; i++) {
        uint8_t c = s[i];
        if (c >= 0x20 && c != '"' && c != '\\') {
            *w++ = (char)c;
            continue;
        }
        *w++ = '\\';
        switch (c) {
        case '"': *w++ = '"'; break;
        case '\\': *w++ = '\\'; break;
        case '\n': *w++ = 'n'; break;
        case '\r': *w++ = 'r'; break;
        case '\t': *w++ = 't'; break;
        case '\b': *w++ = 'b'; break;
        case '\f': *w++ = 'f'; break;
        default:
            *w++ = 'u';
            *w++ = '0';
            *w++ = '0';
            *w++ = HEX[c >> 4];
            *w++ = HEX[c & 15];
        }
    }
    *w++ = '"';
    o->len = (size_t)(w - o->p);
    return 0;
}

static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* A JSON string holding standard base64 (with padding) of ``s``: base64.b64encode. */
static int out_b64(out_t *o, const uint8_t *s, size_t n) {
    size_t groups = n / 3 + (n % 3 != 0);
    if (groups > (SIZE_MAX - 2) / 4 || out_reserve(o, groups * 4 + 2) < 0) return -1;
    char *w = o->p + o->len;
    *w++ = '"';
    size_t i = 0;
    for (; i + 3 <= n; i += 3) {
        uint32_t v = ((uint32_t)s[i] << 16) | ((uint32_t)s[i + 1] << 8) | s[i + 2];
        *w++ = B64[v >> 18];
        *w++ = B64[(v >> 12) & 63];
        *w++ = B64[(v >> 6) & 63];
        *w++ = B64[v & 63];
    }
    if (n - i == 1) {
        uint32_t v = (uint32_t)s[i] << 16;
        *w++ = B64[v >> 18];
        *w++ = B64[(v >> 12) & 63];
        *w++ = '=';
        *w++ = '=';
    } else if (n - i == 2) {
        uint32_t v = ((uint32_t)s[i] << 16) | ((uint32_t)s[i + 1] << 8);
        *w++ = B64[v >> 18];
        *w++ = B64[(v >> 12) & 63];
        *w++ = B64[(v >> 6) & 63];
        *w++ = '=';
    }
    *w++ = '"';
    o->len = (size_t)(w - o->p);
    return 0;
}

/* -- UTF-8 and JSON validation ------------------------------------------------------------ */

/* The first position at or after i whose byte is a quote, a backslash, a control character
 * or non-ASCII, or the start of the block of 16 (SSE2) or 8 bytes holding it: everything
 * before it is plain string text. */
static inline size_t plain_run(const uint8_t *s, size_t i, size_t n) {
#if defined(__SSE2__)
    const __m128i quote = _mm_set1_epi8('"'), backslash = _mm_set1_epi8('\\');
    const __m128i space = _mm_set1_epi8(0x20);
    while (i + 16 <= n) {
        __m128i v = _mm_loadu_si128((const __m128i *)(s + i));
        /* signed: below 0x20 is a control character or (negative) a non-ASCII byte */
        __m128i hit = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, backslash)),
                                   _mm_cmplt_epi8(v, space));
        if (_mm_movemask_epi8(hit) != 0) return i;
        i += 16;
    }
#endif
    const uint64_t ones = 0x0101010101010101ULL, highs = 0x8080808080808080ULL;
    while (i + 8 <= n) {
        uint64_t v;
        memcpy(&v, s + i, 8);
        uint64_t q = v ^ (ones * '"'), b = v ^ (ones * '\\');
        /* (x - ones) & ~x & highs: some byte of x is 0; with 0x20s: some byte is below 0x20 */
        if ((((q - ones) & ~q) | ((b - ones) & ~b) | ((v - ones * 0x20) & ~v) | v) & highs) break;
        i += 8;
    }
    return i;
}

static inline size_t skip_ws(const uint8_t *s, size_t i, size_t n) {
    while (i < n && (s[i] == ' ' || s[i] == '\n' || s[i] == '\r' || s[i] == '\t')) i++;
    return i;
}

static inline int hex4(const uint8_t *s, size_t i, size_t n, unsigned *out) {
    if (n - i < 4) return 0;
    unsigned v = 0;
    for (int k = 0; k < 4; k++) {
        uint8_t c = s[i + k];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (unsigned)(c - 'A' + 10);
        else return 0;
    }
    *out = v;
    return 1;
}

/* A string starting at s[i] == '"'; returns the position after it, or 0 if invalid. */
static size_t json_string(const uint8_t *s, size_t i, size_t n) {
    i++;
    for (;;) {
        i = plain_run(s, i, n);
        if (i >= n) return 0;
        uint8_t c = s[i];
        if (c == '"') return i + 1;
        if (c < 0x20) return 0;
        if (c == '\\') {
            if (i + 1 >= n) return 0;
            c = s[i + 1];
            if (c == 'u') {
                unsigned u;
                if (!hex4(s, i + 2, n, &u)) return 0;
                i += 6;
                if (u >= 0xDC00 && u <= 0xDFFF) return 0; /* a lone low surrogate */
                if (u >= 0xD800 && u <= 0xDBFF) {         /* needs a low one next */
                    unsigned lo;
                    if (n - i < 2 || s[i] != '\\' || s[i + 1] != 'u') return 0;
                    if (!hex4(s, i + 2, n, &lo) || lo < 0xDC00 || lo > 0xDFFF) return 0;
                    i += 6;
                }
                continue;
            }
            if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' ||
                c == 'r' || c == 't') {
                i += 2;
                continue;
            }
            return 0;
        }
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t k = rw_utf8_seq(s + i, n - i);
        if (k == 0) return 0;
        i += k;
    }
}

#define IS_DIGIT(c) ((c) >= '0' && (c) <= '9')

/* A number a double cannot hold is not a JSON value for us: JavaScript's JSON.parse turns
 * 1e999 into Infinity, orjson and many parsers reject it. A decimal overflows a double iff
 * its magnitude is at least 2^1024 - 2^970 (the midpoint between DBL_MAX and 2^1024: it rounds
 * up), whose 309 digits are OVERFLOW_DIGITS. Compared digit by digit; no floating point, no
 * locale, no GIL. Underflow (1e-999 -> 0) is a value. */
static const char OVERFLOW_DIGITS[] =
    "17976931348623158079372897140530341507993413271003782693617377898044496829276475"
    "09466490179775872070963302864166928879109465555478519404026306574886715058206819"
    "08902000708383676273854845817711531764475730270069855571366959622842914819860834"
    "936475292719074168444365510704342711559699508093042880177904174497792";

static int number_overflows(const uint8_t *s, size_t i, size_t n) {
    if (s[i] == '-') i++;
    size_t int_start = i;
    while (i < n && IS_DIGIT(s[i])) i++;
    size_t int_end = i, frac_start = i, frac_end = i;
    if (i < n && s[i] == '.') {
        frac_start = ++i;
        while (i < n && IS_DIGIT(s[i])) i++;
        frac_end = i;
    }
    int64_t exp = 0;
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        int neg = 0;
        if (s[i] == '+' || s[i] == '-') neg = s[i++] == '-';
        for (; i < n && IS_DIGIT(s[i]); i++)
            if (exp < 1000000000) exp = exp * 10 + (s[i] - '0'); /* saturates: far past 309 */
        if (neg) exp = -exp;
    }
    /* the significant digits, integer part then fraction, and the decimal exponent e10 with
     * |value| = 0.<digits> x 10^e10 */
    size_t k = int_start;
    int64_t e10 = (int64_t)(int_end - int_start);
    while (k < int_end && s[k] == '0') { k++; e10--; }
    if (k == int_end) { /* no non-zero integer digit: skip the fraction's leading zeros */
        k = frac_start;
        while (k < frac_end && s[k] == '0') { k++; e10--; }
        if (k == frac_end) return 0; /* zero */
    }
    e10 += exp;
    if (e10 != 309) return e10 > 309;
    /* same magnitude: compare the digits with OVERFLOW_DIGITS */
    size_t d = 0, p = k;
    int in_int = k < int_end;
    for (;;) {
        if (in_int && p == int_end) {
            in_int = 0;
            p = frac_start;
        }
        if (!in_int && p >= frac_end) break;
        char c = OVERFLOW_DIGITS[d];
        if (c == 0) return 1; /* the threshold's digits, then more: at least the threshold */
        if ((char)s[p] != c) return (char)s[p] > c;
        d++;
        p++;
    }
    return OVERFLOW_DIGITS[d] == 0; /* equal to the threshold: rounds up to infinity */
}

/* A number starting at s[i] ('-' or a digit); the position after it, or 0 if invalid. */
static size_t json_number(const uint8_t *s, size_t i, size_t n) {
    size_t start = i;
    if (s[i] == '-') i++;
    if (i >= n) return 0;
    if (s[i] == '0') {
        i++;
    } else if (s[i] >= '1' && s[i] <= '9') {
        while (i < n && IS_DIGIT(s[i])) i++;
    } else {
        return 0;
    }
    if (i < n && s[i] == '.') {
        i++;
        if (i >= n || !IS_DIGIT(s[i])) return 0;
        while (i < n && IS_DIGIT(s[i])) i++;
    }
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        if (i < n && (s[i] == '+' || s[i] == '-')) i++;
        if (i >= n || !IS_DIGIT(s[i])) return 0;
        while (i < n && IS_DIGIT(s[i])) i++;
    }
    return number_overflows(s, start, i) ? 0 : i;
}

/* An object key and its colon at s[i]; the position of the value after it, or 0. */
static size_t json_key(const uint8_t *s, size_t i, size_t n) {
    if (i >= n || s[i] != '"') return 0;
    i = json_string(s, i, n);
    if (i == 0) return 0;
    i = skip_ws(s, i, n);
    if (i >= n || s[i] != ':') return 0;
    return skip_ws(s, i + 1, n);
}

/* Is s[0:n] one JSON text (RFC 8259), nested at most MAX_DEPTH deep? No recursion. */
static int json_valid(const uint8_t *s, size_t n) {
    uint8_t stack[MAX_DEPTH]; /* '[' or '{' */
    size_t depth = 0;
    size_t i = skip_ws(s, 0, n);
    for (;;) {
        /* a value at s[i] */
        if (i >= n) return 0;
        uint8_t c = s[i];
        if (c == '{' || c == '[') {
            if (depth == MAX_DEPTH) return 0;
            stack[depth++] = c;
            i = skip_ws(s, i + 1, n);
            if (i < n && s[i] == (c == '{' ? '}' : ']')) {
                depth--;
                i++;
            } else {
                if (c == '{' && (i = json_key(s, i, n)) == 0) return 0;
                continue;
            }
        } else if (c == '"') {
            if ((i = json_string(s, i, n)) == 0) return 0;
        } else if (c == '-' || IS_DIGIT(c)) {
            if ((i = json_number(s, i, n)) == 0) return 0;
        } else if (c == 't') {
            if (n - i < 4 || memcmp(s + i, "true", 4) != 0) return 0;
            i += 4;
        } else if (c == 'f') {
            if (n - i < 5 || memcmp(s + i, "false", 5) != 0) return 0;
            i += 5;
        } else if (c == 'n') {
            if (n - i < 4 || memcmp(s + i, "null", 4) != 0) return 0;
            i += 4;
        } else {
            return 0;
        }
        /* after a value: close containers, or a comma and the next value */
        for (;;) {
            i = skip_ws(s, i, n);
            if (depth == 0) return i == n;
            if (i >= n) return 0;
            uint8_t top = stack[depth - 1];
            c = s[i];
            if (c == ',') {
                i = skip_ws(s, i + 1, n);
                if (top == '{' && (i = json_key(s, i, n)) == 0) return 0;
                break;
            }
            if (c != (top == '{' ? '}' : ']')) return 0;
            depth--;
            i++;
        }
    }
}

/* -- the record walk ------------------------------------------------------------------------ */

typedef struct {
    const uint8_t *data;
    size_t n;
    int record_count;
    int64_t base_offset;
    int64_t base_timestamp;
    int log_append_time;
    int64_t max_timestamp;
    int64_t start_offset;
    Py_ssize_t max_records;
    const uint8_t *extra;
    size_t extra_len;
    const uint8_t *sep;
    size_t sep_len;
    /* results */
    out_t out;
    Py_ssize_t count;
    int64_t last_offset;
    const char *error;
    int64_t fault_offset;
    int structural;
} walk_t;

#define FAIL(msg)          \
    do {                   \
        w->error = (msg);  \
        return -1;         \
    } while (0)
#define OUT(expr)                              \
    do {                                       \
        if ((expr) < 0) FAIL("out of memory"); \
    } while (0)

static int put_text_or_b64(out_t *o, const char *name, size_t name_len, const uint8_t *s,
                           int64_t len) {
    /* ',"<name>":' + text, or ',"<name>_b64":' + base64, or ',"<name>":null' */
    if (out_put(o, ",\"", 2) < 0 || out_put(o, name, name_len) < 0) return -1;
    if (len < 0) return PUT_LIT(o, "\":null");
    if (rw_utf8_valid(s, (size_t)len)) {
        if (PUT_LIT(o, "\":") < 0) return -1;
        return out_string(o, s, (size_t)len);
    }
    if (PUT_LIT(o, "_b64\":") < 0) return -1;
    return out_b64(o, s, (size_t)len);
}

/* The records of the section through rw_record() (_recordwalk.h: the rules every reader and
 * produce share). A record it rejects stops the walk: w->error says why, w->fault_offset which
 * record (-1 if its bytes do not say) and w->structural whether the rest is unreadable too. A
 * record before start_offset is walked but not served, so its timestamp is not checked. */
static int walk(walk_t *w) {
    const uint8_t *d = w->data;
    size_t n = w->n;
    size_t pos = 0;
    out_t *o = &w->out;
    rw_batch b = {w->base_offset, w->base_timestamp, w->max_timestamp, w->log_append_time};
    int_memo_t timestamp = {0, 0, 0, {0}};
    w->structural = 1;
    for (int i = 0; i < w->record_count; i++) {
        if (w->count >= w->max_records) return 0; /* enough: the rest is not read */
        rw_rec r;
        r.offset = -1;
        const char *why = rw_record(d, n, &pos, &b, &r);
        if (why != NULL) {
            w->fault_offset = r.offset;
            FAIL(why);
        }
        if (r.offset < w->start_offset) continue;
        if (!r.ts_ok) {
            w->fault_offset = r.offset;
            w->structural = 0;
            FAIL("timestamp out of range");
        }
        /* the object */
        if (w->count > 0) OUT(out_put(o, w->sep, w->sep_len));
        OUT(PUT_LIT(o, "{\"offset\":"));
        OUT(out_int(o, r.offset));
        OUT(PUT_LIT(o, ",\"timestamp\":"));
        OUT(out_int_memo(o, &timestamp, r.timestamp));
        OUT(put_text_or_b64(o, "key", 3, d + r.kpos, r.klen));
        if (r.vlen < 0) {
            OUT(PUT_LIT(o, ",\"value\":null"));
        } else if (r.vlen >= 2 && d[r.vpos] == '"' &&
                   json_string(d + r.vpos, 0, (size_t)r.vlen) == (size_t)r.vlen) {
            /* one JSON string and nothing else (the usual value): valid, and with no raw line
             * break to blank (a string cannot hold one), so copied as it is */
            OUT(PUT_LIT(o, ",\"value\":"));
            OUT(out_put(o, d + r.vpos, (size_t)r.vlen));
        } else if (json_valid(d + r.vpos, (size_t)r.vlen)) {
            OUT(PUT_LIT(o, ",\"value\":"));
            OUT(out_put_json(o, (const char *)d + r.vpos, (size_t)r.vlen));
        } else {
            OUT(PUT_LIT(o, ",\"value_b64\":"));
            OUT(out_b64(o, d + r.vpos, (size_t)r.vlen));
        }
        OUT(PUT_LIT(o, ",\"headers\":["));
        size_t hp = r.hpos;
        for (int64_t h = 0; h < r.hcount; h++) {
            const uint8_t *hk, *hv;
            int64_t hklen, hvlen;
            rw_header(d, r.end, &hp, &hk, &hklen, &hv, &hvlen);
            if (h > 0) OUT(PUT_LIT(o, ","));
            OUT(PUT_LIT(o, "{\"name\":"));
            OUT(out_string(o, hk, (size_t)hklen));
            OUT(put_text_or_b64(o, "value", 5, hv, hvlen));
            OUT(PUT_LIT(o, "}"));
        }
        OUT(PUT_LIT(o, "]"));
        OUT(out_put(o, w->extra, w->extra_len));
        OUT(PUT_LIT(o, "}"));
        w->count++;
        w->last_offset = r.offset;
    }
    w->fault_offset = -1;
    if (pos != n) FAIL("trailing bytes after the last record");
    return 0;
}

/* -- Python entry points -------------------------------------------------------------------- */

PyDoc_STRVAR(encode_section_doc,
"encode_section(section, record_count, base_offset, base_timestamp, log_append_time,\n"
"               max_timestamp, start_offset, max_records, extra, sep)\n"
"-> (bytes, count, last_offset, fault)\n\n"
"The JSON objects of the records of one decompressed records section at or after\n"
"start_offset, at most max_records, joined by sep; fault is None or (reason, offset,\n"
"structural) for the record that stopped the walk (those before it are in bytes).");

static PyObject *encode_section(PyObject *self, PyObject *args) {
    Py_buffer section, extra, sep;
    walk_t w;
    memset(&w, 0, sizeof(w));
    long long base_offset, base_ts, max_ts, start_offset;
    int append_time;
    if (!PyArg_ParseTuple(args, "y*iLLpLLny*y*", &section, &w.record_count, &base_offset,
                          &base_ts, &append_time, &max_ts, &start_offset, &w.max_records,
                          &extra, &sep))
        return NULL;
    w.data = section.buf;
    w.n = (size_t)section.len;
    w.base_offset = base_offset;
    w.base_timestamp = base_ts;
    w.log_append_time = append_time;
    w.max_timestamp = max_ts;
    w.start_offset = start_offset;
    w.extra = extra.buf;
    w.extra_len = (size_t)extra.len;
    w.sep = sep.buf;
    w.sep_len = (size_t)sep.len;
    w.last_offset = -1;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = walk(&w);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&section);
    PyBuffer_Release(&extra);
    PyBuffer_Release(&sep);
    PyObject *result = NULL;
    if (w.out.oom) {
        PyErr_NoMemory();
    } else {
        /* what was rendered before a fault is served; the fault is the caller's to report */
        PyObject *body = PyBytes_FromStringAndSize(w.out.p ? w.out.p : "", (Py_ssize_t)w.out.len);
        PyObject *fault = rc < 0 ? Py_BuildValue("(sLO)", w.error, (long long)w.fault_offset,
                                                 w.structural ? Py_True : Py_False)
                                 : Py_NewRef(Py_None);
        if (body != NULL && fault != NULL) {
            result = Py_BuildValue("(NnLN)", body, w.count, (long long)w.last_offset, fault);
        } else {
            Py_XDECREF(body);
            Py_XDECREF(fault);
        }
    }
    PyMem_RawFree(w.out.p);
    return result;
}

PyDoc_STRVAR(is_json_doc, "is_json(data) -> bool: is data one strict RFC 8259 JSON text?");

static PyObject *is_json(PyObject *self, PyObject *arg) {
    Py_buffer b;
    if (PyObject_GetBuffer(arg, &b, PyBUF_SIMPLE) < 0) return NULL;
    int ok;
    Py_BEGIN_ALLOW_THREADS
    ok = json_valid(b.buf, (size_t)b.len);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&b);
    return PyBool_FromLong(ok);
}

static PyMethodDef methods[] = {
    {"encode_section", encode_section, METH_VARARGS, encode_section_doc},
    {"is_json", is_json, METH_O, is_json_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_recordjson", "Records sections to JSON, in C.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__recordjson(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddIntConstant(m, "MAX_DEPTH", MAX_DEPTH) < 0 ||
        PyModule_AddIntConstant(m, "MAX_HEADERS_PER_RECORD", RW_MAX_HEADERS) < 0 ||
        PyModule_AddIntConstant(m, "MAX_HEADER_KEY_BYTES", RW_MAX_HEADER_KEY_BYTES) < 0 ||
        PyModule_AddObject(m, "MAX_TIMESTAMP_MS", PyLong_FromLongLong(RW_MAX_TIMESTAMP_MS)) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
