/* Scatter-add of whole rows: the gradient of an embedding lookup.

   out[idx[i]] += updates[i] for i = 0, 1, ... in order, one row at a time,
   which is what NumPy's np.add.at does element by element: every element
   of out receives the same additions in the same order, so the result is
   the same bits. NumPy's add.at pays a Python-level iteration per index
   (and the vectorised NumPy lowering in compiler/array_lowering.py one
   fancy-indexing pass per occurrence rank): 57-65 ms of a 150 ms
   transformer step on a 16-core Xeon (issue 16), where this loop streams
   the updates once.

   Indices: negative ones count from the end (once), out-of-range ones are
   dropped, as the eager kernel (primitives/indexing.py) does.

   rows(out, indices, updates, n_rows, row_len) -> bool
     out: writable C-contiguous float32 or float64 of n_rows * row_len
     indices: C-contiguous int32 or int64, one per update row
     updates: C-contiguous, out's dtype, len(indices) * row_len
   False (nothing written) when a buffer does not fit: the caller then runs
   its NumPy kernel. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "_buffers.h"

/* One loop per (value, index) type: the row loop vectorises, the index
   loop keeps add.at's order. */
#define SCATTER_ROWS(NAME, T, I)                                              \
    static void NAME(T *out, const I *idx, const T *upd, Py_ssize_t count,    \
                     Py_ssize_t n_rows, Py_ssize_t row_len) {                 \
        for (Py_ssize_t i = 0; i < count; i++) {                              \
            Py_ssize_t r = (Py_ssize_t)idx[i];                                \
            if (r < 0) r += n_rows;                                           \
            if (r < 0 || r >= n_rows) continue;                               \
            T *dst = out + r * row_len;                                       \
            const T *src = upd + i * row_len;                                 \
            for (Py_ssize_t j = 0; j < row_len; j++) dst[j] += src[j];        \
        }                                                                     \
    }
SCATTER_ROWS(rows_f32_i32, float, int32_t)
SCATTER_ROWS(rows_f32_i64, float, int64_t)
SCATTER_ROWS(rows_f64_i32, double, int32_t)
SCATTER_ROWS(rows_f64_i64, double, int64_t)

static PyObject *rows(PyObject *self, PyObject *args) {
    PyObject *out_obj, *idx_obj, *upd_obj;
    Py_ssize_t n_rows, row_len;
    if (!PyArg_ParseTuple(args, "OOOnn", &out_obj, &idx_obj, &upd_obj, &n_rows,
                          &row_len))
        return NULL;
    if (n_rows < 0 || row_len < 0) {
        PyErr_SetString(PyExc_ValueError, "native scatter_add: negative size");
        return NULL;
    }
    PyObject *objs[3] = {out_obj, idx_obj, upd_obj};
    Py_buffer v[3]; /* out idx upd */
    int held = get_buffers(objs, v, 3, 1), ok = 0, i32 = 0;
    char kind = 0;
    Py_ssize_t count = 0;
    if (held == 3) {
        char code = format_code(&v[1]);
        kind = float_kind(&v[0]);
        i32 = v[1].itemsize == 4 && (code == 'i' || code == 'l');
        int ints = i32 || is_int64(&v[1]);
        count = ints ? v[1].len / v[1].itemsize : 0;
        ok = kind != 0 && ints && float_kind(&v[2]) == kind
             && v[0].len == n_rows * row_len * v[0].itemsize
             && v[2].len == count * row_len * v[2].itemsize;
    }
    if (ok) {
        void *out = v[0].buf;
        const void *idx = v[1].buf, *upd = v[2].buf;
        Py_BEGIN_ALLOW_THREADS
        if (kind == 'f' && i32) rows_f32_i32(out, idx, upd, count, n_rows, row_len);
        else if (kind == 'f') rows_f32_i64(out, idx, upd, count, n_rows, row_len);
        else if (i32) rows_f64_i32(out, idx, upd, count, n_rows, row_len);
        else rows_f64_i64(out, idx, upd, count, n_rows, row_len);
        Py_END_ALLOW_THREADS
    }
    release_buffers(v, held);
    return PyBool_FromLong(ok);
}

static PyMethodDef methods[] = {
    {"rows", rows, METH_VARARGS,
     "rows(out, indices, updates, n_rows, row_len) -> bool: out[indices[i]] += "
     "updates[i] in index order (np.add.at's bits); negative indices wrap once, "
     "out-of-range ones are dropped; False (nothing written) when a buffer "
     "does not fit."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_scatter_add",
    "Row scatter-add in np.add.at's order (see compiler/array_lowering.py).", -1,
    methods,
};

PyMODINIT_FUNC PyInit__scatter_add(void) { return PyModule_Create(&module); }
