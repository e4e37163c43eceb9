/* Per-decode passes of the column policies' plans, in C (issue 13).
 *
 * Why: WAIT, Nested WAIT, SLAI, MC-SF and RAD plan every step from the running set's columns
 * (harness/policies/columns.py). Near capacity (100-250 decoding) each such pass was 2-12
 * numpy calls of 1-5 us each, about half of WAIT's, Nested WAIT's and SLAI's time per plan;
 * here each is one loop over the positions:
 *
 *   deadlines       SLAI's Eq. 8 last schedulable times with their per-key cache, and how
 *                   many are critical (seed-rad-slai.md §5.2, §7 #3);
 *   type_stages     whether every (type, stage) group of decodes is within its type's
 *                   quota n_j (WAIT, seed-wait.md §3.3);
 *   stage_groups    whether every stage group is within its segment's n_i, and whether the
 *                   groups still fit the quotas of the segments they reach before the next
 *                   finish (Nested WAIT, seed-wait.md §4.3);
 *   stage_groups_hold  whether they keep within them until each group empties, all
 *                   decoding together (Nested WAIT's then_steady promise);
 *   segment_blocks  the KV blocks every running request holds at the end of its current
 *                   segment (Nested WAIT's memory guard, seed-wait.md §9 #12);
 *   keyed_reached   how many running requests reached a per-key bound (MC-SF: output
 *                   estimates reached, seed-mcsf.md REC a);
 *   keyed_sum       the sum of a per-key value over the running requests (MC-SF: KV peaks);
 *   ranked_order    SLAI's run order: the decodes ranked by (last schedulable time,
 *                   arrival), the critical ones first, then the partial prefills, then the
 *                   non-critical ones that fit, with each item's tokens (seed-rad-slai.md
 *                   §5.5, §7 #6);
 *   ascending       whether a 1-D column never decreases (RAD's decode batch, Algorithm 1
 *                   lines 6-8: already in rad.py's oldest-first order when the running set's
 *                   arrivals ascend);
 *   oldest_decoding the decoding requests oldest first, when they do not (a mask, two
 *                   gathers and a stable sort in numpy).
 *
 * Each has a numpy version in harness/policies/planops.py that defines the answer; that
 * module uses these where the install built them, unless HARNESS_PURE_PLANS=1, and
 * tests/policies/test_planops.py compares the two. Arrays come through the buffer protocol
 * (int64 or float64, C-contiguous), or, for a plain ndarray of that kind where the build had
 * numpy's headers, straight from the array (HARNESS_NUMPY_API: numpy's buffer export costs
 * more than most passes); every index is checked before it is read or written through, and a
 * function that raises has written nothing.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef HARNESS_NUMPY_API
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>
#endif

/* `nargs` is `n`, else a TypeError naming `fn`. */
static int want_args(Py_ssize_t nargs, Py_ssize_t n, const char *fn) {
    if (nargs == n)
        return 0;
    PyErr_Format(PyExc_TypeError, "%s() takes %zd arguments", fn, n);
    return -1;
}

#ifdef HARNESS_NUMPY_API
/* get_buf's answer for a plain ndarray of the kind asked, read straight from the array: 1 when
 * `o` is one (b filled, b->obj NULL: nothing to release; the caller's argument keeps the array
 * alive for the call), 0 when it is not (the buffer protocol decides). Why: numpy's buffer
 * export formats the dtype's format string on every call (~600 instructions), and a plan
 * passes 4-6 arrays to each pass (issue 13). */
static int array_buf(PyObject *o, Py_buffer *b, char kind, int flags) {
    if (!PyArray_CheckExact(o))
        return 0;
    PyArrayObject *a = (PyArrayObject *)o;
    int t = PyArray_TYPE(a);
    int typed = PyArray_ITEMSIZE(a) == 8 &&
                (kind == 'i' ? (t == NPY_LONG || t == NPY_LONGLONG) : t == NPY_DOUBLE);
    if (!typed || !PyArray_ISNOTSWAPPED(a) || !PyArray_IS_C_CONTIGUOUS(a) || !PyArray_ISALIGNED(a))
        return 0;
    if ((flags & PyBUF_WRITABLE) && !PyArray_ISWRITEABLE(a))
        return 0; /* the buffer protocol's error */
    memset(b, 0, sizeof(*b));
    b->buf = PyArray_DATA(a);
    b->len = PyArray_NBYTES(a);
    b->itemsize = 8;
    b->readonly = !PyArray_ISWRITEABLE(a);
    b->ndim = PyArray_NDIM(a);
    b->shape = PyArray_DIMS(a);
    return 1;
}
#endif

/* A C-contiguous buffer of int64 ('i') or float64 ('f') items, writable if `flags` says so. */
static int get_buf(PyObject *o, Py_buffer *b, char kind, const char *what, int flags) {
#ifdef HARNESS_NUMPY_API
    if (array_buf(o, b, kind, flags))
        return 0;
#endif
    if (PyObject_GetBuffer(o, b, flags | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return -1;
    const char *f = b->format ? b->format : "B";
    if (*f == '@' || *f == '=' || *f == '<')
        f++;
    int ok = b->itemsize == 8 && f[0] != 0 && f[1] == 0 &&
             (kind == 'i' ? (f[0] == 'l' || f[0] == 'q') : f[0] == 'd');
    if (!ok) {
        PyErr_Format(PyExc_TypeError, "%s: expected %s items", what,
                     kind == 'i' ? "int64" : "float64");
        PyBuffer_Release(b);
        return -1;
    }
    return 0;
}

/* Up to 8 buffers acquired together and released together. */
typedef struct {
    Py_buffer b[8];
    int n;
} bufs;

static void release_all(bufs *s) {
    while (s->n)
        PyBuffer_Release(&s->b[--s->n]);
}

/* The next buffer of `s` (released with the others by release_all); NULL on error. */
static Py_buffer *take(bufs *s, PyObject *o, char kind, const char *what, int flags) {
    if (get_buf(o, &s->b[s->n], kind, what, flags) < 0)
        return NULL;
    return &s->b[s->n++];
}

/* The positions to visit: `pos` (int64, each in [0, n)) or, for None, 0..n-1. */
typedef struct {
    const int64_t *p; /* NULL: every position */
    Py_ssize_t len;
} positions;

static int get_positions(bufs *s, PyObject *o, Py_ssize_t n, positions *ps, const char *fn) {
    if (o == Py_None) {
        ps->p = NULL;
        ps->len = n;
        return 0;
    }
    Py_buffer *b = take(s, o, 'i', "positions", 0);
    if (b == NULL)
        return -1;
    ps->p = (const int64_t *)b->buf;
    ps->len = b->len / 8;
    for (Py_ssize_t i = 0; i < ps->len; i++) {
        if (ps->p[i] < 0 || ps->p[i] >= n) {
            PyErr_Format(PyExc_IndexError, "%s(): position out of range", fn);
            return -1;
        }
    }
    return 0;
}

#define AT(ps, i) ((ps)->p ? (ps)->p[i] : (int64_t)(i))

/* Counts per non-negative int64 key: open addressing, linear probing, at least twice as
 * many slots as keys (on the stack up to STACK_SLOTS). */
#define STACK_SLOTS 1024
typedef struct {
    int64_t *key, *cnt;
    uint64_t mask;
    int64_t stack[2 * STACK_SLOTS];
    int64_t *heap;
} tally;

static int tally_init(tally *t, Py_ssize_t n) {
    uint64_t size = 16;
    while (size < (uint64_t)n * 2)
        size <<= 1;
    t->heap = NULL;
    int64_t *mem = t->stack;
    if (size > STACK_SLOTS) {
        mem = t->heap = (int64_t *)malloc(2 * size * sizeof(int64_t));
        if (mem == NULL) {
            PyErr_NoMemory();
            return -1;
        }
    }
    t->key = mem;
    t->cnt = mem + size;
    t->mask = size - 1;
    for (uint64_t i = 0; i < size; i++)
        t->key[i] = -1;
    return 0;
}

/* Add one to the count of `k`; its slot (t->cnt[slot] its count from then on). */
static uint64_t tally_slot(tally *t, int64_t k) {
    uint64_t h = ((uint64_t)k * 0x9E3779B97F4A7C15ull) >> 17;
    for (;; h++) {
        uint64_t i = h & t->mask;
        if (t->key[i] == k) {
            ++t->cnt[i];
            return i;
        }
        if (t->key[i] < 0) {
            t->key[i] = k;
            t->cnt[i] = 1;
            return i;
        }
    }
}

/* The count of `k` after adding one. */
static int64_t tally_add(tally *t, int64_t k) { return t->cnt[tally_slot(t, k)]; }

static void tally_free(tally *t) { free(t->heap); }

/* deadlines(key, last, tbt, positions, cache_e, cache_v, default_tbt, shift, now, out)
 * -> critical: SLAI's Eq. 8 for the running requests at `positions` (None: all), into out[i]
 * for the i-th. Per key k the cache holds the token time its value was computed for
 * (cache_e, NaN: never) and the value (cache_v): a request whose last token time is the
 * cached one keeps its value (#3); when none is new every value comes from the cache and
 * nothing is written, else each new one is (last + tbt) - shift, tbt NaN taken as
 * default_tbt, and every request's (time, value) is stored. Returns how many values are
 * <= now. */
static PyObject *deadlines(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (want_args(nargs, 10, "deadlines") < 0)
        return NULL;
    double dflt = PyFloat_AsDouble(args[6]);
    double shift = PyFloat_AsDouble(args[7]);
    double now = PyFloat_AsDouble(args[8]);
    if (PyErr_Occurred())
        return NULL;
    bufs s = {.n = 0};
    PyObject *ret = NULL;
    Py_buffer *bk = take(&s, args[0], 'i', "key", 0);
    Py_buffer *bl = bk ? take(&s, args[1], 'f', "last", 0) : NULL;
    Py_buffer *bt = bl ? take(&s, args[2], 'f', "tbt", 0) : NULL;
    Py_buffer *be = bt ? take(&s, args[4], 'f', "cache_e", PyBUF_WRITABLE) : NULL;
    Py_buffer *bv = be ? take(&s, args[5], 'f', "cache_v", PyBUF_WRITABLE) : NULL;
    Py_buffer *bo = bv ? take(&s, args[9], 'f', "out", PyBUF_WRITABLE) : NULL;
    if (bo == NULL)
        goto out;
    Py_ssize_t R = bk->len / 8, K = be->len / 8;
    if (bl->len != bk->len || bt->len != bk->len || bv->len != be->len) {
        PyErr_SetString(PyExc_ValueError, "deadlines(): column or cache lengths differ");
        goto out;
    }
    positions ps;
    if (get_positions(&s, args[3], R, &ps, "deadlines") < 0)
        goto out;
    if (bo->len / 8 < ps.len) {
        PyErr_SetString(PyExc_ValueError, "deadlines(): out is shorter than the positions");
        goto out;
    }
    const int64_t *key = (const int64_t *)bk->buf;
    const double *last = (const double *)bl->buf, *tbt = (const double *)bt->buf;
    double *ce = (double *)be->buf, *cv = (double *)bv->buf, *o = (double *)bo->buf;
    Py_ssize_t miss = 0;
    for (Py_ssize_t i = 0; i < ps.len; i++) {
        int64_t k = key[AT(&ps, i)];
        if (k < 0 || k >= K) {
            PyErr_SetString(PyExc_IndexError, "deadlines(): key out of range");
            goto out;
        }
        miss += !(ce[k] == last[AT(&ps, i)]); /* NaN never equals: a miss */
    }
    Py_ssize_t crit = 0;
    for (Py_ssize_t i = 0; i < ps.len; i++) {
        int64_t p = AT(&ps, i), k = key[p];
        double v = cv[k];
        if (miss) {
            double e = last[p];
            if (!(ce[k] == e)) {
                double t = tbt[p];
                v = (e + (t == t ? t : dflt)) - shift;
            }
            ce[k] = e;
            cv[k] = v;
        }
        o[i] = v;
        crit += v <= now;
    }
    ret = PyLong_FromSsize_t(crit);
out:
    release_all(&s);
    return ret;
}

/* type_stages(output, key, positions, type_of_key, quota) -> 1 | 0 | -1: whether every group
 * of the requests at `positions` (None: all) with the same (stage = output, type =
 * type_of_key[key]) has at most quota[type] members (1), or some group more (0); -1 when a
 * request's type is not known yet (type_of_key < 0: the caller records it and asks again). */
static PyObject *type_stages(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (want_args(nargs, 5, "type_stages") < 0)
        return NULL;
    bufs s = {.n = 0};
    PyObject *ret = NULL;
    tally t;
    t.heap = NULL;
    Py_buffer *bo = take(&s, args[0], 'i', "output", 0);
    Py_buffer *bk = bo ? take(&s, args[1], 'i', "key", 0) : NULL;
    Py_buffer *bt = bk ? take(&s, args[3], 'i', "type_of_key", 0) : NULL;
    Py_buffer *bq = bt ? take(&s, args[4], 'i', "quota", 0) : NULL;
    if (bq == NULL)
        goto out;
    Py_ssize_t R = bo->len / 8, K = bt->len / 8, m = bq->len / 8;
    if (bk->len != bo->len) {
        PyErr_SetString(PyExc_ValueError, "type_stages(): column lengths differ");
        goto out;
    }
    positions ps;
    if (get_positions(&s, args[2], R, &ps, "type_stages") < 0)
        goto out;
    const int64_t *out_ = (const int64_t *)bo->buf, *key = (const int64_t *)bk->buf;
    const int64_t *tk = (const int64_t *)bt->buf, *q = (const int64_t *)bq->buf;
    for (Py_ssize_t i = 0; i < ps.len; i++) {
        int64_t p = AT(&ps, i), k = key[p];
        if (k < 0 || k >= K) {
            PyErr_SetString(PyExc_IndexError, "type_stages(): key out of range");
            goto out;
        }
        if (tk[k] >= m || out_[p] < 0 || out_[p] > (INT64_MAX - m) / (m ? m : 1)) {
            PyErr_SetString(PyExc_ValueError, "type_stages(): type or stage out of range");
            goto out;
        }
        if (tk[k] < 0) {
            ret = PyLong_FromLong(-1);
            goto out;
        }
    }
    if (tally_init(&t, ps.len) < 0)
        goto out;
    long ok = 1;
    for (Py_ssize_t i = 0; i < ps.len && ok; i++) {
        int64_t p = AT(&ps, i), j = tk[key[p]];
        ok = tally_add(&t, out_[p] * m + j) <= q[j];
    }
    ret = PyLong_FromLong(ok);
out:
    tally_free(&t);
    release_all(&s);
    return ret;
}

/* A member of a stage group: its stage, the tokens it has left (this step's included) and
 * its stage's slot in the tally of every member (where the group's size is read). */
typedef struct {
    int64_t k, r;
    uint64_t slot;
} member;

/* The segments' quotas: seg (S stages, each one's segment, in [0, m) to be read) and min_n
 * (m x m). A segment is checked where it is read, not the whole table on every call (its
 * hundreds of stages cost more than the pass): `*bad` is set when one is out of range, and the
 * pass then raises instead of answering. */
typedef struct {
    const int64_t *seg, *mn;
    Py_ssize_t S, m;
    int *bad;
} quotas;

/* s(x) = seg[min(x, S - 1)]; 0, with *bad set, when that is not a segment */
static int64_t seg_of(const quotas *q, int64_t x) {
    int64_t s = q->seg[x < q->S ? x : q->S - 1];
    if ((uint64_t)s < (uint64_t)q->m)
        return s;
    *q->bad = 1;
    return 0;
}

static void seg_error(const char *fn) {
    PyErr_Format(PyExc_ValueError, "%s(): segment out of range", fn);
}

/* Does a member at stage k with r tokens left, its group's j-th longest, fit the quotas of
 * the stages it reaches after this step, k+1 .. k+r-1 (min_n[s(k+1), s(k+r-1)] >= j)? */
static inline int fits_at(int64_t k, int64_t r, int64_t j, const quotas *q) {
    if (r < 2)
        return 1; /* finishes this step */
    int64_t lo = k < q->S ? k + 1 : q->S; /* saturates past the last stage */
    int64_t hi = r - 1 > INT64_MAX - k ? INT64_MAX : k + r - 1;
    return j <= q->mn[seg_of(q, lo) * q->m + seg_of(q, hi)];
}

/* Keys sorted on the stack up to this many (and as many of scratch), else on the heap. */
#define STACK_KEYS 256

/* `a` ascending (tmp: as many items of scratch): insertion sort of runs of 16, then merges.
 * Why not qsort: its call of the comparison per step was most of groups_hold (issue 13). */
static void sort_keys(uint64_t *a, uint64_t *tmp, Py_ssize_t n) {
    const Py_ssize_t run = 16;
    for (Py_ssize_t lo = 0; lo < n; lo += run) {
        Py_ssize_t hi = lo + run < n ? lo + run : n;
        for (Py_ssize_t i = lo + 1; i < hi; i++) {
            uint64_t x = a[i];
            Py_ssize_t j = i;
            for (; j > lo && a[j - 1] > x; j--)
                a[j] = a[j - 1];
            a[j] = x;
        }
    }
    uint64_t *src = a, *dst = tmp;
    for (Py_ssize_t w = run; w < n; w *= 2) {
        for (Py_ssize_t lo = 0; lo < n; lo += 2 * w) {
            Py_ssize_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            Py_ssize_t i = lo, j = mid, o = lo;
            while (i < mid && j < hi)
                dst[o++] = src[j] < src[i] ? src[j++] : src[i++];
            while (i < mid)
                dst[o++] = src[i++];
            while (j < hi)
                dst[o++] = src[j++];
        }
        uint64_t *x = src;
        src = dst;
        dst = x;
    }
    if (src != a)
        memcpy(a, src, (size_t)n * sizeof(uint64_t));
}

/* Whether the groups of `all` (N members, `t` their stages' final counts, read at each
 * member's slot) keep within the quotas of every stage they reach, all decoding together
 * (see stage_groups_hold): each group's j-th longest member fits (fits_at). A singleton is
 * checked as it is met; the members of larger groups are sorted as one 64-bit key each, their
 * stage's slot in the high half (a group's members together; the stage is the tally's key of
 * that slot) and the tokens left in the low half, the most first. The tokens are read only as
 * r < 2 and through s(k + r - 1), the same for every r > S, so they are capped at S + 1 (exact
 * for any segment table below 2^32 stages); slots are below 2^32 (the tally has under four a
 * member). -1: no memory. */
static int groups_hold(member *all, Py_ssize_t N, const tally *t, const quotas *q) {
    const uint64_t cap = (uint64_t)q->S < UINT32_MAX ? (uint64_t)q->S + 1 : UINT32_MAX;
    uint64_t stack[2 * STACK_KEYS], *keys = stack, *heap = NULL;
    if (N > STACK_KEYS && (keys = heap = (uint64_t *)malloc(2 * (size_t)N * sizeof(uint64_t))) == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t B = 0;
    int ok = 1;
    for (Py_ssize_t i = 0; i < N && ok; i++) {
        if (t->cnt[all[i].slot] == 1) { /* the group has one member */
            ok = fits_at(all[i].k, all[i].r, 1, q);
        } else {
            uint64_t r = (uint64_t)all[i].r < cap ? (uint64_t)all[i].r : cap; /* r >= 1 */
            keys[B++] = (all[i].slot << 32) | (UINT32_MAX - r);
        }
    }
    if (ok)
        sort_keys(keys, keys + B, B);
    int64_t j = 0;
    for (Py_ssize_t i = 0; i < B && ok; i++) {
        uint64_t slot = keys[i] >> 32;
        j = (i > 0 && slot == keys[i - 1] >> 32) ? j + 1 : 1;
        ok = fits_at(t->key[slot], (int64_t)(UINT32_MAX - (keys[i] & UINT32_MAX)), j, q);
    }
    free(heap);
    return ok;
}

/* The segment table and min_n of `bs`, `bn` (each segment is checked where it is read). */
static int get_quotas(Py_buffer *bs, Py_buffer *bn, quotas *q, int *bad, const char *fn) {
    q->seg = (const int64_t *)bs->buf;
    q->mn = (const int64_t *)bn->buf;
    q->S = bs->len / 8;
    q->m = bn->ndim == 2 ? bn->shape[0] : 0;
    q->bad = bad;
    *bad = 0;
    if (q->S == 0 || q->m == 0 || q->m * q->m != bn->len / 8) {
        PyErr_Format(PyExc_ValueError, "%s(): array shapes do not match", fn);
        return -1;
    }
    return 0;
}

/* The arguments stage_groups and stage_groups_hold share: output and max_tokens (args 0, 1,
 * of one length), positions (2), args[3] (named `third`), segment and min_n (4, 5). */
typedef struct {
    const int64_t *out, *mx;
    Py_buffer *third;
    positions ps;
    quotas q;
    int bad; /* q.bad points here */
} stage_args;

static int take_stage_args(bufs *s, PyObject *const *args, const char *third, stage_args *a,
                           const char *fn) {
    Py_buffer *bo = take(s, args[0], 'i', "output", 0);
    Py_buffer *bm = bo ? take(s, args[1], 'i', "max_tokens", 0) : NULL;
    Py_buffer *b3 = bm ? take(s, args[3], 'i', third, 0) : NULL;
    Py_buffer *bs = b3 ? take(s, args[4], 'i', "segment", 0) : NULL;
    Py_buffer *bn = bs ? take(s, args[5], 'i', "min_n", 0) : NULL;
    if (bn == NULL)
        return -1;
    if (bm->len != bo->len) {
        PyErr_Format(PyExc_ValueError, "%s(): array shapes do not match", fn);
        return -1;
    }
    if (get_quotas(bs, bn, &a->q, &a->bad, fn) < 0)
        return -1;
    if (get_positions(s, args[2], bo->len / 8, &a->ps, fn) < 0)
        return -1;
    a->out = (const int64_t *)bo->buf;
    a->mx = (const int64_t *)bm->buf;
    a->third = b3;
    return 0;
}

/* Members on the stack up to this many, else on the heap. */
#define STACK_MEMBERS 512

/* stage_groups(output, max_tokens, positions, limit, segment, min_n, ahead) -> bits:
 * 1 when every group of the requests at `positions` (None: all) at the same stage k =
 * output has at most limit[min(k, len(limit) - 1)] members (else 0, and nothing more).
 * `ahead` asks for more (its bits): 1, the steady check, bit 2 of the answer when each
 * group's count is at most min_n[s(k), s(k + h - 1)], s(x) = segment[min(x, len(segment) - 1)],
 * h the fewest tokens any of them has left (max_tokens - output); 2, the promise's check,
 * bit 4 when the groups hold until they empty (stage_groups_hold with nobody entering). A
 * request with no token left among groups within their limits is a ValueError when `ahead`
 * asks for either; min_n is m x m. */
static PyObject *stage_groups(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (want_args(nargs, 7, "stage_groups") < 0)
        return NULL;
    long ahead = PyLong_AsLong(args[6]);
    if (ahead == -1 && PyErr_Occurred())
        return NULL;
    bufs s = {.n = 0};
    PyObject *ret = NULL;
    tally t;
    t.heap = NULL;
    member stack[STACK_MEMBERS], *all = stack, *heap = NULL;
    stage_args a;
    if (take_stage_args(&s, args, "limit", &a, "stage_groups") < 0)
        goto out;
    Py_ssize_t L = a.third->len / 8;
    if (L == 0) {
        PyErr_SetString(PyExc_ValueError, "stage_groups(): array shapes do not match");
        goto out;
    }
    const int64_t *out_ = a.out, *mx = a.mx, *lim = (const int64_t *)a.third->buf;
    const positions ps = a.ps;
    const quotas q = a.q;
    int hold = (ahead & 2) != 0;
    if (hold && ps.len > STACK_MEMBERS &&
        (all = heap = (member *)malloc(ps.len * sizeof(member))) == NULL) {
        PyErr_NoMemory();
        goto out;
    }
    int64_t h = INT64_MAX;
    for (Py_ssize_t i = 0; i < ps.len; i++) {
        int64_t p = AT(&ps, i);
        if (out_[p] < 0) {
            PyErr_SetString(PyExc_ValueError, "stage_groups(): negative stage");
            goto out;
        }
        if (mx[p] - out_[p] < h)
            h = mx[p] - out_[p];
        if (hold)
            all[i] = (member){out_[p], mx[p] - out_[p], 0};
    }
    if (tally_init(&t, ps.len) < 0)
        goto out;
    long ok = 1;
    for (Py_ssize_t i = 0; i < ps.len && ok; i++) {
        int64_t k = out_[AT(&ps, i)];
        uint64_t slot = tally_slot(&t, k);
        ok = t.cnt[slot] <= lim[k < L ? k : L - 1];
        if (hold)
            all[i].slot = slot;
    }
    if (ok && ahead && ps.len && h < 1) {
        PyErr_SetString(PyExc_ValueError, "stage_groups(): a request has no token left");
        goto out;
    }
    if (ok && (ahead & 1)) {
        int fits = 1;
        for (uint64_t i = 0; i <= t.mask && fits; i++) {
            int64_t k = t.key[i];
            if (k < 0)
                continue;
            int64_t hi = h - 1 > INT64_MAX - k ? INT64_MAX : k + h - 1; /* h >= 1: hi >= k */
            fits = t.cnt[i] <= q.mn[seg_of(&q, k) * q.m + seg_of(&q, hi)];
        }
        ok |= fits ? 2 : 0;
    }
    if (ok && hold) {
        int holds = groups_hold(all, ps.len, &t, &q);
        if (holds < 0)
            goto out;
        ok |= holds ? 4 : 0;
    }
    if (a.bad) {
        seg_error("stage_groups");
        goto out;
    }
    ret = PyLong_FromLong(ok);
out:
    free(heap);
    tally_free(&t);
    release_all(&s);
    return ret;
}

/* stage_groups_hold(output, max_tokens, positions, entering, segment, min_n) -> bool:
 * whether the groups of the requests at `positions` (None: all) at the same stage k = output,
 * with r = max_tokens - output tokens left (at least 1: a ValueError otherwise), and of the
 * requests entering at stage 0 (`entering`: their max_tokens), keep within the quotas of
 * every stage they reach while all decode together: each group's j-th longest member has
 * min_n[s(k+1), s(k+r-1)] >= j. */
static PyObject *stage_groups_hold(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (want_args(nargs, 6, "stage_groups_hold") < 0)
        return NULL;
    bufs s = {.n = 0};
    PyObject *ret = NULL;
    tally t;
    t.heap = NULL;
    member stack[STACK_MEMBERS], *all = stack, *heap = NULL;
    stage_args a;
    if (take_stage_args(&s, args, "entering", &a, "stage_groups_hold") < 0)
        goto out;
    Py_ssize_t E = a.third->len / 8;
    const int64_t *out_ = a.out, *mx = a.mx, *ent = (const int64_t *)a.third->buf;
    const positions ps = a.ps;
    const quotas q = a.q;
    Py_ssize_t N = ps.len + E;
    if (N > STACK_MEMBERS && (all = heap = (member *)malloc(N * sizeof(member))) == NULL) {
        PyErr_NoMemory();
        goto out;
    }
    for (Py_ssize_t i = 0; i < N; i++) {
        int64_t p = i < ps.len ? AT(&ps, i) : -1;
        member e = p >= 0 ? (member){out_[p], mx[p] - out_[p], 0} : (member){0, ent[i - ps.len], 0};
        if (e.k < 0) {
            PyErr_SetString(PyExc_ValueError, "stage_groups_hold(): negative stage");
            goto out;
        }
        if (e.r < 1) {
            PyErr_SetString(PyExc_ValueError, "stage_groups_hold(): a request has no token left");
            goto out;
        }
        all[i] = e;
    }
    if (tally_init(&t, N) < 0)
        goto out;
    for (Py_ssize_t i = 0; i < N; i++)
        all[i].slot = tally_slot(&t, all[i].k);
    int holds = groups_hold(all, N, &t, &q);
    if (holds < 0)
        goto out;
    if (a.bad) {
        seg_error("stage_groups_hold");
        goto out;
    }
    ret = PyBool_FromLong(holds);
out:
    free(heap);
    tally_free(&t);
    release_all(&s);
    return ret;
}

/* segment_blocks(prompt, output, segment, edge, block) -> blocks: the sum over every running
 * request of ceil((prompt + edge[segment[min(output, len(segment) - 1)]]) / block). */
static PyObject *segment_blocks(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (want_args(nargs, 5, "segment_blocks") < 0)
        return NULL;
    int64_t block = PyLong_AsLongLong(args[4]);
    if (PyErr_Occurred())
        return NULL;
    if (block <= 0) {
        PyErr_SetString(PyExc_ValueError, "segment_blocks(): block size must be positive");
        return NULL;
    }
    bufs s = {.n = 0};
    PyObject *ret = NULL;
    Py_buffer *bp = take(&s, args[0], 'i', "prompt", 0);
    Py_buffer *bo = bp ? take(&s, args[1], 'i', "output", 0) : NULL;
    Py_buffer *bs = bo ? take(&s, args[2], 'i', "segment", 0) : NULL;
    Py_buffer *be = bs ? take(&s, args[3], 'i', "edge", 0) : NULL;
    if (be == NULL)
        goto out;
    Py_ssize_t R = bp->len / 8, S = bs->len / 8, E = be->len / 8;
    if (bo->len != bp->len || S == 0) {
        PyErr_SetString(PyExc_ValueError, "segment_blocks(): array shapes do not match");
        goto out;
    }
    const int64_t *pr = (const int64_t *)bp->buf, *o = (const int64_t *)bo->buf;
    const int64_t *seg = (const int64_t *)bs->buf, *edge = (const int64_t *)be->buf;
    int64_t total = 0;
    for (Py_ssize_t i = 0; i < R; i++) {
        if (o[i] < 0) {
            PyErr_SetString(PyExc_ValueError, "segment_blocks(): negative stage");
            goto out;
        }
        int64_t sg = seg[o[i] < S ? o[i] : S - 1]; /* checked where read (see quotas) */
        if ((uint64_t)sg >= (uint64_t)E) {
            seg_error("segment_blocks");
            goto out;
        }
        int64_t x = pr[i] + edge[sg];
        int64_t q = x / block, r = x % block; /* ceil division, exact for negatives too */
        total += q + (r > 0);
    }
    ret = PyLong_FromLongLong(total);
out:
    release_all(&s);
    return ret;
}

/* 0 when every key indexes a table of K entries, else -1 with an IndexError naming `fn`. */
static int check_keys(const int64_t *key, Py_ssize_t R, Py_ssize_t K, const char *fn) {
    for (Py_ssize_t i = 0; i < R; i++) {
        if (key[i] < 0 || key[i] >= K) {
            PyErr_Format(PyExc_IndexError, "%s(): key out of range", fn);
            return -1;
        }
    }
    return 0;
}

/* keyed_reached(values, key, table) -> n: how many running requests have values[p] >=
 * table[key[p]] (MC-SF: outputs that reached their estimate, REC a). */
static PyObject *keyed_reached(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (want_args(nargs, 3, "keyed_reached") < 0)
        return NULL;
    bufs s = {.n = 0};
    PyObject *ret = NULL;
    Py_buffer *bv = take(&s, args[0], 'i', "values", 0);
    Py_buffer *bk = bv ? take(&s, args[1], 'i', "key", 0) : NULL;
    Py_buffer *bt = bk ? take(&s, args[2], 'i', "table", 0) : NULL;
    if (bt == NULL)
        goto out;
    Py_ssize_t R = bk->len / 8;
    if (bv->len != bk->len) {
        PyErr_SetString(PyExc_ValueError, "keyed_reached(): column lengths differ");
        goto out;
    }
    const int64_t *v = (const int64_t *)bv->buf, *key = (const int64_t *)bk->buf;
    const int64_t *tab = (const int64_t *)bt->buf;
    if (check_keys(key, R, bt->len / 8, "keyed_reached") < 0)
        goto out;
    Py_ssize_t n = 0;
    for (Py_ssize_t i = 0; i < R; i++)
        n += v[i] >= tab[key[i]];
    ret = PyLong_FromSsize_t(n);
out:
    release_all(&s);
    return ret;
}

/* keyed_sum(key, table) -> the sum of table[key[p]] over the running requests (MC-SF: their
 * KV peaks kept by key). */
static PyObject *keyed_sum(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (want_args(nargs, 2, "keyed_sum") < 0)
        return NULL;
    bufs s = {.n = 0};
    PyObject *ret = NULL;
    Py_buffer *bk = take(&s, args[0], 'i', "key", 0);
    Py_buffer *bt = bk ? take(&s, args[1], 'i', "table", 0) : NULL;
    if (bt == NULL)
        goto out;
    Py_ssize_t R = bk->len / 8;
    const int64_t *key = (const int64_t *)bk->buf, *tab = (const int64_t *)bt->buf;
    if (check_keys(key, R, bt->len / 8, "keyed_sum") < 0)
        goto out;
    int64_t total = 0;
    for (Py_ssize_t i = 0; i < R; i++)
        total += tab[key[i]];
    ret = PyLong_FromLongLong(total);
out:
    release_all(&s);
    return ret;
}

/* Whether two buffers share a byte (empty ones share none). */
static int overlaps(const Py_buffer *a, const Py_buffer *b) {
    const char *a0 = a->buf, *b0 = b->buf;
    return a->len > 0 && b->len > 0 && a0 < b0 + b->len && b0 < a0 + a->len;
}

/* numpy's float order (NaN last, NaNs equal): a before b. */
static inline int f_lt(double a, double b) { return a < b || (b != b && a == a); }

/* The decode indices idx[0..n) sorted by (lst[i], arrival[dec[i]], i), as numpy's stable
 * lexsort((arrival[dec], lst)) orders them (merge sort, tmp: n slots); with arrival NULL, by
 * (lst[i], i) (numpy's stable argsort). */
static void rank_sort(int64_t *idx, int64_t *tmp, Py_ssize_t n, const double *lst,
                      const double *arrival, const int64_t *dec) {
    if (n < 2)
        return;
    if (n <= 12) { /* insertion sort: stable, ties keep the index order */
        for (Py_ssize_t i = 1; i < n; i++) {
            int64_t x = idx[i];
            Py_ssize_t j = i;
            for (; j > 0; j--) {
                int64_t y = idx[j - 1];
                int before = f_lt(lst[x], lst[y]) ||
                             (arrival && !f_lt(lst[y], lst[x]) &&
                              f_lt(arrival[dec[x]], arrival[dec[y]]));
                if (!before)
                    break;
                idx[j] = y;
            }
            idx[j] = x;
        }
        return;
    }
    Py_ssize_t h = n / 2;
    rank_sort(idx, tmp, h, lst, arrival, dec);
    rank_sort(idx + h, tmp, n - h, lst, arrival, dec);
    memcpy(tmp, idx, (size_t)h * sizeof(int64_t));
    Py_ssize_t a = 0, b = h, k = 0;
    while (a < h && b < n) { /* the right one first only when strictly before: stable */
        int64_t x = tmp[a], y = idx[b];
        int right = f_lt(lst[y], lst[x]) ||
                    (arrival && !f_lt(lst[x], lst[y]) && f_lt(arrival[dec[y]], arrival[dec[x]]));
        idx[k++] = right ? (b++, y) : (a++, x);
    }
    while (a < h)
        idx[k++] = tmp[a++];
}

/* ranked_order(decodes, lst, arrival, part, got, nc, ncrit, nn, order, tok) -> None: SLAI's
 * run order into `order`: the decodes ranked by (lst, arrival[decode]) (stable), their first
 * nc (the critical ones run), the partial prefills `part`, then ranked[ncrit:ncrit + nn]
 * (the non-critical ones that fit); `tok` gets 1 a decode and `got` a partial prefill (an
 * int for every one, or an int64 array beside `part`). `order` and `tok` hold exactly
 * nc + len(part) + nn items and share no byte with an input. */
static PyObject *ranked_order(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (want_args(nargs, 10, "ranked_order") < 0)
        return NULL;
    Py_ssize_t cnt[3]; /* nc, ncrit, nn: any Python or numpy integer */
    for (int i = 0; i < 3; i++) {
        cnt[i] = PyNumber_AsSsize_t(args[5 + i], PyExc_OverflowError);
        if (cnt[i] == -1 && PyErr_Occurred())
            return NULL;
    }
    const Py_ssize_t nc = cnt[0], ncrit = cnt[1], nn = cnt[2];
    bufs s = {.n = 0};
    PyObject *ret = NULL;
    int64_t stack[2 * 256], *heap = NULL;
    int64_t got1 = 0; /* got as one int for every prefill (g == NULL) */
    const int64_t *g = NULL;
    Py_buffer *bd = take(&s, args[0], 'i', "decodes", 0);
    Py_buffer *bl = bd ? take(&s, args[1], 'f', "lst", 0) : NULL;
    Py_buffer *ba = bl ? take(&s, args[2], 'f', "arrival", 0) : NULL;
    Py_buffer *bp = ba ? take(&s, args[3], 'i', "part", 0) : NULL;
    if (bp == NULL)
        goto out;
    if (PyLong_Check(args[4])) {
        got1 = PyLong_AsLongLong(args[4]);
        if (got1 == -1 && PyErr_Occurred())
            goto out;
    } else { /* an int64 array beside part, or a numpy int64 scalar (0-d) */
        Py_buffer *bg = take(&s, args[4], 'i', "got", 0);
        if (bg == NULL)
            goto out;
        if (bg->ndim == 0)
            got1 = *(const int64_t *)bg->buf;
        else if (bg->len != bp->len) {
            PyErr_SetString(PyExc_ValueError, "ranked_order(): lst or got lengths differ");
            goto out;
        } else
            g = (const int64_t *)bg->buf;
    }
    Py_buffer *bo = take(&s, args[8], 'i', "order", PyBUF_WRITABLE);
    Py_buffer *bt = bo ? take(&s, args[9], 'i', "tok", PyBUF_WRITABLE) : NULL;
    if (bt == NULL)
        goto out;
    Py_ssize_t nd = bd->len / 8, np_ = bp->len / 8, R = ba->len / 8;
    if (bl->len != bd->len) {
        PyErr_SetString(PyExc_ValueError, "ranked_order(): lst or got lengths differ");
        goto out;
    }
    if (nc < 0 || nn < 0 || nc > ncrit || ncrit > nd || nn > nd - ncrit ||
        bo->len / 8 != nc + np_ + nn || bt->len / 8 != nc + np_ + nn) {
        PyErr_SetString(PyExc_ValueError, "ranked_order(): counts do not fit the decodes");
        goto out;
    }
    /* the outputs are written while the inputs are read: no byte in common (s.b[4] is got
     * when it came as a buffer) */
    for (int i = 0; i < s.n; i++) {
        const Py_buffer *x = &s.b[i];
        if (x == bo || x == bt)
            continue;
        if (overlaps(bo, x) || overlaps(bt, x)) {
            PyErr_SetString(PyExc_ValueError, "ranked_order(): an output overlaps an input");
            goto out;
        }
    }
    if (overlaps(bo, bt)) {
        PyErr_SetString(PyExc_ValueError, "ranked_order(): order and tok overlap");
        goto out;
    }
    const int64_t *dec = (const int64_t *)bd->buf, *part = (const int64_t *)bp->buf;
    for (Py_ssize_t i = 0; i < nd; i++)
        if (dec[i] < 0 || dec[i] >= R) {
            PyErr_SetString(PyExc_IndexError, "ranked_order(): position out of range");
            goto out;
        }
    int64_t *idx = stack;
    if (nd > 256) {
        idx = heap = (int64_t *)malloc(2 * (size_t)nd * sizeof(int64_t));
        if (heap == NULL) {
            PyErr_NoMemory();
            goto out;
        }
    }
    for (Py_ssize_t i = 0; i < nd; i++)
        idx[i] = i;
    rank_sort(idx, idx + nd, nd, (const double *)bl->buf, (const double *)ba->buf, dec);
    int64_t *o = (int64_t *)bo->buf, *t = (int64_t *)bt->buf;
    Py_ssize_t k = 0;
    for (Py_ssize_t i = 0; i < nc; i++, k++) {
        o[k] = dec[idx[i]];
        t[k] = 1;
    }
    for (Py_ssize_t i = 0; i < np_; i++, k++) {
        o[k] = part[i];
        t[k] = g ? g[i] : got1;
    }
    for (Py_ssize_t i = ncrit; i < ncrit + nn; i++, k++) {
        o[k] = dec[idx[i]];
        t[k] = 1;
    }
    ret = Py_None;
    Py_INCREF(ret);
out:
    free(heap);
    release_all(&s);
    return ret;
}

/* ascending(values) -> bool: values[i] <= values[i + 1] for every i (a 1-D float64 column;
 * a NaN makes it False, as numpy's comparison does). */
static PyObject *ascending(PyObject *self, PyObject *arg) {
    (void)self;
    Py_buffer b;
    if (get_buf(arg, &b, 'f', "values", 0) < 0)
        return NULL;
    if (b.ndim != 1) {
        PyBuffer_Release(&b);
        PyErr_SetString(PyExc_ValueError, "ascending(): values must be 1-D");
        return NULL;
    }
    const double *v = (const double *)b.buf;
    Py_ssize_t n = b.len / 8;
    int ok = 1;
    for (Py_ssize_t i = 0; i + 1 < n && ok; i++)
        ok = v[i] <= v[i + 1];
    PyBuffer_Release(&b);
    return PyBool_FromLong(ok);
}

/* oldest_decoding(prompt, output, computed, arrival, out) -> m: the decoding running
 * requests (output > 0 and prompt + output - computed == 1: columns.decoding_mask) oldest
 * first, as numpy's stable argsort of their arrivals orders them (ties keep the running
 * order), into out[:m]: RAD's decode batch (seed-rad-slai.md §3.2, Algorithm 1 lines 6-8)
 * when the running set's arrivals do not ascend (a mask, two gathers and a sort in numpy).
 * The four columns have one length; out holds at least that many items and shares no byte
 * with them. */
static PyObject *oldest_decoding(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (want_args(nargs, 5, "oldest_decoding") < 0)
        return NULL;
    bufs s = {.n = 0};
    PyObject *ret = NULL;
    int64_t stack[256], *heap = NULL;
    Py_buffer *bp = take(&s, args[0], 'i', "prompt", 0);
    Py_buffer *bo = bp ? take(&s, args[1], 'i', "output", 0) : NULL;
    Py_buffer *bc = bo ? take(&s, args[2], 'i', "computed", 0) : NULL;
    Py_buffer *ba = bc ? take(&s, args[3], 'f', "arrival", 0) : NULL;
    Py_buffer *bout = ba ? take(&s, args[4], 'i', "out", PyBUF_WRITABLE) : NULL;
    if (bout == NULL)
        goto out;
    Py_ssize_t R = bp->len / 8;
    if (bo->len != bp->len || bc->len != bp->len || ba->len != bp->len || bout->len < bp->len) {
        PyErr_SetString(PyExc_ValueError,
                        "oldest_decoding(): the columns differ in length, or out is shorter");
        goto out;
    }
    for (int i = 0; i < 4; i++) {
        if (overlaps(bout, &s.b[i])) {
            PyErr_SetString(PyExc_ValueError, "oldest_decoding(): out overlaps a column");
            goto out;
        }
    }
    const int64_t *P = (const int64_t *)bp->buf, *O = (const int64_t *)bo->buf,
                  *C = (const int64_t *)bc->buf;
    int64_t *o = (int64_t *)bout->buf, *tmp = stack;
    if (R > 256) {
        tmp = heap = (int64_t *)malloc((size_t)R * sizeof(int64_t));
        if (heap == NULL) {
            PyErr_NoMemory();
            goto out;
        }
    }
    Py_ssize_t m = 0;
    for (Py_ssize_t p = 0; p < R; p++)
        if (O[p] > 0 && P[p] + O[p] - C[p] == 1)
            o[m++] = p;
    rank_sort(o, tmp, m, (const double *)ba->buf, NULL, NULL);
    ret = PyLong_FromSsize_t(m);
out:
    free(heap);
    release_all(&s);
    return ret;
}

static PyMethodDef methods[] = {
    {"oldest_decoding", (PyCFunction)(void (*)(void))oldest_decoding, METH_FASTCALL,
     "oldest_decoding(prompt, output, computed, arrival, out) -> m: the decoding requests "
     "oldest first (stable) into out[:m]."},
    {"deadlines", (PyCFunction)(void (*)(void))deadlines, METH_FASTCALL,
     "deadlines(key, last, tbt, positions, cache_e, cache_v, default_tbt, shift, now, out) -> "
     "critical: SLAI's Eq. 8 values into out, through the per-key cache."},
    {"type_stages", (PyCFunction)(void (*)(void))type_stages, METH_FASTCALL,
     "type_stages(output, key, positions, type_of_key, quota) -> 1 | 0 | -1: every (type, "
     "stage) group within its type's quota; -1: a type not known yet."},
    {"stage_groups", (PyCFunction)(void (*)(void))stage_groups, METH_FASTCALL,
     "stage_groups(output, max_tokens, positions, limit, segment, min_n, ahead) -> bits: "
     "1 every stage group within its limit; 2 and within the quotas ahead (ahead & 1); 4 and "
     "they hold until they empty (ahead & 2)."},
    {"stage_groups_hold", (PyCFunction)(void (*)(void))stage_groups_hold, METH_FASTCALL,
     "stage_groups_hold(output, max_tokens, positions, entering, segment, min_n) -> bool: "
     "the stage groups keep within the quotas of every stage they reach."},
    {"segment_blocks", (PyCFunction)(void (*)(void))segment_blocks, METH_FASTCALL,
     "segment_blocks(prompt, output, segment, edge, block) -> blocks held at the end of "
     "each request's current segment."},
    {"keyed_reached", (PyCFunction)(void (*)(void))keyed_reached, METH_FASTCALL,
     "keyed_reached(values, key, table) -> n: how many have values[p] >= table[key[p]]."},
    {"keyed_sum", (PyCFunction)(void (*)(void))keyed_sum, METH_FASTCALL,
     "keyed_sum(key, table) -> the sum of table[key[p]]."},
    {"ranked_order", (PyCFunction)(void (*)(void))ranked_order, METH_FASTCALL,
     "ranked_order(decodes, lst, arrival, part, got, nc, ncrit, nn, order, tok) -> None: "
     "SLAI's run order (ranked critical decodes, partial prefills, ranked non-critical "
     "ones) and its tokens."},
    {"ascending", (PyCFunction)ascending, METH_O,
     "ascending(values) -> bool: every value at most the next (a NaN: False)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    .m_base = PyModuleDef_HEAD_INIT,
    .m_name = "_planops",
    .m_doc = "Per-decode passes of the column policies' plans (harness.policies.planops).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__planops(void) {
#ifdef HARNESS_NUMPY_API
    import_array();
#endif
    return PyModule_Create(&module);
}
