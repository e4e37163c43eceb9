/* Order statistics of a float64 array by radix selection, without sorting it or writing to
 * it (issue 13).
 *
 * Why: the summary's ITL percentiles are numpy's np.percentile over 15-21M samples (the
 * pooled run and its largest tier). numpy partitions the samples in place at ~12 ranks
 * (introselect): ~0.23 s an array on this machine, most of the summary. The same order
 * statistics come from two counting passes and one filtered copy: each sample's float bits
 * as an unsigned key that sorts as the float does, a histogram of its top 16 bits, a second
 * one of the next 16 bits for the buckets that hold a wanted rank, then only the samples of
 * those narrow buckets copied out and split further (16 bits a level) until each rank is one
 * key. First tried in one counting pass and the copy: a histogram of the top 20 bits (ITL
 * samples fill a few thousand buckets of ~10k samples each, ~1/3 less time at 15M samples),
 * when the wanted buckets fit the copy's bound. The caller's array is only read.
 *
 *   select_ranks(values, ranks, cap)   values: float64; ranks: int64, ascending, distinct,
 *                                      each in [0, len(values)), at most 64 of them; cap: the
 *                                      most samples the copy may hold. Returns a tuple of the
 *                                      values at those ranks of the sorted array (as floats),
 *                                      or None when the values hold a NaN (numpy's percentile
 *                                      defines that case) or a negative zero (which zero numpy
 *                                      reports there depends on its partition's arrangement),
 *                                      or the wanted buckets hold more than cap samples (many
 *                                      equal values: numpy's partition does that in place,
 *                                      without the copy).
 *
 * harness.results.metrics.percentiles uses it where the install built it; numpy's
 * np.percentile defines the answer, and tests/results/test_orderstats.py compares them bit for
 * bit. The GIL is released over the passes, which only read the caller's array; a count that
 * disagrees with an earlier one (another thread wrote the values meanwhile) declines, and
 * every write is bounded by the function's own counts.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define NB 65536 /* buckets a level (16 bits) */
#define MAX_RANKS 64 /* segments fit an int8_t (select_wide) */
#define WIDE_BITS 20
#define WIDE_SHIFT (64 - WIDE_BITS)
#define WIDE_NB (1 << WIDE_BITS) /* select_wide's buckets */
#define SIGN 0x8000000000000000ULL
#define NEG_ZERO 0x7fffffffffffffffULL /* key_of(-0.0) */

/* The key of x: unsigned, in the order of the floats (negatives reversed below the
 * positives). */
static inline uint64_t key_of(double x) {
    uint64_t u;
    memcpy(&u, &x, 8);
    return (u & SIGN) ? ~u : (u | SIGN);
}

static inline double value_of(uint64_t k) {
    uint64_t u = (k & SIGN) ? (k & ~SIGN) : ~k;
    double x;
    memcpy(&x, &u, 8);
    return x;
}

/* A C-contiguous buffer of 8-byte items, float64 ('d') or int64 ('q'). */
static int get_buf(PyObject *o, Py_buffer *b, const char *what, char want) {
    if (PyObject_GetBuffer(o, b, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return -1;
    const char *f = b->format ? b->format : "B";
    if (*f == '@' || *f == '=' || *f == '<')
        f++;
    int ok = b->itemsize == 8 && f[0] != 0 && f[1] == 0 &&
             (want == 'd' ? f[0] == 'd' : (f[0] == 'l' || f[0] == 'q'));
    if (!ok) {
        PyErr_Format(PyExc_TypeError, "%s: expected %s items", what,
                     want == 'd' ? "float64" : "int64");
        PyBuffer_Release(b);
        return -1;
    }
    return 0;
}

/* Where each of the ascending ranks r[0..nr) falls in the histogram h: its bucket (b) and
 * its rank within the bucket (r rewritten). */
static void locate(const size_t *h, size_t *r, int nr, int *b) {
    size_t below = 0;
    int d = 0;
    for (int i = 0; i < nr; i++) {
        while (below + h[d] <= r[i])
            below += h[d++];
        b[i] = d;
        r[i] -= below;
    }
}

/* The ranks' segments of a copy: ranks in the same bucket (equal id[i], ids ascending)
 * share one, of size[i] keys; segment s spans at[s]..at[s + 1], fill[s] its next free slot,
 * seg[i] rank i's segment. Returns how many. */
static int segments(const int64_t *id, const size_t *size, int nr, size_t *at, size_t *fill,
                    int *seg) {
    int ns = 0;
    at[0] = 0;
    for (int i = 0; i < nr; i++) {
        if (i == 0 || id[i] != id[i - 1]) {
            at[ns + 1] = at[ns] + size[i];
            fill[ns] = at[ns];
            ns++;
        }
        seg[i] = ns - 1;
    }
    return ns;
}

static int resolve(uint64_t *keys, size_t m, int shift, size_t *r, int nr, uint64_t *out);

/* The digit after the one at `shift`: 16 bits lower, the last one at 0 (its top bits, already
 * decided, are equal within a bucket), then none (-16). */
static inline int next_shift(int shift) { return shift > 0 && shift < 16 ? 0 : shift - 16; }

/* resolve() each segment of the copy `buf` for its ranks. Returns -1 on no memory. */
static int resolve_segments(uint64_t *buf, const size_t *at, const int *seg, int ns, int shift,
                            size_t *r, int nr, uint64_t *out) {
    for (int s = 0, i = 0; s < ns; s++) {
        int j = i;
        while (j < nr && seg[j] == s)
            j++;
        if (resolve(buf + at[s], at[s + 1] - at[s], shift, r + i, j - i, out + i) < 0)
            return -1;
        i = j;
    }
    return 0;
}

/* The keys at ranks r[0..nr) (ascending, each < m) of keys[0..m), whose bits above `shift`
 * + 16 are all equal, into out[0..nr). keys may be reordered. Returns -1 on no memory. */
static int resolve(uint64_t *keys, size_t m, int shift, size_t *r, int nr, uint64_t *out) {
    if (m <= 32) { /* insertion sort */
        for (size_t i = 1; i < m; i++) {
            uint64_t k = keys[i];
            size_t j = i;
            for (; j > 0 && keys[j - 1] > k; j--)
                keys[j] = keys[j - 1];
            keys[j] = k;
        }
        for (int i = 0; i < nr; i++)
            out[i] = keys[r[i]];
        return 0;
    }
    if (shift < 0) { /* every bit decided: the keys are equal */
        for (int i = 0; i < nr; i++)
            out[i] = keys[0];
        return 0;
    }
    size_t *h = calloc(NB, sizeof(size_t));
    if (h == NULL)
        return -1;
    for (size_t i = 0; i < m; i++)
        h[(keys[i] >> shift) & 0xffff]++;
    int b[MAX_RANKS] = {0};
    locate(h, r, nr, b);
    if (h[b[0]] == m) { /* one bucket holds them all: the next digit, in place */
        free(h);
        return resolve(keys, m, next_shift(shift), r, nr, out);
    }
    /* the wanted buckets' keys, bucket after bucket, in one pass */
    size_t at[MAX_RANKS + 1], fill[MAX_RANKS], size[MAX_RANKS];
    int64_t id[MAX_RANKS];
    int seg[MAX_RANKS];
    for (int i = 0; i < nr; i++) {
        id[i] = b[i];
        size[i] = h[b[i]];
    }
    int ns = segments(id, size, nr, at, fill, seg);
    uint64_t *sub = malloc(at[ns] * sizeof(uint64_t));
    if (sub == NULL) {
        free(h);
        return -1;
    }
    int16_t *seg_of = (int16_t *)h; /* bucket -> its segment, or -1 (over the histogram) */
    memset(seg_of, 0xff, NB * sizeof(int16_t));
    for (int i = 0; i < nr; i++)
        seg_of[b[i]] = (int16_t)seg[i];
    for (size_t i = 0; i < m; i++) {
        int s = seg_of[(keys[i] >> shift) & 0xffff];
        if (s >= 0)
            sub[fill[s]++] = keys[i];
    }
    free(h);
    int rc = resolve_segments(sub, at, seg, ns, next_shift(shift), r, nr, out);
    free(sub);
    return rc;
}

/* The selection in two passes where it can: a histogram of the keys' top WIDE_BITS bits
 * (one level instead of two 16-bit ones: a latency's samples spread over a few thousand of
 * them, so the wanted buckets are small), then the wanted buckets' keys copied and resolved.
 * Returns 1 done, 0 declined (NaN or negative zero), 2 more than cap samples to copy (r is
 * then rewritten: the caller restores it), -1 no memory. */
static int select_wide(const double *v, size_t n, size_t *r, int nr, size_t cap,
                       uint64_t *out) {
    uint32_t *h = calloc(WIDE_NB, sizeof(uint32_t)); /* n < 2^32: the caller's check */
    if (h == NULL)
        return -1;
    for (size_t i = 0; i < n; i++) {
        uint64_t k = key_of(v[i]);
        if (v[i] != v[i] || k == NEG_ZERO) {
            free(h);
            return 0;
        }
        h[k >> WIDE_SHIFT]++;
    }
    size_t below = 0, at[MAX_RANKS + 1], fill[MAX_RANKS], size[MAX_RANKS];
    int64_t id[MAX_RANKS];
    int seg[MAX_RANKS];
    size_t d = 0;
    for (int i = 0; i < nr; i++) { /* locate(), over 32-bit counts */
        while (below + h[d] <= r[i])
            below += h[d++];
        id[i] = (int64_t)d;
        size[i] = h[d];
        r[i] -= below;
    }
    int ns = segments(id, size, nr, at, fill, seg);
    if (at[ns] > cap) {
        free(h);
        return 2;
    }
    uint64_t *buf = malloc((at[ns] ? at[ns] : 1) * sizeof(uint64_t));
    if (buf == NULL) {
        free(h);
        return -1;
    }
    int8_t *seg_of = (int8_t *)h; /* bucket -> its segment, or -1 (over the histogram) */
    memset(seg_of, 0xff, WIDE_NB);
    for (int i = 0; i < nr; i++)
        seg_of[id[i]] = (int8_t)seg[i];
    for (size_t i = 0; i < n; i++) {
        uint64_t k = key_of(v[i]);
        int s = seg_of[k >> WIDE_SHIFT];
        if (s >= 0 && fill[s] < at[s + 1]) /* the counts bound every write */
            buf[fill[s]++] = k;
    }
    free(h);
    int rc = 1;
    for (int s = 0; s < ns; s++)
        if (fill[s] != at[s + 1]) /* the values changed under us: numpy decides */
            rc = 0;
    if (rc == 1 && resolve_segments(buf, at, seg, ns, next_shift(WIDE_SHIFT), r, nr, out) < 0)
        rc = -1;
    free(buf);
    return rc;
}

/* The selection itself, on the caller's values (only read). Returns 1 done, 0 declined
 * (NaN, or more than cap samples to copy), -1 no memory. */
static int select_keys(const double *v, size_t n, size_t *r, int nr, size_t cap,
                       uint64_t *out) {
    if (n < UINT32_MAX) {
        size_t r0[MAX_RANKS];
        memcpy(r0, r, (size_t)nr * sizeof(size_t));
        int w = select_wide(v, n, r, nr, cap, out);
        if (w != 2)
            return w;
        memcpy(r, r0, (size_t)nr * sizeof(size_t)); /* too many to copy: two levels */
    }
    int rc = -1;
    size_t *h1 = calloc(NB, sizeof(size_t));
    size_t *h2 = NULL;
    uint64_t *buf = NULL;
    int16_t *slot = NULL; /* top bucket -> its index among the wanted ones, or -1 */
    if (h1 == NULL)
        return -1;
    for (size_t i = 0; i < n; i++) {
        uint64_t k = key_of(v[i]);
        if (v[i] != v[i] || k == NEG_ZERO) {
            rc = 0;
            goto done;
        }
        h1[k >> 48]++;
    }
    int b1[MAX_RANKS], u1[MAX_RANKS], nu = 0;
    locate(h1, r, nr, b1);
    for (int i = 0; i < nr; i++)
        if (i == 0 || b1[i] != b1[i - 1])
            u1[nu++] = b1[i];
    slot = malloc(NB * sizeof(int16_t));
    h2 = calloc((size_t)nu * NB, sizeof(size_t));
    if (slot == NULL || h2 == NULL)
        goto done;
    memset(slot, 0xff, NB * sizeof(int16_t));
    for (int j = 0; j < nu; j++)
        slot[u1[j]] = (int16_t)j;
    /* the second level, within the wanted top buckets */
    for (size_t i = 0; i < n; i++) {
        uint64_t k = key_of(v[i]);
        int j = slot[k >> 48];
        if (j >= 0)
            h2[(size_t)j * NB + ((k >> 32) & 0xffff)]++;
    }
    /* each wanted top bucket's second histogram counts what the first did (else the values
     * changed under us: numpy decides), so every rank below falls inside its row */
    for (int j = 0; j < nu; j++) {
        size_t sum = 0;
        for (size_t d = 0; d < NB; d++)
            sum += h2[(size_t)j * NB + d];
        if (sum != h1[u1[j]]) {
            rc = 0;
            goto done;
        }
    }
    /* each rank's 32-bit bucket: its row in h2 (top bucket index j) and second digit, one id */
    int b2[MAX_RANKS], seg[MAX_RANKS];
    size_t at[MAX_RANKS + 1], fill[MAX_RANKS], size[MAX_RANKS];
    int64_t id[MAX_RANKS];
    for (int i = 0, j = 0; i < nr; i++) {
        while (u1[j] != b1[i])
            j++;
        locate(h2 + (size_t)j * NB, &r[i], 1, &b2[i]);
        id[i] = (int64_t)j * NB + b2[i];
        size[i] = h2[id[i]];
    }
    int ns = segments(id, size, nr, at, fill, seg);
    if (at[ns] > cap) {
        rc = 0;
        goto done;
    }
    buf = malloc((at[ns] ? at[ns] : 1) * sizeof(uint64_t));
    /* (top bucket index, second digit) -> its segment, or -1 (over the second histograms) */
    int16_t *seg_of = (int16_t *)h2;
    if (buf == NULL)
        goto done;
    memset(seg_of, 0xff, (size_t)nu * NB * sizeof(int16_t));
    for (int i = 0; i < nr; i++)
        seg_of[id[i]] = (int16_t)seg[i];
    /* copy the wanted 32-bit buckets' keys, segment by segment */
    for (size_t i = 0; i < n; i++) {
        uint64_t k = key_of(v[i]);
        int j = slot[k >> 48];
        if (j < 0)
            continue;
        int s = seg_of[(size_t)j * NB + ((k >> 32) & 0xffff)];
        if (s >= 0 && fill[s] < at[s + 1]) /* the counts bound every write */
            buf[fill[s]++] = k;
    }
    for (int s = 0; s < ns; s++)
        if (fill[s] != at[s + 1]) { /* the values changed under us: numpy decides */
            rc = 0;
            goto done;
        }
    rc = resolve_segments(buf, at, seg, ns, 16, r, nr, out) < 0 ? -1 : 1;
done:
    free(h1);
    free(h2);
    free(slot);
    free(buf);
    return rc;
}

static PyObject *select_ranks(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "select_ranks() takes 3 arguments");
        return NULL;
    }
    Py_ssize_t cap = PyLong_AsSsize_t(args[2]);
    if (cap == -1 && PyErr_Occurred())
        return NULL;
    Py_buffer bv, br;
    PyObject *ret = NULL;
    if (get_buf(args[0], &bv, "values", 'd') < 0)
        return NULL;
    if (get_buf(args[1], &br, "ranks", 'q') < 0)
        goto r1;
    const Py_ssize_t n = bv.len / 8, nr = br.len / 8;
    const int64_t *rk = br.buf;
    if (nr < 1 || nr > MAX_RANKS) {
        PyErr_Format(PyExc_ValueError, "select_ranks(): 1 to %d ranks, not %zd", MAX_RANKS, nr);
        goto r2;
    }
    size_t r[MAX_RANKS];
    for (Py_ssize_t i = 0; i < nr; i++) {
        if (rk[i] < 0 || rk[i] >= n || (i && rk[i] <= rk[i - 1])) {
            PyErr_Format(PyExc_ValueError,
                         "select_ranks(): ranks must ascend, distinct, in [0, %zd)", n);
            goto r2;
        }
        r[i] = (size_t)rk[i];
    }
    uint64_t out[MAX_RANKS];
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = select_keys(bv.buf, (size_t)n, r, (int)nr, cap < 0 ? 0 : (size_t)cap, out);
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        PyErr_NoMemory();
        goto r2;
    }
    if (rc == 0) {
        ret = Py_None;
        Py_INCREF(ret);
        goto r2;
    }
    ret = PyTuple_New(nr);
    if (ret == NULL)
        goto r2;
    for (Py_ssize_t i = 0; i < nr; i++) {
        PyObject *f = PyFloat_FromDouble(value_of(out[i]));
        if (f == NULL) {
            Py_CLEAR(ret);
            goto r2;
        }
        PyTuple_SET_ITEM(ret, i, f);
    }
r2:
    PyBuffer_Release(&br);
r1:
    PyBuffer_Release(&bv);
    return ret;
}

static PyMethodDef methods[] = {
    {"select_ranks", (PyCFunction)(void (*)(void))select_ranks, METH_FASTCALL,
     "select_ranks(values, ranks, cap) -> tuple | None: the values at those ranks of the "
     "sorted array; None on a NaN, a negative zero or more than cap samples to copy."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    .m_base = PyModuleDef_HEAD_INIT,
    .m_name = "_orderstats",
    .m_doc = "Order statistics by radix selection (harness.results.metrics.percentiles).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__orderstats(void) { return PyModule_Create(&module); }
