/* Loops over the vectorised simulator's running arrays, in C (issue 13).
 *
 * Why: harness.engine.fastsim.ArrayEngine keeps its running requests in two small 2-D numpy
 * arrays (IA: int64 rows prompt, outputs, computed, max_tokens, trace row; FA: float64 rows
 * first token, last token, arrival, TBT SLO; one column per running request, in running
 * order). On ~100 running requests a numpy call costs ~1-5 us (an int64 remainder ~5 us) and a
 * scalar read or store ~0.25 us, so a step's bookkeeping in numpy is dozens of microseconds
 * of call overhead; each function here is one pass over the columns:
 *
 *   finish   retire the requests that reached max_tokens (~20 numpy calls and scalar reads);
 *   decode   every running request decodes k tokens (an all-decode step or run), its rows
 *            written to the chunk log (numpy's slice copy and cast: ~2.5 us a step);
 *   give     rule 5 for a few (position, tokens) items (an admission's first chunk);
 *   few      rule 2's grants for a short run order, the step's composition with them (a
 *            Python loop of ~1 us an item, ~3.5 us a call);
 *   opening  the running requests at a block boundary (an all-decode step's new blocks);
 *   steps_fit  how many steps of an all-decode run fit the free KV blocks (a binary search
 *            of numpy sums, core.decode_steps_that_fit);
 *   blocks   KV blocks held and requests at a block boundary in a computed-tokens column
 *            (a policy's RunningColumns.block_counts on the kernel's columns);
 *   grant    rule 2 for a run order (the grants, the prefix kept when the KV runs short,
 *            and the step's composition: ~20 numpy calls on a few dozen items, the steps
 *            mixing prefill and decodes), preempting a lone last item itself (the usual
 *            shortage: ~8 numpy calls and a preempt call);
 *   preempt  recompute-preempt one running request, its slot closed (ten scalar stores and
 *            two 2-D numpy slice copies);
 *   admit    a waiting request into the next running slot (a dozen scalar stores);
 *   each_once  whether a run order lists every running position once (a bincount);
 *   advance  rule 5 for those grants (the step's emitted tokens), then recount's counts;
 *   (decode, give and advance write the emitted trace rows straight into the chunk log's
 *   int32 row buffer, ChunkLog.room: a list of Python ints converted by numpy cost ~2 us a
 *   step);
 *   recount  the fewest tokens left and the requests not decoding, over the running set;
 *   sample   one telemetry row (a step's or a run's), written into the sample columns
 *            (ten attribute reads and appends a step in Python, ~1 us);
 *   step_time  the affine or context cost model's duration of a step (three Python calls
 *            a step, ~1 us);
 *   run_ends the end times of a fast-forwarded decode run under such a model (a Python
 *            loop or numpy's cumsum, ~3 us a run);
 *   prefill_chunks  a lone prefill run's chunks under such a model, with their telemetry
 *            rows (RAD's: ~2 us of Python a chunk).
 *
 * Each has a Python version in ArrayEngine that does the same (the `_py` methods: _preempt_py
 * for preempt, _admit_head_py for admit, _few_items_py for few; for step_time and run_ends
 * the cost model's step_time and core.decode_run_ends; for steps_fit
 * core.decode_steps_that_fit; for grant's lone victim _preempt_tail; for prefill_chunks _prefill_run's
 * own loop; for each_once the module function fastsim._lists_each_once_py); fastsim
 * uses this module where it is built unless HARNESS_PURE_KERNEL=1, and
 * tests/engine/test_rows_c.py compares the two. The arrays are read through the buffer
 * protocol (no numpy headers needed to build this); each function checks their shapes and
 * every index it writes through before writing.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <stdint.h>
#include <string.h>

#define RUNNING 1             /* fastsim._RUNNING */
#define WAITING 4             /* fastsim._WAITING */
#define FINISHED 2            /* fastsim._FINISHED */
#define NO_LEFT ((int64_t)1 << 62) /* fastsim._NO_LEFT */

/* `nargs` is `n`, else a TypeError naming `fn`. */
static int want_args(Py_ssize_t nargs, Py_ssize_t n, const char *fn) {
    if (nargs == n)
        return 0;
    PyErr_Format(PyExc_TypeError, "%s() takes %zd arguments", fn, n);
    return -1;
}

/* A positive block size, else a ValueError naming `fn`. */
static int check_block(int64_t bs, const char *fn) {
    if (bs > 0)
        return 0;
    PyErr_Format(PyExc_ValueError, "%s(): block size must be positive", fn);
    return -1;
}

/* Whether `b` holds int64 ('i'), int32 ('w'), float64 ('f') or int8 ('b') items; else a
 * TypeError. */
static int check_kind(Py_buffer *b, char kind, const char *what) {
    const char *f = b->format ? b->format : "B";
    if (*f == '@' || *f == '=' || *f == '<')
        f++;
    int ok = f[0] != 0 && f[1] == 0;
    if (kind == 'i')
        ok = ok && b->itemsize == 8 && (f[0] == 'l' || f[0] == 'q');
    else if (kind == 'w') /* numpy's int32 is 'l' where a C long has 4 bytes (Windows) */
        ok = ok && b->itemsize == 4 && (f[0] == 'i' || f[0] == 'l');
    else if (kind == 'f')
        ok = ok && b->itemsize == 8 && f[0] == 'd';
    else
        ok = ok && b->itemsize == 1 && f[0] == 'b';
    if (!ok) {
        PyErr_Format(PyExc_TypeError, "%s: expected %s items", what,
                     kind == 'i'   ? "int64"
                     : kind == 'w' ? "int32"
                     : kind == 'f' ? "float64"
                                   : "int8");
        return -1;
    }
    return 0;
}

/* A C-contiguous buffer (writable when `flags` says so) of `kind` items (check_kind). */
static int get_buf(PyObject *o, Py_buffer *b, char kind, const char *what, int flags) {
    if (PyObject_GetBuffer(o, b, flags | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return -1;
    if (check_kind(b, kind, what) < 0) {
        PyBuffer_Release(b);
        return -1;
    }
    return 0;
}

/* The running columns as pointers (IA's 5 int64 rows, FA's 4 float64 rows of `cap` each). */
typedef struct {
    Py_buffer ia, fa;
    Py_ssize_t cap;
    int64_t *P, *O, *C, *M, *ID;
    double *F, *L;
} cols;

static int get_cols(PyObject *ia, PyObject *fa, cols *c) {
    if (get_buf(ia, &c->ia, 'i', "IA", PyBUF_WRITABLE) < 0)
        return -1;
    if (get_buf(fa, &c->fa, 'f', "FA", PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&c->ia);
        return -1;
    }
    c->cap = c->ia.len / 8 / 5;
    if (c->ia.len != c->cap * 5 * 8 || c->fa.len != c->cap * 4 * 8) {
        PyErr_SetString(PyExc_ValueError, "running arrays: shapes do not match (5 and 4 rows)");
        PyBuffer_Release(&c->ia);
        PyBuffer_Release(&c->fa);
        return -1;
    }
    c->P = (int64_t *)c->ia.buf;
    c->O = c->P + c->cap;
    c->C = c->P + 2 * c->cap;
    c->M = c->P + 3 * c->cap;
    c->ID = c->P + 4 * c->cap;
    c->F = (double *)c->fa.buf;
    c->L = c->F + c->cap;
    return 0;
}

static void release_cols(cols *c) {
    PyBuffer_Release(&c->ia);
    PyBuffer_Release(&c->fa);
}

/* The per trace row arrays a request's state moves through (fastsim.Rows): state (int8),
 * outputs so far (int64), first and last token times (float64), of `n` rows each. */
typedef struct {
    Py_buffer b[4];
    Py_ssize_t n;
    int8_t *state;
    int64_t *Orow;
    double *first, *last;
} rowbufs;

static int get_rows(PyObject *const *a, rowbufs *r) {
    static const char kinds[4] = {'b', 'i', 'f', 'f'};
    static const char *names[4] = {"state", "Orow", "first", "last"};
    for (int i = 0; i < 4; i++) {
        if (get_buf(a[i], &r->b[i], kinds[i], names[i], PyBUF_WRITABLE) < 0) {
            while (i--)
                PyBuffer_Release(&r->b[i]);
            return -1;
        }
    }
    r->n = r->b[0].len;
    if (r->b[1].len != r->n * 8 || r->b[2].len != r->n * 8 || r->b[3].len != r->n * 8) {
        PyErr_SetString(PyExc_ValueError, "row arrays: shapes do not match");
        for (int i = 0; i < 4; i++)
            PyBuffer_Release(&r->b[i]);
        return -1;
    }
    r->state = (int8_t *)r->b[0].buf;
    r->Orow = (int64_t *)r->b[1].buf;
    r->first = (double *)r->b[2].buf;
    r->last = (double *)r->b[3].buf;
    return 0;
}

static void release_rows(rowbufs *r) {
    for (int i = 0; i < 4; i++)
        PyBuffer_Release(&r->b[i]);
}

/* finish(IA, FA, R, block, state, Orow, first, last) -> None | (R, finished, blocks, pm, c,
 * min_left): retire every running position p < R with max_tokens - outputs <= 0, in running
 * order: its trace row j = IA[4, p] gets state[j] = FINISHED, Orow[j] = outputs, first[j] and
 * last[j] its token times; the columns after it shift left over it (running order kept).
 * Returns None when none finished (nothing written), else the running count left, the
 * finished trace rows in running order, the KV blocks they held (ceil(computed / block)
 * each), the sum of their prompt + max_tokens, of their computed tokens, and the fewest
 * tokens left among those still running (NO_LEFT when none runs); the caller applies the
 * sums. */
static PyObject *finish(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (want_args(nargs, 8, "finish") < 0)
        return NULL;
    Py_ssize_t R = PyLong_AsSsize_t(args[2]);
    int64_t bs = PyLong_AsLongLong(args[3]);
    if (PyErr_Occurred())
        return NULL;
    if (check_block(bs, "finish") < 0)
        return NULL;
    cols c;
    rowbufs rb;
    if (get_cols(args[0], args[1], &c) < 0)
        return NULL;
    if (get_rows(args + 4, &rb) < 0) {
        release_cols(&c);
        return NULL;
    }
    PyObject *ret = NULL;
    if (R < 0 || R > c.cap) {
        PyErr_SetString(PyExc_ValueError, "finish(): running count out of range");
        goto out;
    }
    /* Check every finished row first: an out-of-range row raises with nothing written. */
    Py_ssize_t nfin = 0;
    for (Py_ssize_t p = 0; p < R; p++) {
        if (c.M[p] - c.O[p] <= 0) {
            if (c.ID[p] < 0 || c.ID[p] >= rb.n) {
                PyErr_SetString(PyExc_IndexError, "finish(): trace row out of range");
                goto out;
            }
            nfin++;
        }
    }
    if (nfin == 0) {
        ret = Py_None;
        Py_INCREF(ret);
        goto out;
    }
    PyObject *fin = PyList_New(nfin);
    if (fin == NULL)
        goto out;
    int64_t blocks = 0, pm = 0, csum = 0, min_left = NO_LEFT;
    Py_ssize_t w = 0, k = 0, cap = c.cap;
    for (Py_ssize_t p = 0; p < R; p++) {
        int64_t left = c.M[p] - c.O[p];
        if (left <= 0) {
            int64_t j = c.ID[p];
            PyObject *jo = PyLong_FromLongLong(j);
            if (jo == NULL) { /* nothing shifted yet past p: the arrays stay consistent */
                Py_DECREF(fin);
                goto out;
            }
            PyList_SET_ITEM(fin, k++, jo);
            rb.state[j] = FINISHED;
            rb.Orow[j] = c.O[p];
            rb.first[j] = c.F[p];
            rb.last[j] = c.L[p];
            blocks += (c.C[p] + bs - 1) / bs;
            pm += c.P[p] + c.M[p];
            csum += c.C[p];
            continue;
        }
        if (left < min_left)
            min_left = left;
        if (w != p) {
            for (int r = 0; r < 5; r++)
                c.P[r * cap + w] = c.P[r * cap + p];
            for (int r = 0; r < 4; r++)
                c.F[r * cap + w] = c.F[r * cap + p];
        }
        w++;
    }
    ret = Py_BuildValue("(nNLLLL)", w, fin, (long long)blocks, (long long)pm, (long long)csum,
                        (long long)min_left);
out:
    release_rows(&rb);
    release_cols(&c);
    return ret;
}

/* Recompute-preempt running position p < R (its trace row j = ID[p] checked in range by the
 * caller): state[j] = WAITING, Orow[j] = outputs, first[j] and last[j] its token times,
 * npre[j] + 1; the columns after p shift left over it (running order kept). */
static void close_preempted(cols *c, rowbufs *rb, int64_t *npre, Py_ssize_t R, Py_ssize_t p) {
    int64_t j = c->ID[p];
    rb->state[j] = WAITING;
    rb->Orow[j] = c->O[p];
    rb->first[j] = c->F[p];
    rb->last[j] = c->L[p];
    npre[j] += 1;
    Py_ssize_t cap = c->cap, tail = R - 1 - p;
    if (tail > 0) {
        for (int r = 0; r < 5; r++)
            memmove(c->P + r * cap + p, c->P + r * cap + p + 1, (size_t)tail * 8);
        for (int r = 0; r < 4; r++)
            memmove(c->F + r * cap + p, c->F + r * cap + p + 1, (size_t)tail * 8);
    }
}

/* preempt(IA, FA, R, p, block, state, Orow, first, last, npre) -> (blocks, computed, row):
 * recompute-preempt running position p < R (ArrayEngine._evict, then _close): its trace row
 * j = IA[4, p] gets state[j] = WAITING, Orow[j] = outputs, first[j] and last[j] its token
 * times, npre[j] + 1; the columns after p shift left over it (running order kept). Returns
 * the KV blocks it held (ceil(computed / block)), its computed tokens and j; the caller
 * frees them and queues j. */
static PyObject *preempt(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (want_args(nargs, 10, "preempt") < 0)
        return NULL;
    Py_ssize_t R = PyLong_AsSsize_t(args[2]);
    Py_ssize_t p = PyLong_AsSsize_t(args[3]);
    int64_t bs = PyLong_AsLongLong(args[4]);
    if (PyErr_Occurred())
        return NULL;
    if (check_block(bs, "preempt") < 0)
        return NULL;
    cols c;
    rowbufs rb;
    Py_buffer nb;
    if (get_cols(args[0], args[1], &c) < 0)
        return NULL;
    if (get_rows(args + 5, &rb) < 0) {
        release_cols(&c);
        return NULL;
    }
    if (get_buf(args[9], &nb, 'i', "npre", PyBUF_WRITABLE) < 0) {
        release_rows(&rb);
        release_cols(&c);
        return NULL;
    }
    PyObject *ret = NULL;
    if (nb.len != rb.n * 8) {
        PyErr_SetString(PyExc_ValueError, "preempt(): npre needs one item per trace row");
        goto out;
    }
    if (R < 0 || R > c.cap || p < 0 || p >= R) {
        PyErr_SetString(PyExc_IndexError, "preempt(): position out of the running set");
        goto out;
    }
    int64_t j = c.ID[p];
    if (j < 0 || j >= rb.n) {
        PyErr_SetString(PyExc_IndexError, "preempt(): trace row out of range");
        goto out;
    }
    int64_t comp = c.C[p];
    close_preempted(&c, &rb, (int64_t *)nb.buf, R, p);
    ret = Py_BuildValue("(LLL)", (long long)((comp + bs - 1) / bs), (long long)comp, (long long)j);
out:
    PyBuffer_Release(&nb);
    release_rows(&rb);
    release_cols(&c);
    return ret;
}

/* admit(IA, FA, R, j, g, block, state, Orow, first, last, PM, AT) -> blocks: trace row j
 * into running slot R (ArrayEngine._admit_head): its prompt and max_tokens from PM (int64, 2
 * rows of the trace's rows), outputs and token times from the row arrays, no computed
 * tokens, its arrival and TBT SLO from AT (float64, 2 rows; None: no request metadata, those
 * columns untouched), state[j] = RUNNING; returns the KV blocks of a first chunk of g
 * tokens (ceil(g / block)). The caller counts the slot and the blocks. */
static PyObject *admit(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (want_args(nargs, 12, "admit") < 0)
        return NULL;
    Py_ssize_t R = PyLong_AsSsize_t(args[2]);
    Py_ssize_t j = PyLong_AsSsize_t(args[3]);
    int64_t g = PyLong_AsLongLong(args[4]);
    int64_t bs = PyLong_AsLongLong(args[5]);
    if (PyErr_Occurred())
        return NULL;
    if (check_block(bs, "admit") < 0)
        return NULL;
    cols c;
    rowbufs rb;
    Py_buffer pm, at;
    int have_at = args[11] != Py_None;
    if (get_cols(args[0], args[1], &c) < 0)
        return NULL;
    if (get_rows(args + 6, &rb) < 0) {
        release_cols(&c);
        return NULL;
    }
    if (get_buf(args[10], &pm, 'i', "PM", 0) < 0) {
        release_rows(&rb);
        release_cols(&c);
        return NULL;
    }
    if (have_at && get_buf(args[11], &at, 'f', "AT", 0) < 0) {
        PyBuffer_Release(&pm);
        release_rows(&rb);
        release_cols(&c);
        return NULL;
    }
    PyObject *ret = NULL;
    Py_ssize_t n = rb.n, cap = c.cap;
    if (pm.len != 2 * n * 8 || (have_at && at.len != 2 * n * 8)) {
        PyErr_SetString(PyExc_ValueError, "admit(): PM and AT need 2 rows of the trace's rows");
        goto out;
    }
    if (g < 0) {
        PyErr_SetString(PyExc_ValueError, "admit(): a first chunk of negative tokens");
        goto out;
    }
    if (R < 0 || R >= cap || j < 0 || j >= n) {
        PyErr_SetString(PyExc_IndexError, "admit(): no free slot R, or trace row out of range");
        goto out;
    }
    const int64_t *PM = (const int64_t *)pm.buf;
    rb.state[j] = RUNNING;
    c.P[R] = PM[j];
    c.O[R] = rb.Orow[j];
    c.C[R] = 0;
    c.M[R] = PM[n + j];
    c.ID[R] = j;
    c.F[R] = rb.first[j];
    c.L[R] = rb.last[j];
    if (have_at) {
        const double *AT = (const double *)at.buf;
        c.F[2 * cap + R] = AT[j];
        c.F[3 * cap + R] = AT[n + j];
    }
    ret = PyLong_FromLongLong((g + bs - 1) / bs);
out:
    if (have_at)
        PyBuffer_Release(&at);
    PyBuffer_Release(&pm);
    release_rows(&rb);
    release_cols(&c);
    return ret;
}

/* each_once(order, n) -> bool: whether the int64 positions `order` list each of 0 .. n-1
 * exactly once (fastsim.lists_each_once: a bincount and a count, ~3 us); False for a
 * position outside them. */
static PyObject *each_once(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (want_args(nargs, 2, "each_once") < 0)
        return NULL;
    Py_ssize_t n = PyLong_AsSsize_t(args[1]);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    Py_buffer ob;
    if (get_buf(args[0], &ob, 'i', "order", 0) < 0)
        return NULL;
    const int64_t *order = (const int64_t *)ob.buf;
    int ok = ob.len / 8 == n;
    char *seen = NULL;
    if (ok && n > 0) {
        seen = PyMem_Calloc((size_t)n, 1);
        if (seen == NULL) {
            PyBuffer_Release(&ob);
            return PyErr_NoMemory();
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            int64_t p = order[i];
            if (p < 0 || p >= n || seen[p]) {
                ok = 0;
                break;
            }
            seen[p] = 1;
        }
    }
    PyMem_Free(seen);
    PyBuffer_Release(&ob);
    return PyBool_FromLong(ok);
}

/* The chunk log's int32 row buffer `o` with room for `n` rows from offset `at` (ChunkLog.room):
 * a pointer to row `at`, NULL (an exception set, the buffer released) when it is not. */
static int32_t *rows_at(PyObject *o, PyObject *at_obj, Py_ssize_t n, Py_buffer *b, const char *fn) {
    Py_ssize_t at = PyLong_AsSsize_t(at_obj);
    if (at == -1 && PyErr_Occurred())
        return NULL;
    if (get_buf(o, b, 'w', "out", PyBUF_WRITABLE) < 0)
        return NULL;
    if (at < 0 || at > b->len / 4 - n) {
        PyErr_Format(PyExc_ValueError, "%s(): out needs int32 room for every item from at", fn);
        PyBuffer_Release(b);
        return NULL;
    }
    return (int32_t *)b->buf + at;
}

/* decode(IA, FA, R, k, end, block, out, at) -> blocks: each of the first R running requests
 * computes and emits k tokens, the last at `end` (outputs and computed += k, last token time =
 * end); returns the KV blocks they then hold, sum of ceil(computed / block). Their trace rows
 * are written to the int32 buffer `out` from offset `at` (the chunk log's: ChunkLog.room), R
 * a step, k times (ChunkLog.add_run's order). */
static PyObject *decode(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (want_args(nargs, 8, "decode") < 0)
        return NULL;
    Py_ssize_t R = PyLong_AsSsize_t(args[2]);
    int64_t k = PyLong_AsLongLong(args[3]);
    double end = PyFloat_AsDouble(args[4]);
    int64_t bs = PyLong_AsLongLong(args[5]);
    if (PyErr_Occurred())
        return NULL;
    if (check_block(bs, "decode") < 0)
        return NULL;
    if (k < 1) {
        PyErr_SetString(PyExc_ValueError, "decode(): steps must be positive");
        return NULL;
    }
    cols c;
    if (get_cols(args[0], args[1], &c) < 0)
        return NULL;
    if (R < 0 || R > c.cap) {
        release_cols(&c);
        PyErr_SetString(PyExc_ValueError, "decode(): running count out of range");
        return NULL;
    }
    if (R > PY_SSIZE_T_MAX / k) {
        release_cols(&c);
        PyErr_SetString(PyExc_ValueError, "decode(): too many rows");
        return NULL;
    }
    Py_buffer ob;
    int32_t *out = rows_at(args[6], args[7], R * k, &ob, "decode");
    if (out == NULL) {
        release_cols(&c);
        return NULL;
    }
    int64_t blocks = 0;
    for (Py_ssize_t p = 0; p < R; p++) {
        c.O[p] += k;
        c.C[p] += k;
        c.L[p] = end;
        blocks += (c.C[p] + bs - 1) / bs;
        out[p] = (int32_t)c.ID[p];
    }
    for (int64_t s = 1; s < k; s++)
        memcpy(out + s * R, out, (size_t)R * sizeof(int32_t));
    release_cols(&c);
    PyBuffer_Release(&ob);
    return PyLong_FromLongLong(blocks);
}

/* Over n computed-token counts: the KV blocks they hold, sum of ceil(c / block), and how many
 * sit at a block boundary (c % block == 0: decoding one more token opens a block). */
static void count_blocks(const int64_t *c, Py_ssize_t n, int64_t bs, int64_t *held,
                         int64_t *open) {
    int64_t h = 0, o = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t q = c[i] / bs, r = c[i] % bs;
        h += q + (r != 0);
        o += r == 0;
    }
    *held = h;
    *open = o;
}

/* blocks(computed, block) -> (held, opening): count_blocks over a 1-D int64 array (a
 * policy's RunningColumns.block_counts on the kernel's columns). */
static PyObject *blocks(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (want_args(nargs, 2, "blocks") < 0)
        return NULL;
    int64_t bs = PyLong_AsLongLong(args[1]);
    if (PyErr_Occurred())
        return NULL;
    if (check_block(bs, "blocks") < 0)
        return NULL;
    Py_buffer b;
    if (get_buf(args[0], &b, 'i', "blocks()", 0) < 0)
        return NULL;
    int64_t held, open;
    count_blocks((const int64_t *)b.buf, b.len / 8, bs, &held, &open);
    PyBuffer_Release(&b);
    return Py_BuildValue("(LL)", (long long)held, (long long)open);
}

/* The new blocks that steps 2..k of an all-decode run take beyond what comp[i] + 1 tokens
 * hold (every request decodes one token a step), summed until it passes `cap` (then cap + 1
 * at most: no overflow). */
static int64_t run_blocks(const int64_t *comp, Py_ssize_t n, int64_t k, int64_t bs, int64_t cap) {
    int64_t s = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        s += (comp[i] + k + bs - 1) / bs - (comp[i] + bs) / bs;
        if (s > cap)
            return s;
    }
    return s;
}

/* steps_fit(computed, k_max, block, free) -> k: core.decode_steps_that_fit over a 1-D int64
 * column of computed tokens: the most identical decode steps (at most k_max) whose blocks
 * fit, steps 2..k taking at most `free` more (the same shortcut and binary search, so the
 * same k; 1 when even step 2 does not fit). Computed tokens in [0, 2**53), k_max in
 * [1, 2**62] (an empty batch's min_left), |free| below 2**62. */
static PyObject *steps_fit(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (want_args(nargs, 4, "steps_fit") < 0)
        return NULL;
    long long k_max = PyLong_AsLongLong(args[1]);
    if (k_max == -1 && PyErr_Occurred())
        return NULL;
    long long bs = PyLong_AsLongLong(args[2]);
    if (bs == -1 && PyErr_Occurred())
        return NULL;
    long long free_ = PyLong_AsLongLong(args[3]);
    if (free_ == -1 && PyErr_Occurred())
        return NULL;
    const long long lim = (long long)1 << 62; /* sums below stay under 2**63 (run_blocks) */
    if (check_block(bs, "steps_fit") < 0)
        return NULL;
    if (k_max < 1 || k_max > lim || bs >= ((long long)1 << 53) || free_ >= lim || free_ <= -lim) {
        PyErr_SetString(PyExc_ValueError,
                        "steps_fit(): k_max must be in [1, 2**62], block below 2**53, |free| "
                        "below 2**62");
        return NULL;
    }
    Py_buffer b;
    if (get_buf(args[0], &b, 'i', "steps_fit()", 0) < 0)
        return NULL;
    const int64_t *comp = (const int64_t *)b.buf;
    Py_ssize_t n = b.len / 8;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (comp[i] < 0 || comp[i] >= ((int64_t)1 << 53)) {
            PyBuffer_Release(&b);
            PyErr_SetString(PyExc_ValueError, "steps_fit(): computed tokens must be in [0, 2**53)");
            return NULL;
        }
    }
    long long k = k_max;
    /* each request opens at most ceil((k - 1) / block) blocks in steps 2..k */
    long long per = (k_max + bs - 2) / bs;
    int all_fit = n == 0 ? free_ >= 0 : (free_ >= 0 && per <= free_ / n);
    if (!all_fit && run_blocks(comp, n, k_max, bs, free_) > free_) {
        long long lo = 1, hi = k_max; /* run_blocks(lo) == 0, run_blocks(hi) > free */
        while (hi - lo > 1) {
            long long mid = lo + (hi - lo) / 2;
            if (run_blocks(comp, n, mid, bs, free_) <= free_)
                lo = mid;
            else
                hi = mid;
        }
        k = lo;
    }
    PyBuffer_Release(&b);
    return PyLong_FromLongLong(k);
}

/* opening(IA, R, block) -> n: count_blocks's requests at a block boundary among the first R
 * running requests (the all-decode step's new blocks, every step: read from IA in place, no
 * slice of it made). */
static PyObject *opening(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (want_args(nargs, 3, "opening") < 0)
        return NULL;
    Py_ssize_t R = PyLong_AsSsize_t(args[1]);
    int64_t bs = PyLong_AsLongLong(args[2]);
    if (PyErr_Occurred())
        return NULL;
    if (check_block(bs, "opening") < 0)
        return NULL;
    Py_buffer b;
    if (get_buf(args[0], &b, 'i', "IA", 0) < 0)
        return NULL;
    Py_ssize_t cap = b.len / 8 / 5;
    if (b.len != cap * 5 * 8 || R < 0 || R > cap) {
        PyBuffer_Release(&b);
        PyErr_SetString(PyExc_ValueError, "opening(): expected IA's 5 rows and R <= columns");
        return NULL;
    }
    int64_t held, open;
    count_blocks((const int64_t *)b.buf + 2 * cap, R, bs, &held, &open);
    PyBuffer_Release(&b);
    return PyLong_FromLongLong(open);
}

/* Position p's request emits a token at `end` (its KV covers prompt and outputs): outputs +
 * 1, last token time `end`, the first too if it had none (NaN); its trace row is written to
 * `out` (the chunk log's row buffer, room checked by the caller). */
static inline void emit(cols *c, Py_ssize_t p, double end, int32_t *out) {
    c->O[p] += 1;
    c->L[p] = end;
    if (c->F[p] != c->F[p]) /* NaN: no token yet */
        c->F[p] = end;
    *out = (int32_t)c->ID[p];
}

/* give(IA, FA, items, end, out, at) -> (emitted, tokens, npf_change, min_left): rule 5 for
 * items (position p, g tokens, ...) of a step ending at `end`, in order: p's computed tokens
 * grow by g; a request whose KV then covers its prompt and outputs emits a token at `end`
 * (outputs + 1, last token time `end`, first token time too if it had none). The trace rows
 * that emitted are written, in item order, to the int32 buffer `out` from offset `at` (the
 * chunk log's, with room for every item: ChunkLog.room); returns how many, the tokens
 * computed, the change in the count of running requests that are not decoding (a request
 * decodes when it has emitted and its KV covers all but its last token), and the fewest
 * tokens left among the items (NO_LEFT for none). */
static PyObject *give(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (want_args(nargs, 6, "give") < 0)
        return NULL;
    double end = PyFloat_AsDouble(args[3]);
    if (PyErr_Occurred())
        return NULL;
    PyObject *seq = PySequence_Fast(args[2], "give(): items must be iterable");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    Py_buffer ob;
    int32_t *out = rows_at(args[4], args[5], n, &ob, "give");
    if (out == NULL) {
        Py_DECREF(seq);
        return NULL;
    }
    cols c;
    if (get_cols(args[0], args[1], &c) < 0) {
        PyBuffer_Release(&ob);
        Py_DECREF(seq);
        return NULL;
    }
    PyObject *ret = NULL;
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; i++) { /* check them all first: an error writes nothing */
        PyObject *it = items[i];
        if (!PyTuple_Check(it) || PyTuple_GET_SIZE(it) < 2) {
            PyErr_SetString(PyExc_TypeError, "give(): each item is a tuple (position, tokens, ...)");
            goto out;
        }
        Py_ssize_t p = PyLong_AsSsize_t(PyTuple_GET_ITEM(it, 0));
        (void)PyLong_AsLongLong(PyTuple_GET_ITEM(it, 1));
        if (PyErr_Occurred())
            goto out;
        if (p < 0 || p >= c.cap) {
            PyErr_SetString(PyExc_IndexError, "give(): position out of range");
            goto out;
        }
    }
    int64_t tokens = 0, npf = 0, min_left = NO_LEFT;
    Py_ssize_t k = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t p = PyLong_AsSsize_t(PyTuple_GET_ITEM(items[i], 0));
        int64_t g = PyLong_AsLongLong(PyTuple_GET_ITEM(items[i], 1));
        int64_t cc = c.C[p] + g;
        c.C[p] = cc;
        tokens += g;
        int64_t o = c.O[p], prompt = c.P[p];
        int was_decoding = o > 0 && prompt + o - cc + g == 1;
        if (cc == prompt + o) {
            emit(&c, p, end, out + k++);
            o += 1;
        }
        npf += was_decoding - (o > 0 && prompt + o - cc == 1);
        int64_t m = c.M[p] - o;
        if (m < min_left)
            min_left = m;
    }
    ret = Py_BuildValue("(nLLL)", k, (long long)tokens, (long long)npf, (long long)min_left);
out:
    release_cols(&c);
    PyBuffer_Release(&ob);
    Py_DECREF(seq);
    return ret;
}

/* numpy's sum of a contiguous float64 array (pairwise: sequential below 8 items, 8
 * accumulators up to 128, halves beyond), so a step's prefill attention work is the float
 * ArrayEngine._composition's ``.sum()`` gives. */
static double pairwise_sum(const double *a, Py_ssize_t n) {
    if (n < 8) {
        double res = 0.;
        for (Py_ssize_t i = 0; i < n; i++)
            res += a[i];
        return res;
    }
    if (n <= 128) {
        double r[8];
        Py_ssize_t i;
        for (int j = 0; j < 8; j++)
            r[j] = a[j];
        for (i = 8; i < n - (n % 8); i += 8)
            for (int j = 0; j < 8; j++)
                r[j] += a[i + j];
        double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for (; i < n; i++)
            res += a[i];
        return res;
    }
    Py_ssize_t n2 = n / 2;
    n2 -= n2 % 8;
    return pairwise_sum(a, n2) + pairwise_sum(a + n2, n - n2);
}

/* The first `n` items of an int64 position array, each in [0, R); else an error. */
static int check_positions(const int64_t *pos, Py_ssize_t n, Py_ssize_t R, const char *fn) {
    for (Py_ssize_t i = 0; i < n; i++) {
        if (pos[i] < 0 || pos[i] >= R) {
            PyErr_Format(PyExc_IndexError, "%s(): position out of range", fn);
            return -1;
        }
    }
    return 0;
}

/* The KV blocks a request with c computed tokens opens by computing g more (c, g >= 0). */
static inline int64_t opened(int64_t c, int64_t g, int64_t bs) {
    return (c + g + bs - 1) / bs - (c + bs - 1) / bs;
}

/* few(IA, R, order, tok, budget, block) -> (items, budget left, blocks needed, KV read,
 * decodes, prefill tokens, attention work): rule 2's grants for a short run order in scalars
 * (ArrayEngine._few_items_py), nothing written. In order, position p (< R) wants tok (an int,
 * or tok[i] of an int64 array) and gets g = min(want, remaining, budget left) tokens,
 * remaining = prompt + outputs - computed; an item granted nothing is dropped, a kept one is
 * the tuple (p, g, remaining - g) and adds to the step's composition: KV read computed + g; a
 * decode (remaining 1, with outputs) or else g prefill tokens and g * (computed + g / 2)
 * attention work, summed left to right (as the Python loop: the same float). */
static PyObject *few(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (want_args(nargs, 6, "few") < 0)
        return NULL;
    Py_ssize_t R = PyLong_AsSsize_t(args[1]);
    int64_t budget = PyLong_AsLongLong(args[4]);
    int64_t bs = PyLong_AsLongLong(args[5]);
    int scalar = PyLong_Check(args[3]);
    int64_t tok = scalar ? PyLong_AsLongLong(args[3]) : 0;
    if (PyErr_Occurred())
        return NULL;
    if (check_block(bs, "few") < 0)
        return NULL;
    Py_buffer b[3]; /* IA, order, tok (an array): released together at the end */
    int held = 0;
    PyObject *ret = NULL, *items = NULL;
    if (get_buf(args[0], &b[held], 'i', "IA", 0) < 0)
        goto done;
    held++;
    if (get_buf(args[2], &b[held], 'i', "order", 0) < 0)
        goto done;
    held++;
    if (!scalar) {
        if (get_buf(args[3], &b[held], 'i', "tok", 0) < 0)
            goto done;
        held++;
    }
    Py_ssize_t cap = b[0].len / 8 / 5, n = b[1].len / 8;
    const int64_t *order = (const int64_t *)b[1].buf;
    const int64_t *want_in = scalar ? NULL : (const int64_t *)b[2].buf;
    if (b[0].len != cap * 5 * 8 || R < 0 || R > cap) {
        PyErr_SetString(PyExc_ValueError, "few(): expected IA's 5 rows and R <= columns");
        goto done;
    }
    if (!scalar && b[2].len != b[1].len) {
        PyErr_SetString(PyExc_ValueError, "few(): tok needs one item per position");
        goto done;
    }
    if (check_positions(order, n, R, "few") < 0)
        goto done;
    items = PyList_New(0);
    if (items == NULL)
        goto done;
    const int64_t *P = (const int64_t *)b[0].buf, *O = P + cap, *C = P + 2 * cap;
    int64_t need = 0, kv = 0, decodes = 0, prefill = 0;
    double attn = 0.;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t p = order[i], c = C[p], o = O[p];
        int64_t rem = P[p] + o - c, w = scalar ? tok : want_in[i];
        int64_t g = w < rem ? w : rem;
        if (budget < g)
            g = budget;
        if (g <= 0)
            continue;
        PyObject *it = Py_BuildValue("(LLL)", (long long)p, (long long)g, (long long)(rem - g));
        if (it == NULL || PyList_Append(items, it) < 0) {
            Py_XDECREF(it);
            goto done;
        }
        Py_DECREF(it);
        budget -= g;
        need += opened(c, g, bs);
        kv += c + g;
        if (rem == 1 && o > 0) {
            decodes += 1;
        } else {
            prefill += g;
            attn += (double)g * ((double)c + (double)g / 2.);
        }
    }
    ret = Py_BuildValue("(OLLLLLd)", items, (long long)budget, (long long)need, (long long)kv,
                        (long long)decodes, (long long)prefill, attn);
done:
    Py_XDECREF(items);
    while (held > 0)
        PyBuffer_Release(&b[--held]);
    return ret;
}

/* grant's lone victim, order[kept] (kept = len(order) - 1): the kept items granted anything
 * as positions past its slot to kept_out[:m] (args[11]), their grants to g[:m]; then the
 * victim preempted as `preempt` does (FA args[1], the trace row arrays args[12..16]), its
 * blocks, computed tokens and trace row out. The buffers are only taken here (the usual
 * step preempts nobody); everything is checked before anything is written. 0, or -1 with an
 * exception set. */
static int grant_victim(PyObject *const *args, Py_buffer *ia, Py_ssize_t R, const int64_t *order,
                        Py_ssize_t kept, int64_t *g, int64_t bs, Py_ssize_t *m, int64_t *blocks,
                        int64_t *comp, int64_t *row) {
    cols c;
    rowbufs rb;
    Py_buffer kb, nb;
    int rc = -1;
    if (get_buf(args[1], &c.fa, 'f', "FA", PyBUF_WRITABLE) < 0)
        return -1;
    c.cap = ia->len / 8 / 5;
    if (get_buf(args[11], &kb, 'i', "kept_out", PyBUF_WRITABLE) < 0)
        goto release_fa;
    if (get_rows(args + 12, &rb) < 0)
        goto release_kept;
    if (get_buf(args[16], &nb, 'i', "npre", PyBUF_WRITABLE) < 0)
        goto release_rows;
    if (c.fa.len != c.cap * 4 * 8) {
        PyErr_SetString(PyExc_ValueError, "grant(): expected FA's 4 rows as long as IA's");
        goto done;
    }
    if (kb.len < kept * 8 || nb.len != rb.n * 8) {
        PyErr_SetString(PyExc_ValueError,
                        "grant(): kept_out needs room for the kept items, npre one item per "
                        "trace row");
        goto done;
    }
    c.P = (int64_t *)ia->buf;
    c.O = c.P + c.cap;
    c.C = c.P + 2 * c.cap;
    c.M = c.P + 3 * c.cap;
    c.ID = c.P + 4 * c.cap;
    c.F = (double *)c.fa.buf;
    c.L = c.F + c.cap;
    int64_t v = order[kept];
    if (c.ID[v] < 0 || c.ID[v] >= rb.n) {
        PyErr_SetString(PyExc_IndexError, "grant(): trace row out of range");
        goto done;
    }
    int64_t *kp = (int64_t *)kb.buf;
    Py_ssize_t w = 0;
    for (Py_ssize_t i = 0; i < kept; i++) {
        if (g[i] > 0) {
            kp[w] = order[i] - (order[i] > v);
            g[w++] = g[i];
        }
    }
    *m = w;
    *comp = c.C[v];
    *blocks = (*comp + bs - 1) / bs;
    *row = c.ID[v];
    close_preempted(&c, &rb, (int64_t *)nb.buf, R, v);
    rc = 0;
done:
    PyBuffer_Release(&nb);
release_rows:
    release_rows(&rb);
release_kept:
    PyBuffer_Release(&kb);
release_fa:
    PyBuffer_Release(&c.fa);
    return rc;
}

/* grant(IA, FA, R, order, tokens, tok, budget, block, free, attn, out, kept_out, state, Orow,
 * first, last, npre) -> None | (budget left, scheduled, decodes, prefill tokens, attention
 * work, KV read, new blocks, kept, m, victim blocks, victim computed, victim row): rule 2 for
 * the run order `order` (positions < R) wanting `tokens[i]` each (an int64 array, or None and
 * `tok` for all), as ArrayEngine._run_items, _run_preempting and _composition: each item's
 * want is clipped to [0, its remaining], then to the budget left before it (the budget minus
 * the earlier items' wants, when they exceed it); its new KV blocks are counted. When they do
 * not fit in `free`, only the longest prefix that rule 2's sequential pass keeps is granted
 * (`kept` items: the others are preempted, from the tail). None when a position is listed
 * twice (its fancy-index updates apply it once; the array pass decides), nothing written.
 * Else the grants go to `out` (int64, one per item) and the step's composition over the kept
 * items comes back: items granted anything, decodes among them (a decode: has output and one
 * token remaining), prefill tokens and attention work (sum of g * (computed + g / 2), numpy's
 * float) over the other items, KV tokens read (computed + granted, over the items granted
 * anything), their new blocks, and `kept` (the item count: nothing to preempt).
 *
 * When only the last item is to be preempted (kept = len(order) - 1, the usual shortage),
 * it is preempted here, as `preempt` does (the trace row arrays state .. npre, fastsim.Rows),
 * and the kept items granted anything are written as positions after its slot closed (the
 * later ones shift down by one) to kept_out[:m], their grants moved to out[:m]
 * (ArrayEngine._preempt_tail's one-victim path); the victim's KV blocks, computed tokens and
 * trace row come back for the caller to free and queue. Otherwise m = -1 and the victim
 * fields are 0, 0, -1: nothing preempted here (the caller preempts a longer tail). */
static PyObject *grant(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (want_args(nargs, 17, "grant") < 0)
        return NULL;
    Py_ssize_t R = PyLong_AsSsize_t(args[2]);
    int64_t tok = PyLong_AsLongLong(args[5]);
    int64_t budget = PyLong_AsLongLong(args[6]);
    int64_t bs = PyLong_AsLongLong(args[7]);
    int64_t free_blocks = PyLong_AsLongLong(args[8]);
    int use_attn = PyObject_IsTrue(args[9]);
    if (PyErr_Occurred() || use_attn < 0)
        return NULL;
    if (check_block(bs, "grant") < 0)
        return NULL;
    Py_buffer ia, ob, tb, out;
    int have_tok = args[4] != Py_None;
    if (get_buf(args[0], &ia, 'i', "IA", PyBUF_WRITABLE) < 0)
        return NULL;
    if (get_buf(args[3], &ob, 'i', "order", 0) < 0) {
        PyBuffer_Release(&ia);
        return NULL;
    }
    if (have_tok && get_buf(args[4], &tb, 'i', "tokens", 0) < 0) {
        PyBuffer_Release(&ia);
        PyBuffer_Release(&ob);
        return NULL;
    }
    if (get_buf(args[10], &out, 'i', "out", PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&ia);
        PyBuffer_Release(&ob);
        if (have_tok)
            PyBuffer_Release(&tb);
        return NULL;
    }
    PyObject *ret = NULL;
    double *work = NULL;
    char *seen = NULL;
    Py_ssize_t cap = ia.len / 8 / 5, n = ob.len / 8;
    const int64_t *order = (const int64_t *)ob.buf;
    const int64_t *want_in = have_tok ? (const int64_t *)tb.buf : NULL;
    int64_t *g = (int64_t *)out.buf;
    if (ia.len != cap * 5 * 8 || R < 0 || R > cap) {
        PyErr_SetString(PyExc_ValueError, "grant(): expected IA's 5 rows and R <= columns");
        goto done;
    }
    if (have_tok && tb.len != ob.len) {
        PyErr_SetString(PyExc_ValueError, "grant(): tokens and out need one item per position");
        goto done;
    }
    if (check_positions(order, n, R, "grant") < 0)
        goto done;
    /* a position listed twice: numpy's fancy-index updates (the array pass) apply it once;
     * leave that case to it (nothing written; such an order may be longer than `out`, which
     * holds one item per running slot) */
    seen = PyMem_Calloc((size_t)(R ? R : 1), 1);
    if (seen == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (seen[order[i]]) {
            ret = Py_None;
            Py_INCREF(ret);
            goto done;
        }
        seen[order[i]] = 1;
    }
    if (out.len < ob.len) {
        PyErr_SetString(PyExc_ValueError, "grant(): tokens and out need one item per position");
        goto done;
    }
    const int64_t *P = (const int64_t *)ia.buf, *O = P + cap, *C = P + 2 * cap;
    /* the wants, clipped to [0, remaining]; their sum decides the budget's clip */
    int64_t total_want = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t p = order[i];
        int64_t w = have_tok ? want_in[i] : tok;
        int64_t rem = P[p] + O[p] - C[p];
        if (w < 0)
            w = 0;
        if (w > rem)
            w = rem;
        g[i] = w;
        total_want += w;
    }
    if (total_want > budget) { /* item i gets min(want, max(budget - earlier wants, 0)) */
        int64_t before = 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            int64_t w = g[i], left = budget - before;
            before += w;
            if (left < 0)
                left = 0;
            g[i] = w < left ? w : left;
        }
    }
    int64_t need = 0, held = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t cc = C[order[i]];
        need += opened(cc, g[i], bs);
        held += (cc + bs - 1) / bs;
    }
    Py_ssize_t kept = n;
    if (need > free_blocks) {
        /* rule 2's sequential pass in closed form (ArrayEngine._run_preempting): victims come
         * from the tail, so it keeps the longest prefix k whose new blocks fit in the free
         * ones plus all the blocks the items from k on hold; the rest are preempted.
         * The condition holds on a prefix of k = 0..n (what is spent only grows, what is
         * freed only shrinks), so the walk stops at the first k where it fails; what the
         * kept prefix spent is its new blocks. (k = n never holds: need > free.) */
        int64_t spent = 0, freed = held;
        int any = 0;
        for (Py_ssize_t k = 0; k < n && spent <= free_blocks + freed; k++) {
            any = 1;
            kept = k;
            need = spent;
            int64_t cc = C[order[k]];
            spent += opened(cc, g[k], bs);
            freed -= (cc + bs - 1) / bs;
        }
        if (!any) { /* not even the empty prefix: the array pass decides */
            ret = Py_None;
            Py_INCREF(ret);
            goto done;
        }
    }
    int64_t granted = 0, sched = 0, decodes = 0, prefill = 0, kv_read = 0;
    Py_ssize_t nw = 0;
    if (use_attn) {
        work = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(double));
        if (work == NULL) {
            PyErr_NoMemory();
            goto done;
        }
    }
    for (Py_ssize_t i = 0; i < kept; i++) {
        int64_t p = order[i], gi = g[i], cc = C[p];
        int decode = O[p] > 0 && P[p] + O[p] - cc == 1;
        granted += gi;
        if (gi > 0) {
            sched++;
            decodes += decode;
            kv_read += cc + gi;
        }
        /* the array pass's composition reads every item when nothing is preempted, only
         * the granted ones after a preemption: the same terms in the same places */
        if (!decode && (gi > 0 || kept == n)) {
            prefill += gi;
            if (use_attn)
                work[nw++] = (double)gi * ((double)cc + (double)gi / 2.0);
        }
    }
    double attn = use_attn ? pairwise_sum(work, nw) : 0.0;
    Py_ssize_t m = -1;
    int64_t v_blocks = 0, v_comp = 0, v_row = -1;
    if (kept == n - 1 &&
        grant_victim(args, &ia, R, order, kept, g, bs, &m, &v_blocks, &v_comp, &v_row) < 0)
        goto done;
    ret = Py_BuildValue("(LLLLdLLnnLLL)", (long long)(budget - granted), (long long)sched,
                        (long long)decodes, (long long)prefill, attn, (long long)kv_read,
                        (long long)need, kept, m, (long long)v_blocks, (long long)v_comp,
                        (long long)v_row);
done:
    PyMem_Free(work);
    PyMem_Free(seen);
    PyBuffer_Release(&ia);
    PyBuffer_Release(&ob);
    if (have_tok)
        PyBuffer_Release(&tb);
    PyBuffer_Release(&out);
    return ret;
}

/* Over the first R running requests: the fewest tokens left (max_tokens - outputs; NO_LEFT
 * for none) and how many are not decoding (a decode: has output and one token remaining). */
static void count_left(const cols *c, Py_ssize_t R, int64_t *min_left, int64_t *npf) {
    int64_t lo = NO_LEFT, n = 0;
    for (Py_ssize_t p = 0; p < R; p++) {
        int64_t m = c->M[p] - c->O[p];
        if (m < lo)
            lo = m;
        n += !(c->O[p] > 0 && c->P[p] + c->O[p] - c->C[p] == 1);
    }
    *min_left = lo;
    *npf = n;
}

/* advance(IA, FA, R, order, grants, end, out, at) -> (emitted, tokens, min_left,
 * not_decoding): rule 5 for the grants of `grant` (positions < R, in run order), as
 * ArrayEngine._advance's array branch: each one's computed tokens grow by its grant; one
 * whose KV then covers its prompt and outputs emits a token at `end` (outputs + 1, last token
 * time `end`, the first too if it had none). The emitted trace rows are written, in run
 * order, to the int32 buffer `out` from offset `at` (room for every position:
 * ChunkLog.room); returns how many, the tokens computed, and then `recount`'s two counts over
 * the running set (the step's rule 5 changes both). */
static PyObject *advance(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (want_args(nargs, 8, "advance") < 0)
        return NULL;
    Py_ssize_t R = PyLong_AsSsize_t(args[2]);
    double end = PyFloat_AsDouble(args[5]);
    if (PyErr_Occurred())
        return NULL;
    cols c;
    if (get_cols(args[0], args[1], &c) < 0)
        return NULL;
    Py_buffer ob, gb, rb;
    if (get_buf(args[3], &ob, 'i', "order", 0) < 0) {
        release_cols(&c);
        return NULL;
    }
    Py_ssize_t n = ob.len / 8;
    if (get_buf(args[4], &gb, 'i', "grants", 0) < 0) {
        release_cols(&c);
        PyBuffer_Release(&ob);
        return NULL;
    }
    int32_t *out = rows_at(args[6], args[7], n, &rb, "advance");
    if (out == NULL) {
        release_cols(&c);
        PyBuffer_Release(&ob);
        PyBuffer_Release(&gb);
        return NULL;
    }
    PyObject *ret = NULL;
    const int64_t *order = (const int64_t *)ob.buf, *g = (const int64_t *)gb.buf;
    if (R < 0 || R > c.cap || gb.len < ob.len) {
        PyErr_SetString(PyExc_ValueError, "advance(): running count or grants out of range");
        goto done;
    }
    if (check_positions(order, n, R, "advance") < 0)
        goto done;
    int64_t tokens = 0;
    Py_ssize_t k = 0;
    for (Py_ssize_t i = 0; i < n; i++) { /* positions are distinct (the host checked) */
        int64_t p = order[i], cc = c.C[p] + g[i];
        c.C[p] = cc;
        tokens += g[i];
        if (cc == c.P[p] + c.O[p])
            emit(&c, p, end, out + k++);
    }
    int64_t min_left, npf;
    count_left(&c, R, &min_left, &npf);
    ret = Py_BuildValue("(nLLL)", k, (long long)tokens, (long long)min_left, (long long)npf);
done:
    release_cols(&c);
    PyBuffer_Release(&ob);
    PyBuffer_Release(&gb);
    PyBuffer_Release(&rb);
    return ret;
}

/* recount(IA, R) -> (min_left, not_decoding): over the first R running requests, the fewest
 * tokens left (max_tokens - outputs; NO_LEFT for none) and how many are not decoding
 * (ArrayEngine._recount). */
static PyObject *recount(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (want_args(nargs, 2, "recount") < 0)
        return NULL;
    Py_ssize_t R = PyLong_AsSsize_t(args[1]);
    if (PyErr_Occurred())
        return NULL;
    Py_buffer b;
    if (get_buf(args[0], &b, 'i', "IA", 0) < 0)
        return NULL;
    Py_ssize_t cap = b.len / 8 / 5;
    if (b.len != cap * 5 * 8 || R < 0 || R > cap) {
        PyBuffer_Release(&b);
        PyErr_SetString(PyExc_ValueError, "recount(): expected IA's 5 rows and R <= columns");
        return NULL;
    }
    const int64_t *P = (const int64_t *)b.buf;
    cols c = {.cap = cap, .P = (int64_t *)P, .O = (int64_t *)P + cap, .C = (int64_t *)P + 2 * cap,
              .M = (int64_t *)P + 3 * cap};
    int64_t min_left, npf;
    count_left(&c, R, &min_left, &npf);
    PyBuffer_Release(&b);
    return Py_BuildValue("(LL)", (long long)min_left, (long long)npf);
}

/* Row n of the telemetry columns S (10 rows of `cap`, simresult.SAMPLE_COLS order): sample's
 * values, the counts whole numbers below 2**53 (exact as doubles; used * block too). */
static void put_row(double *S, Py_ssize_t cap, Py_ssize_t n, double end, double t, int64_t k,
                    int64_t prefill, int64_t decode, int64_t used, int64_t block, int64_t total,
                    int64_t waiting, int64_t running, int64_t preempted) {
    S[n] = end;
    S[cap + n] = (double)k;
    S[2 * cap + n] = end - t;
    S[3 * cap + n] = (double)prefill;
    S[4 * cap + n] = (double)decode;
    S[5 * cap + n] = (double)(used * block);
    S[6 * cap + n] = (double)used / (double)total;
    S[7 * cap + n] = (double)waiting;
    S[8 * cap + n] = (double)running;
    S[9 * cap + n] = (double)preempted;
}

/* sample(S, n, end, t, k, prefill, decode, used, block, total, waiting, running, preempted)
 * -> None: row n of the telemetry columns S (float64, 10 rows of `cap`, in
 * simresult.SAMPLE_COLS order; the counts are whole numbers below 2**53, exact as doubles):
 * the step's end, k steps, end - t, its prefill and decode tokens, the KV tokens held
 * (used * block), the KV usage (used / total, as Python's true division of such integers),
 * then the waiting, running and preempted counts (ArrayEngine._sample_py). */
static PyObject *sample(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (want_args(nargs, 13, "sample") < 0)
        return NULL;
    /* n, then k, prefill, decode, used, block, total, waiting, running, preempted: each
     * converted only while none has failed (the first error is the one raised) */
    int64_t v[10];
    for (int i = 0; i < 10; i++) {
        v[i] = PyLong_AsLongLong(args[i == 0 ? 1 : 3 + i]);
        if (v[i] == -1 && PyErr_Occurred())
            return NULL;
    }
    double end = PyFloat_AsDouble(args[2]);
    if (end == -1.0 && PyErr_Occurred())
        return NULL;
    double t = PyFloat_AsDouble(args[3]);
    if (t == -1.0 && PyErr_Occurred())
        return NULL;
    const int64_t lim = (int64_t)1 << 53;
    for (int i = 1; i < 10; i++) {
        if (v[i] < 0 || v[i] >= lim) {
            PyErr_SetString(PyExc_ValueError, "sample(): counts must be in [0, 2**53)");
            return NULL;
        }
    }
    if (v[5] < 1 || v[6] < 1) {
        PyErr_SetString(PyExc_ValueError, "sample(): block and total must be positive");
        return NULL;
    }
    if (v[4] > lim / v[5]) {
        PyErr_SetString(PyExc_ValueError, "sample(): used * block must be below 2**53");
        return NULL;
    }
    Py_buffer b;
    if (get_buf(args[0], &b, 'f', "S", PyBUF_WRITABLE) < 0)
        return NULL;
    Py_ssize_t cap = b.ndim == 2 ? b.shape[1] : 0;
    if (b.ndim != 2 || b.shape[0] != 10 || v[0] < 0 || v[0] >= cap) {
        PyBuffer_Release(&b);
        PyErr_SetString(PyExc_ValueError, "sample(): expected S's 10 rows and n < columns");
        return NULL;
    }
    put_row((double *)b.buf, cap, (Py_ssize_t)v[0], end, t, v[1], v[2], v[3], v[4], v[5], v[6],
            v[7], v[8], v[9]);
    PyBuffer_Release(&b);
    Py_RETURN_NONE;
}

/* The coefficients of step_time's coef and table tuples (checked), into c[6] and *nc, *nt. */
static int read_terms(PyObject *coef, PyObject *table, double c[6], Py_ssize_t *nc,
                      Py_ssize_t *nt, const char *fn) {
    *nc = PyTuple_Check(coef) ? PyTuple_GET_SIZE(coef) : -1;
    *nt = PyTuple_Check(table) ? PyTuple_GET_SIZE(table) : -1;
    if ((*nc != 4 && *nc != 6) || *nt < 1) {
        PyErr_Format(PyExc_TypeError,
                     "%s(): coef must be a tuple of 4 or 6 floats, table a non-empty tuple of "
                     "floats", fn);
        return -1;
    }
    for (Py_ssize_t i = 0; i < *nc; i++) {
        PyObject *x = PyTuple_GET_ITEM(coef, i);
        if (!PyFloat_Check(x)) {
            PyErr_Format(PyExc_TypeError, "%s(): coef must hold floats", fn);
            return -1;
        }
        c[i] = PyFloat_AS_DOUBLE(x);
    }
    return 0;
}

/* The KV-read rate r(D) of table (its last entry beyond), else -1 with a TypeError. */
static int read_rate(PyObject *table, Py_ssize_t nt, long long D, double *r, const char *fn) {
    PyObject *x = PyTuple_GET_ITEM(table, D < nt ? (Py_ssize_t)D : nt - 1);
    if (!PyFloat_Check(x)) {
        PyErr_Format(PyExc_TypeError, "%s(): table must hold floats", fn);
        return -1;
    }
    *r = PyFloat_AS_DOUBLE(x);
    return 0;
}

/* A count in [0, 2**53) (exact as a double), else -1 with an error set. */
static long long read_count(PyObject *o, const char *fn) {
    long long v = PyLong_AsLongLong(o);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (v < 0 || v >= ((long long)1 << 53)) {
        PyErr_Format(PyExc_ValueError, "%s(): the counts must be in [0, 2**53)", fn);
        return -1;
    }
    return v;
}

/* max(floor, base + per_token*(P+D) + per_decode*D) of coef, left to right, the floor kept
 * unless the sum is greater (Python's max): the step's fixed part, a decode run's with P = 0
 * (the affine model's step_time and decode_affine). */
static double fixed_part(const double c[6], long long P, long long D) {
    double lin = c[0] + c[1] * (double)(P + D);
    lin = lin + c[2] * (double)D;
    return lin > c[3] ? lin : c[3];
}

/* The model's step duration for P prefill tokens, D decodes, K KV tokens read at rate r(D),
 * attention work attn (the context terms when nc == 6), in the Python models' order. */
static double step_seconds(const double c[6], Py_ssize_t nc, double r, long long P, long long D,
                           long long K, double attn) {
    double t = fixed_part(c, P, D) + r * (double)K;
    if (nc == 6) {
        t = t + c[4] * attn;
        t = t + (P > 0 ? c[5] : 0.0);
    }
    return t;
}

/* step_time(coef, table, prefill, decodes, kv, attn) -> seconds: the cost model's duration of
 * a step (costmodel.step_terms gives coef and table). coef: a tuple of 4 floats (base,
 * per_token, per_decode, floor: the affine model) or 6 (and attn_s, step_s: the context
 * model); table: a tuple of at least one float, the KV-read rate r(D) for D = 0, 1, ... (the
 * last one beyond). The counts are non-negative integers below 2**53 and attn a float: the
 * same operations in the same order as AffineCostModel.step_time and
 * ContextCostModel.step_time in Python (each IEEE-rounded; no fused multiply-add: setup.py),
 * so the same float. A Python method call chain of ~1 us a step otherwise (ArrayEngine). */
static PyObject *step_time(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (want_args(nargs, 6, "step_time") < 0)
        return NULL;
    double c[6];
    Py_ssize_t nc, nt;
    if (read_terms(args[0], args[1], c, &nc, &nt, "step_time") < 0)
        return NULL;
    long long v[3];
    for (int i = 0; i < 3; i++)
        if ((v[i] = read_count(args[2 + i], "step_time")) < 0)
            return NULL;
    double attn = PyFloat_AsDouble(args[5]);
    if (attn == -1.0 && PyErr_Occurred())
        return NULL;
    long long P = v[0], D = v[1], K = v[2];
    double r;
    if (read_rate(args[1], nt, D, &r, "step_time") < 0)
        return NULL;
    return PyFloat_FromDouble(step_seconds(c, nc, r, P, D, K, attn));
}

/* run_ends(coef, table, now, k_max, decodes, kv, until) -> [ends]: core.decode_run_ends for
 * the model of coef and table (step_time's): the ends of the identical decode steps of a
 * fast-forward from now, step j (0-based) while j < k_max and (j == 0 or ends[j-1] < until);
 * each step takes fixed + rate * (kv + j * decodes) (the model's decode_affine: fixed =
 * max(floor, base + per_token*D + per_decode*D), rate = r(D)), summed in order from 0.0 as
 * the Python loop and np.cumsum sum them, so the same floats. A list of floats (at least
 * one). */
static PyObject *run_ends(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (want_args(nargs, 7, "run_ends") < 0)
        return NULL;
    double c[6];
    Py_ssize_t nc, nt;
    if (read_terms(args[0], args[1], c, &nc, &nt, "run_ends") < 0)
        return NULL;
    double now = PyFloat_AsDouble(args[2]);
    if (now == -1.0 && PyErr_Occurred())
        return NULL;
    long long k_max = read_count(args[3], "run_ends"), D, K;
    if (k_max < 0 || (D = read_count(args[4], "run_ends")) < 0 ||
        (K = read_count(args[5], "run_ends")) < 0)
        return NULL;
    double until = PyFloat_AsDouble(args[6]);
    if (until == -1.0 && PyErr_Occurred())
        return NULL;
    if (k_max < 1) {
        PyErr_SetString(PyExc_ValueError, "run_ends(): k_max must be at least 1");
        return NULL;
    }
    if (D > 0 && k_max - 1 > (((long long)1 << 53) - 1 - K) / D) {  /* K + j * D exact */
        PyErr_SetString(PyExc_OverflowError, "run_ends(): the run's KV reads pass 2**53");
        return NULL;
    }
    const double fixed = fixed_part(c, 0, D);
    double rate;
    if (read_rate(args[1], nt, D, &rate, "run_ends") < 0)
        return NULL;
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    double acc = 0.0, end = now;
    for (long long j = 0; j < k_max; j++) {
        if (j && end >= until)
            break;
        acc = acc + (fixed + rate * (double)(K + j * D));
        end = now + acc;
        PyObject *x = PyFloat_FromDouble(end);
        if (x == NULL || PyList_Append(out, x) < 0) {
            Py_XDECREF(x);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(x);
    }
    return out;
}

/* prefill_chunks(coef, table, S, n, t, until, computed, whole, output, tok, cap, block, used,
 * total, waiting, running, preempted, last_ok) -> (t, computed, used, steps, last): the
 * chunks of one running request's prefill run (ArrayEngine._prefill_run), step by step as
 * its Python loop runs them: each chunk is min(tok, whole - computed, cap) tokens (whole:
 * prompt + output, the tokens to compute), allocates the KV blocks it opens, takes
 * step_time(chunk, 0, computed + chunk, chunk * (computed + chunk / 2)) under the model of
 * coef and table (step_time's) and writes its telemetry row n, n + 1, ... into S (sample's).
 * Stops, running nothing more, before a chunk that starts at or after until, that gets no
 * tokens or whose blocks do not fit (total - used), when a recomputed request (output > 0)
 * has one token left (it decodes), and when S is full; and before the chunk that completes
 * the prompt unless last_ok (nonzero: its token does not finish the request, so nothing
 * leaves the running set before its row), else after it: the caller emits its token (the
 * rows and KV are as after the step; computed is not advanced by it). Returns the time the
 * last chunk ended (t if none ran), the computed tokens and used blocks after them, how many
 * ran, and the completing chunk's tokens (0: it did not run). Why: RAD prefills a request
 * alone in 256-token chunks, ~700k single-request steps on 100k Azure conversations, each
 * ~2 us of Python. */
static PyObject *prefill_chunks(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (want_args(nargs, 18, "prefill_chunks") < 0)
        return NULL;
    double c[6];
    Py_ssize_t nc, nt;
    if (read_terms(args[0], args[1], c, &nc, &nt, "prefill_chunks") < 0)
        return NULL;
    double t = PyFloat_AsDouble(args[4]);
    if (t == -1.0 && PyErr_Occurred())
        return NULL;
    double until = PyFloat_AsDouble(args[5]);
    if (until == -1.0 && PyErr_Occurred())
        return NULL;
    /* n, computed, whole, output, waiting, running, preempted, last_ok: counts below 2**53 */
    static const int at[8] = {3, 6, 7, 8, 14, 15, 16, 17};
    long long v[8];
    for (int i = 0; i < 8; i++)
        if ((v[i] = read_count(args[at[i]], "prefill_chunks")) < 0)
            return NULL;
    /* tok, cap, block, used, total: any int64; tok and cap clipped to it (a chunk is the
     * smaller of them and the prompt left, below 2**53) */
    long long w[5];
    static const int at2[5] = {9, 10, 11, 12, 13};
    for (int i = 0; i < 5; i++) {
        int over = 0;
        w[i] = PyLong_AsLongLongAndOverflow(args[at2[i]], &over);
        if (w[i] == -1 && !over && PyErr_Occurred())
            return NULL;
        if (over && i >= 2) {
            PyErr_SetString(PyExc_OverflowError, "prefill_chunks(): block, used or total past int64");
            return NULL;
        }
        if (over)
            w[i] = over > 0 ? LLONG_MAX : -1;
    }
    long long n = v[0], comp = v[1], whole = v[2], out = v[3];
    long long tok = w[0], cap = w[1], bs = w[2], used = w[3], total = w[4];
    if (bs < 1 || total < 1 || used < 0 || used > total) {
        PyErr_SetString(PyExc_ValueError,
                        "prefill_chunks(): block and total must be positive, 0 <= used <= total");
        return NULL;
    }
    /* the telemetry row's KV figures as the sample pass writes them: exact doubles only
     * below 2**53 (else no chunk here: the Python loop goes on, its sample row decides) */
    const long long exact = ((long long)1 << 53) - 1;
    const long long used_max = total <= exact && bs <= exact ? exact / bs : -1;
    double rate;
    if (read_rate(args[1], nt, 0, &rate, "prefill_chunks") < 0)
        return NULL;
    Py_buffer b;
    if (get_buf(args[2], &b, 'f', "S", PyBUF_WRITABLE) < 0)
        return NULL;
    Py_ssize_t scap = b.ndim == 2 ? b.shape[1] : 0;
    if (b.ndim != 2 || b.shape[0] != 10 || n > scap) {
        PyBuffer_Release(&b);
        PyErr_SetString(PyExc_ValueError, "prefill_chunks(): expected S's 10 rows and n <= columns");
        return NULL;
    }
    double *S = (double *)b.buf;
    long long nb = used_max < 0 ? 0 : (comp + bs - 1) / bs, steps = 0, last = 0;
    while (used_max >= 0 && t < until && n < scap) {
        long long rem = whole - comp;
        if (out > 0 && rem == 1)
            break; /* a recomputed request caught up: it decodes now */
        long long g = tok < rem ? tok : rem;
        g = g < cap ? g : cap;
        if (g <= 0 || (g == rem && !v[7]))
            break; /* nothing to run, or the completing chunk (the caller's) */
        long long nd = (comp + g + bs - 1) / bs - nb;
        if (nd > total - used || used + nd > used_max)
            break;
        nb += nd;
        used += nd;
        /* Python's g * (c + g / 2): KV read comp + g, below whole so below 2**53 */
        double attn = (double)g * ((double)comp + (double)g / 2.0);
        double end = t + step_seconds(c, nc, rate, g, 0, comp + g, attn);
        put_row(S, scap, n, end, t, 1, g, 0, used, bs, total, v[4], v[5], v[6]);
        n++;
        steps++;
        t = end;
        if (g == rem) { /* the prompt is done: the caller emits its token */
            last = g;
            break;
        }
        comp += g;
    }
    PyBuffer_Release(&b);
    return Py_BuildValue("(dLLLL)", t, comp, used, steps, last);
}

static PyMethodDef methods[] = {
    {"decode", (PyCFunction)(void (*)(void))decode, METH_FASTCALL,
     "decode(IA, FA, R, k, end, block, out, at) -> blocks: the first R running requests each "
     "decode k tokens, the last at end, their trace rows written to out from at (R a step, k "
     "times); the KV blocks they then hold."},
    {"blocks", (PyCFunction)(void (*)(void))blocks, METH_FASTCALL,
     "blocks(computed, block) -> (held, opening): KV blocks held, and requests at a block "
     "boundary."},
    {"steps_fit", (PyCFunction)(void (*)(void))steps_fit, METH_FASTCALL,
     "steps_fit(computed, k_max, block, free) -> k: core.decode_steps_that_fit (the most "
     "identical decode steps whose blocks fit)."},
    {"opening", (PyCFunction)(void (*)(void))opening, METH_FASTCALL,
     "opening(IA, R, block) -> n: running requests whose next decoded token opens a KV block."},
    {"give", (PyCFunction)(void (*)(void))give, METH_FASTCALL,
     "give(IA, FA, items, end, out, at) -> (emitted, tokens, npf change, min left): rule 5 "
     "for (position, tokens, ...) items of a step ending at end; the emitted trace rows to "
     "out[at:]."},
    {"few", (PyCFunction)(void (*)(void))few, METH_FASTCALL,
     "few(IA, R, order, tok, budget, block) -> (items, budget left, blocks needed, KV read, "
     "decodes, prefill tokens, attention work): rule 2's grants for a short run order."},
    {"grant", (PyCFunction)(void (*)(void))grant, METH_FASTCALL,
     "grant(IA, FA, R, order, tokens, tok, budget, block, free, attn, out, kept_out, state, "
     "Orow, first, last, npre) -> None | (budget left, scheduled, decodes, prefill, "
     "attention, KV read, new blocks, kept, m, victim blocks, victim computed, victim row): "
     "rule 2 for a run order (the items past kept are to be preempted; a lone last one is, "
     "here, the kept positions then in kept_out[:m])."},
    {"advance", (PyCFunction)(void (*)(void))advance, METH_FASTCALL,
     "advance(IA, FA, R, order, grants, end, out, at) -> (emitted, tokens, min_left, "
     "not_decoding): rule 5 for grant's grants; the emitted trace rows to out[at:]; then "
     "recount's counts."},
    {"admit", (PyCFunction)(void (*)(void))admit, METH_FASTCALL,
     "admit(IA, FA, R, j, g, block, state, Orow, first, last, PM, AT) -> blocks: trace row j "
     "into running slot R, a first chunk of g tokens."},
    {"each_once", (PyCFunction)(void (*)(void))each_once, METH_FASTCALL,
     "each_once(order, n) -> bool: order lists each of 0 .. n-1 exactly once."},
    {"preempt", (PyCFunction)(void (*)(void))preempt, METH_FASTCALL,
     "preempt(IA, FA, R, p, block, state, Orow, first, last, npre) -> (blocks, computed, "
     "row): recompute-preempt running position p (its slot closed)."},
    {"recount", (PyCFunction)(void (*)(void))recount, METH_FASTCALL,
     "recount(IA, R) -> (min_left, not_decoding) over the running set."},
    {"finish", (PyCFunction)(void (*)(void))finish, METH_FASTCALL,
     "finish(IA, FA, R, block, state, Orow, first, last) -> None | (R, finished, blocks, pm, "
     "c, min_left): retire the running requests that reached max_tokens (module docstring)."},
    {"sample", (PyCFunction)(void (*)(void))sample, METH_FASTCALL,
     "sample(S, n, end, t, k, prefill, decode, used, block, total, waiting, running, "
     "preempted) -> None: telemetry row n into the sample columns S."},
    {"step_time", (PyCFunction)(void (*)(void))step_time, METH_FASTCALL,
     "step_time(coef, table, prefill, decodes, kv, attn) -> seconds: the affine or context "
     "cost model's step duration (costmodel.step_terms)."},
    {"run_ends", (PyCFunction)(void (*)(void))run_ends, METH_FASTCALL,
     "run_ends(coef, table, now, k_max, decodes, kv, until) -> [ends]: core.decode_run_ends "
     "for that model (a list of floats)."},
    {"prefill_chunks", (PyCFunction)(void (*)(void))prefill_chunks, METH_FASTCALL,
     "prefill_chunks(coef, table, S, n, t, until, computed, whole, output, tok, cap, block, "
     "used, total, waiting, running, preempted, last_ok) -> (t, computed, used, steps, last): "
     "the chunks of a lone prefill run, with their telemetry rows (the completing one only "
     "when last_ok; its tokens: last)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    .m_base = PyModuleDef_HEAD_INIT,
    .m_name = "_rows",
    .m_doc = "Scalar loops over harness.engine.fastsim's running arrays.",
    .m_size = -1,
    .m_methods = methods,
};

/* The version of the passes' arguments and results (fastsim's _ROWS_ABI): bumped when one
 * changes, so an install built before is not used (the Python passes run) rather than called
 * with arguments it does not take. 2: prefill_chunks's last_ok; 3: advance and give write
 * the emitted rows into the chunk log's buffer (out, at); 4: decode too; 5: few; 6: few's
 * items are (position, tokens, remaining after them); 7: grant preempts a lone last item
 * (drop_last gone), advance recounts. */
#define ROWS_ABI 7

PyMODINIT_FUNC PyInit__rows(void) {
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "_ABI", ROWS_ABI) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
