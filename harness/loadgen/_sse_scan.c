/* One-pass C version of harness.loadgen.fastscan's byte scan (issue 18).
 *
 * Why: the pure-Python scan makes ~10 C-level passes (bytes.count, rfind, re.findall) over
 * each network read's messages and was 25-30% of the load generator's CPU; this visits each
 * byte once. It decides exactly what fastscan.scan_openai_py decides: every count below is a
 * count that function takes, with the same semantics (bytes.count counts non-overlapping
 * occurrences left to right, hence the "chains" for the keys that can overlap themselves;
 * rfind is the last start; re.findall of the completion pattern is every position where it
 * matches, as its matches cannot overlap). The Python caller applies the returned effects.
 *
 * scan(seg: bytes, assigned: int) returns
 *   False  - not the fast shape: the caller JSON-decodes the segment (scan_openai's False);
 *   None   - a case this code leaves to the Python scanner (a count of more than 18 digits,
 *            an assigned total that is not a small non-negative int): the caller runs it;
 *   (full, toks, assigned, finished, final, prompt, done) - apply: `full` chunks; toks a
 *            list of their tokens or None for one each; assigned the new running total under
 *            continuous usage (rule 1) or None for rule 2 (text chunks, one token each);
 *            final/prompt the usage counts or None when the segment has no usage object.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stddef.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

/* bytes.count's non-overlapping count from a start position: an occurrence at i counts when
 * it starts at or after the end of the previous counted one. */
typedef struct {
    Py_ssize_t count;
    Py_ssize_t end;
} chain;

static inline void chain_hit(chain *c, Py_ssize_t i, Py_ssize_t len) {
    if (i >= c->end) {
        c->count++;
        c->end = i + len;
    }
}

/* The literal `lit` occurs at p with rem bytes left. */
#define AT(p, rem, lit) \
    ((rem) >= (Py_ssize_t)sizeof(lit) - 1 && memcmp((p), (lit), sizeof(lit) - 1) == 0)

#define MAX_DIGITS 18 /* fits int64 with room for sums; longer ones go to Python */

typedef struct {
    Py_ssize_t pos;
    Py_ssize_t len;
} span;

/* Length of the run of ASCII digits at s[j..L) (re's \d on bytes). */
static inline Py_ssize_t digit_run(const char *s, Py_ssize_t j, Py_ssize_t L) {
    Py_ssize_t k = j;
    while (k < L && s[k] >= '0' && s[k] <= '9')
        k++;
    return k - j;
}

static inline long long parse_digits(const char *p, Py_ssize_t len) {
    long long v = 0;
    for (Py_ssize_t k = 0; k < len; k++)
        v = v * 10 + (p[k] - '0');
    return v;
}

static const char DONE_MSG[] = "data: [DONE]\n\n";
#define DONE_LEN ((Py_ssize_t)sizeof(DONE_MSG) - 1)

static PyObject *applied(Py_ssize_t full, PyObject *toks, PyObject *assigned, int finished,
                         PyObject *final, PyObject *prompt, int done) {
    /* Steals toks, assigned, final, prompt (NULL means None). */
    PyObject *r = PyTuple_New(7);
    if (r == NULL) {
        Py_XDECREF(toks);
        Py_XDECREF(assigned);
        Py_XDECREF(final);
        Py_XDECREF(prompt);
        return NULL;
    }
    PyObject *nfull = PyLong_FromSsize_t(full);
    if (nfull == NULL) {
        Py_DECREF(r);
        Py_XDECREF(toks);
        Py_XDECREF(assigned);
        Py_XDECREF(final);
        Py_XDECREF(prompt);
        return NULL;
    }
#define OR_NONE(o) ((o) != NULL ? (o) : (Py_INCREF(Py_None), Py_None))
    PyTuple_SET_ITEM(r, 0, nfull);
    PyTuple_SET_ITEM(r, 1, OR_NONE(toks));
    PyTuple_SET_ITEM(r, 2, OR_NONE(assigned));
    PyTuple_SET_ITEM(r, 3, PyBool_FromLong(finished));
    PyTuple_SET_ITEM(r, 4, OR_NONE(final));
    PyTuple_SET_ITEM(r, 5, OR_NONE(prompt));
    PyTuple_SET_ITEM(r, 6, PyBool_FromLong(done));
#undef OR_NONE
    return r;
}

/* The counts of one segment (see scan_openai_py for what each one decides). */
typedef struct {
    Py_ssize_t nl, nbound, last_data;
    Py_ssize_t full, choices_empty_since, err_pos;
    Py_ssize_t nf, running;
    chain fr_all, fr_prev, fr_last; /* "finish_reason":" from 0, the last two message starts */
    chain usage_key, text, content;
    Py_ssize_t nu, usage_null, usage_obj_last, prompt_last, delta_obj;
    int has_delta, has_reasoning, text_empty, content_empty, long_count;
    span *cts; /* the completion_tokens counts, as re.findall's matches */
    Py_ssize_t ncts, cap;
    span cts_stack[256];
} counts;

/* Take the occurrences that start at s[i], a '"' or a '\n'; -1 on a memory error. */
static inline int visit(counts *k, const char *s, Py_ssize_t L, Py_ssize_t i) {
    const char *p = s + i;
    const Py_ssize_t rem = L - i;
    if (*p == '\n') {
        k->nl++;
        if (AT(p, rem, "\ndata: {")) {
            /* A message starts: the "finish_reason":" counts from the last two starts
             * (the last chunk is the last message or the one before it). */
            k->last_data = i;
            k->fr_prev = k->fr_last;
            k->fr_last.count = 0;
            k->fr_last.end = i + 1;
            k->choices_empty_since = 0;
        }
        if (i >= 1 && s[i - 1] == '}' && AT(p - 1, rem + 1, "}\n\ndata: {"))
            k->nbound++;
        return 0;
    }
    if (rem < 2)
        return 0;
    switch (p[1]) {
    case 'c':
        if (AT(p, rem, "\"choices\":[{")) {
            k->full++;
        } else if (AT(p, rem, "\"choices\":[]")) {
            k->choices_empty_since++;
        } else if (AT(p, rem, "\"completion_tokens\":")) {
            Py_ssize_t j = i + 20, d = digit_run(s, j, L);
            if (d > 0 && j + d < L && (s[j + d] == ',' || s[j + d] == '}')) {
                if (k->ncts == k->cap) {
                    span *grown = PyMem_Malloc(sizeof(span) * (size_t)k->cap * 2);
                    if (grown == NULL) {
                        PyErr_NoMemory();
                        return -1;
                    }
                    memcpy(grown, k->cts, sizeof(span) * (size_t)k->ncts);
                    if (k->cts != k->cts_stack)
                        PyMem_Free(k->cts);
                    k->cts = grown;
                    k->cap *= 2;
                }
                k->cts[k->ncts].pos = j;
                k->cts[k->ncts].len = d;
                k->ncts++;
                if (d > MAX_DIGITS)
                    k->long_count = 1;
            }
        } else if (AT(p, rem, "\"content\":\"")) {
            chain_hit(&k->content, i, 11);
            if (rem >= 12 && p[11] == '"')
                k->content_empty = 1;
        }
        break;
    case 'e':
        if (AT(p, rem, "\"error\""))
            k->err_pos = i;
        break;
    case 'f':
        if (AT(p, rem, "\"finish_reason\":")) {
            k->nf++;
            if (AT(p, rem, "\"finish_reason\":null")) {
                k->running++;
            } else if (rem >= 17 && p[16] == '"') {
                chain_hit(&k->fr_all, i, 17);
                chain_hit(&k->fr_prev, i, 17);
                chain_hit(&k->fr_last, i, 17);
            }
        }
        break;
    case 'u':
        if (AT(p, rem, "\"usage\"")) {
            chain_hit(&k->usage_key, i, 7);
            if (rem >= 9 && p[7] == ':' && p[8] == '{') {
                k->nu++;
                k->usage_obj_last = i;
            } else if (AT(p, rem, "\"usage\":null")) {
                k->usage_null++;
            }
        }
        break;
    case 'p':
        if (AT(p, rem, "\"prompt_tokens\":"))
            k->prompt_last = i;
        break;
    case 't':
        if (AT(p, rem, "\"text\":\"")) {
            chain_hit(&k->text, i, 8);
            if (rem >= 9 && p[8] == '"')
                k->text_empty = 1;
        }
        break;
    case 'd':
        if (AT(p, rem, "\"delta\"")) {
            k->has_delta = 1;
            if (rem >= 9 && p[7] == ':' && p[8] == '{')
                k->delta_obj++;
        }
        break;
    case 'r':
        if (AT(p, rem, "\"reasoning"))
            k->has_reasoning = 1;
        break;
    default:
        break;
    }
    return 0;
}

/* Visit every '\n' and every '"' followed by a letter that starts a key of visit(), in order
 * (the other quotes start none of its patterns): 16 bytes at a time where SSE2 is there
 * (x86-64 always), so the cost is per key rather than per byte or per quote. */
static int scan_bytes(counts *k, const char *s, Py_ssize_t L) {
    Py_ssize_t i = 0;
#if defined(__SSE2__)
    const __m128i quote = _mm_set1_epi8('"'), newline = _mm_set1_epi8('\n');
    const __m128i c = _mm_set1_epi8('c'), e = _mm_set1_epi8('e'), f = _mm_set1_epi8('f'),
                  u = _mm_set1_epi8('u'), p = _mm_set1_epi8('p'), t = _mm_set1_epi8('t'),
                  d = _mm_set1_epi8('d'), r = _mm_set1_epi8('r');
    for (; i + 17 <= L; i += 16) {
        const __m128i v = _mm_loadu_si128((const __m128i *)(s + i));
        const __m128i w = _mm_loadu_si128((const __m128i *)(s + i + 1)); /* the next bytes */
        const __m128i key = _mm_or_si128(
            _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(w, c), _mm_cmpeq_epi8(w, e)),
                         _mm_or_si128(_mm_cmpeq_epi8(w, f), _mm_cmpeq_epi8(w, u))),
            _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(w, p), _mm_cmpeq_epi8(w, t)),
                         _mm_or_si128(_mm_cmpeq_epi8(w, d), _mm_cmpeq_epi8(w, r))));
        unsigned m = (unsigned)_mm_movemask_epi8(_mm_or_si128(
            _mm_and_si128(_mm_cmpeq_epi8(v, quote), key), _mm_cmpeq_epi8(v, newline)));
        while (m) {
            if (visit(k, s, L, i + __builtin_ctz(m)) < 0)
                return -1;
            m &= m - 1;
        }
    }
#endif
    for (; i < L; i++)
        if ((s[i] == '"' || s[i] == '\n') && visit(k, s, L, i) < 0)
            return -1;
    return 0;
}

static PyObject *scan(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyBytes_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "scan(seg: bytes, assigned: int)");
        return NULL;
    }
    PyObject *seg_obj = args[0], *assigned_obj = args[1];
    const char *s = PyBytes_AS_STRING(seg_obj);
    Py_ssize_t L = PyBytes_GET_SIZE(seg_obj);

    int done = 0;
    if (L >= DONE_LEN && memcmp(s + L - DONE_LEN, DONE_MSG, DONE_LEN) == 0) {
        if (L == DONE_LEN)
            return applied(0, NULL, NULL, 0, NULL, NULL, 1);
        L -= DONE_LEN; /* the rest is scanned without the final [DONE] */
        done = 1;
    }
    if (L < 7 || memcmp(s, "data: {", 7) != 0 || L < 3 || memcmp(s + L - 3, "}\n\n", 3) != 0)
        Py_RETURN_FALSE;

    counts kk;
    counts *k = &kk;
    memset(k, 0, offsetof(counts, cts_stack));
    k->last_data = k->err_pos = k->usage_obj_last = k->prompt_last = -1;
    k->cts = k->cts_stack;
    k->cap = 256;
    PyObject *ret = NULL;
    if (scan_bytes(k, s, L) < 0)
        goto out;
    const span *cts = k->cts;

    /* From here on, the decisions of scan_openai_py, in its order. */
    const Py_ssize_t n = k->nbound + 1;
    if (k->nl != 2 * n)
        goto decline;
    const Py_ssize_t last = k->last_data + 1; /* rfind + 1: 0 without a second message */
    const Py_ssize_t empty = n - k->full;
    if (empty && (empty != 1 || k->choices_empty_since != 1 || k->err_pos >= last))
        goto decline;
    if (k->nf != k->full)
        goto decline;
    if (k->running != k->nf &&
        !((k->running == k->nf - 1 && (empty ? k->fr_prev.count : k->fr_last.count) == 1) ||
          k->fr_all.count == k->nf - k->running))
        goto decline;
    if (k->nu != n) {
        Py_ssize_t keys = k->usage_key.count;
        if (keys != k->nu && keys != k->nu + k->usage_null)
            goto decline;
    }
    long long prompt = -1;
    if (k->nu) {
        if (k->ncts != k->nu)
            goto decline;
        if (!(k->prompt_last > k->usage_obj_last))
            goto decline;
        Py_ssize_t j = k->prompt_last + 16, d = digit_run(s, j, L);
        if (!(d > 0 && j + d < L && (s[j + d] == ',' || s[j + d] == '}')))
            goto decline;
        if (d > MAX_DIGITS || k->long_count)
            goto python;
        prompt = parse_digits(s + j, d);
    }
    PyObject *toks = NULL, *assigned = NULL;
    if (k->nu == n && k->full) {
        /* Rule 1: the chunk's tokens are the rise of the cumulative count (running max). */
        int overflow = 0;
        if (!PyLong_CheckExact(assigned_obj))
            goto python;
        long long a = PyLong_AsLongLongAndOverflow(assigned_obj, &overflow);
        if (overflow || a < 0 || a > 100000000000000000LL)
            goto python;
        int ones = 1;
        for (Py_ssize_t c = 0; c < k->full; c++) {
            const char *q = s + cts[c].pos;
            if (cts[c].len > 1 && q[0] == '0')
                goto decline; /* not JSON: json.loads of the counts fails */
            if (ones && parse_digits(q, cts[c].len) != a + 1 + c)
                ones = 0;
        }
        if (ones) {
            assigned = PyLong_FromLongLong(a + k->full);
            if (assigned == NULL)
                goto out;
        } else {
            toks = PyList_New(k->full);
            if (toks == NULL)
                goto out;
            long long acc = a;
            for (Py_ssize_t c = 0; c < k->full; c++) {
                long long v = parse_digits(s + cts[c].pos, cts[c].len);
                long long tok = v > acc ? v - acc : 0;
                if (v > acc)
                    acc = v;
                PyObject *o = PyLong_FromLongLong(tok);
                if (o == NULL) {
                    Py_DECREF(toks);
                    goto out;
                }
                PyList_SET_ITEM(toks, c, o);
            }
            assigned = PyLong_FromLongLong(acc);
            if (assigned == NULL) {
                Py_DECREF(toks);
                goto out;
            }
        }
    } else if (k->nu == n || (k->nu == empty && (!k->nu || k->usage_obj_last > last))) {
        /* Rule 2: one token per chunk, scanned only when every chunk has non-empty text. */
        if (k->full) {
            int all_text;
            if (!k->has_delta)
                all_text = k->text.count == k->full && !k->text_empty;
            else
                all_text = k->delta_obj == k->full && !k->has_reasoning &&
                           k->content.count == k->full && !k->content_empty;
            if (!all_text)
                goto decline;
        }
    } else {
        goto decline;
    }
    PyObject *final = NULL, *prompt_o = NULL;
    if (k->nu) {
        const span *f = &cts[k->ncts - 1];
        final = PyLong_FromLongLong(parse_digits(s + f->pos, f->len));
        prompt_o = PyLong_FromLongLong(prompt);
        if (final == NULL || prompt_o == NULL) {
            Py_XDECREF(final);
            Py_XDECREF(prompt_o);
            Py_XDECREF(toks);
            Py_XDECREF(assigned);
            goto out;
        }
    }
    ret = applied(k->full, toks, assigned, k->running != k->nf, final, prompt_o, done);
    goto out;

decline:
    ret = Py_False;
    Py_INCREF(ret);
    goto out;
python:
    ret = Py_None;
    Py_INCREF(ret);
out:
    if (k->cts != k->cts_stack)
        PyMem_Free(k->cts);
    return ret;
}

static PyMethodDef methods[] = {
    {"scan", (PyCFunction)(void (*)(void))scan, METH_FASTCALL,
     "scan(seg, assigned) -> False | None | (full, toks, assigned, finished, final, prompt, "
     "done): the one-pass byte scan of harness.loadgen.fastscan (see its docstring)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    .m_base = PyModuleDef_HEAD_INIT,
    .m_name = "_sse_scan",
    .m_doc = "One-pass SSE byte scan for harness.loadgen.fastscan.",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__sse_scan(void) { return PyModule_Create(&module); }
