/* The chunk log grouped by request id, in place where it can be (issue 13).
 *
 * Why: the summary groups a simulation's chunk log (15-21M rows, one per token, in time
 * order) by request once. As numpy and pandas that is an int64 copy of the ids, a counting
 * sort's int64 order, a gather of the times through it and the ids rebuilt: three fresh
 * 8-byte-a-row arrays, each paid in page faults on first touch, then random reads through
 * the order. Here one pass counts the rows per id, one scatters the times into their group's
 * next slot (the stable counting sort), and the ids are rewritten grouped in their own
 * buffer: one fresh array (the grouped times).
 *
 *   group_by_id(ids, t, counts, out)   ids int32 or int64 in [0, len(counts)), t and out
 *                                      float64 of the same length: out gets t grouped by id
 *                                      (ascending id, row order kept within an id), counts
 *                                      the rows per id, ids the grouped ids.
 *
 * harness.results.chunklog.group_rows uses it where the install built it; its numpy path
 * (pandas' counting sort and a gather) defines the answer, and
 * tests/results/test_chunkgroup.py compares the two. Arrays come through the buffer protocol;
 * an id out of range, or arrays that overlap, raise ValueError before anything is written.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* A C-contiguous buffer (writable when `flags` says so) of `want` items ('i': int32 or
 * int64, 'q': int64, 'd': float64), each spelling numpy may give. */
static int get_buf(PyObject *o, Py_buffer *b, const char *what, char want, int flags) {
    if (PyObject_GetBuffer(o, b, flags | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return -1;
    const char *f = b->format ? b->format : "B";
    if (*f == '@' || *f == '=' || *f == '<')
        f++;
    int ok = f[0] != 0 && f[1] == 0;
    if (want == 'i')  /* an id column: int32 or int64 */
        ok = ok && ((b->itemsize == 4 && (f[0] == 'i' || f[0] == 'l')) ||
                    (b->itemsize == 8 && (f[0] == 'l' || f[0] == 'q')));
    else if (want == 'q')
        ok = ok && b->itemsize == 8 && (f[0] == 'l' || f[0] == 'q');
    else
        ok = ok && b->itemsize == 8 && f[0] == 'd';
    if (!ok) {
        PyErr_Format(PyExc_TypeError, "%s: expected %s items", what,
                     want == 'i' ? "int32 or int64" : want == 'q' ? "int64" : "float64");
        PyBuffer_Release(b);
        return -1;
    }
    return 0;
}

/* Whether two buffers share a byte. */
static int overlap(const Py_buffer *a, const Py_buffer *b) {
    const char *a0 = a->buf, *b0 = b->buf;
    return a->len > 0 && b->len > 0 && a0 < b0 + b->len && b0 < a0 + a->len;
}

static PyObject *group_by_id(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "group_by_id() takes 4 arguments");
        return NULL;
    }
    Py_buffer bi, bt, bc, bo;
    PyObject *ret = NULL;
    if (get_buf(args[0], &bi, "ids", 'i', PyBUF_WRITABLE) < 0)
        return NULL;
    if (get_buf(args[1], &bt, "t", 'd', 0) < 0)  /* only read */
        goto r1;
    if (get_buf(args[2], &bc, "counts", 'q', PyBUF_WRITABLE) < 0)
        goto r2;
    if (get_buf(args[3], &bo, "out", 'd', PyBUF_WRITABLE) < 0)
        goto r3;
    const Py_ssize_t n = bt.len / 8, m = bc.len / 8;
    const int wide = bi.itemsize == 8;
    if (bi.len / bi.itemsize != n || bo.len / 8 != n) {
        PyErr_SetString(PyExc_ValueError, "group_by_id(): ids, t and out differ in length");
        goto r4;
    }
    if (overlap(&bo, &bt) || overlap(&bo, &bi) || overlap(&bo, &bc) || overlap(&bc, &bi) ||
        overlap(&bc, &bt) || overlap(&bi, &bt)) {
        PyErr_SetString(PyExc_ValueError, "group_by_id(): the four arrays must not overlap");
        goto r4;
    }
    /* next[v]: the slot of id v's next row (first the counts, one place up); the GIL is held
     * throughout, so the ids read again below are the ones validated here */
    int64_t *next = calloc((size_t)m + 1, sizeof(int64_t));
    if (next == NULL) {
        PyErr_NoMemory();
        goto r4;
    }
    const int32_t *i32 = bi.buf;
    const int64_t *i64 = bi.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t v = wide ? i64[i] : i32[i];
        if (v < 0 || v >= m) {
            PyErr_Format(PyExc_ValueError,
                         "group_by_id(): id %lld at row %zd is outside [0, %zd)", (long long)v,
                         i, m);
            free(next);
            goto r4;
        }
        next[v + 1]++;
    }
    int64_t *counts = bc.buf;
    memcpy(counts, next + 1, (size_t)m * sizeof(int64_t));
    for (Py_ssize_t v = 1; v <= m; v++)
        next[v] += next[v - 1];
    const double *t = bt.buf;
    double *out = bo.buf;
    if (wide)
        for (Py_ssize_t i = 0; i < n; i++)
            out[next[i64[i]]++] = t[i];
    else
        for (Py_ssize_t i = 0; i < n; i++)
            out[next[i32[i]]++] = t[i];
    /* the ids grouped, over the old ones: next[v] is now where id v's rows end (and id v+1's
     * begin), so each group's span comes from this function's own counts, not the caller's */
    Py_ssize_t at = 0;
    for (Py_ssize_t v = 0; v < m; v++) {
        Py_ssize_t end = (Py_ssize_t)next[v];
        if (wide)
            for (; at < end; at++)
                ((int64_t *)bi.buf)[at] = v;
        else
            for (; at < end; at++)
                ((int32_t *)bi.buf)[at] = (int32_t)v;
    }
    free(next);
    ret = Py_None;
    Py_INCREF(ret);
r4:
    PyBuffer_Release(&bo);
r3:
    PyBuffer_Release(&bc);
r2:
    PyBuffer_Release(&bt);
r1:
    PyBuffer_Release(&bi);
    return ret;
}

static PyMethodDef methods[] = {
    {"group_by_id", (PyCFunction)(void (*)(void))group_by_id, METH_FASTCALL,
     "group_by_id(ids, t, counts, out) -> None: t grouped by id into out (stable), the rows "
     "per id into counts, ids rewritten grouped."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    .m_base = PyModuleDef_HEAD_INIT,
    .m_name = "_chunkgroup",
    .m_doc = "The chunk log grouped by request id (harness.results.chunklog.group_rows).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__chunkgroup(void) { return PyModule_Create(&module); }
