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

static int format_is(const char *format, const char *kinds) {
    if (format == NULL) return 0;
    if (format[0] == '<' || format[0] == '=' || format[0] == '@') format++;
    if (format[0] == '\0' || format[1] != '\0') return 0;
    for (; *kinds; kinds++)
        if (format[0] == *kinds) return 1;
    return 0;
}

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
    Py_buffer out, idx, upd;
    if (!get_buffer(out_obj, &out, 1)) Py_RETURN_FALSE;
    if (!get_buffer(idx_obj, &idx, 0)) {
        PyBuffer_Release(&out);
        Py_RETURN_FALSE;
    }
    if (!get_buffer(upd_obj, &upd, 0)) {
        PyBuffer_Release(&idx);
        PyBuffer_Release(&out);
        Py_RETURN_FALSE;
    }
    PyObject *result = Py_False;
    int f32 = format_is(out.format, "f"), f64 = format_is(out.format, "d");
    int i32 = idx.itemsize == 4 && format_is(idx.format, "il");
    int i64 = idx.itemsize == 8 && format_is(idx.format, "lq");
    Py_ssize_t count = (i32 || i64) ? idx.len / idx.itemsize : -1;
    if ((f32 || f64) && count >= 0 && upd.itemsize == out.itemsize
        && format_is(upd.format, f32 ? "f" : "d")
        && out.len == n_rows * row_len * out.itemsize
        && upd.len == count * row_len * upd.itemsize) {
        Py_BEGIN_ALLOW_THREADS
        if (f32 && i32) rows_f32_i32(out.buf, idx.buf, upd.buf, count, n_rows, row_len);
        else if (f32) rows_f32_i64(out.buf, idx.buf, upd.buf, count, n_rows, row_len);
        else if (i32) rows_f64_i32(out.buf, idx.buf, upd.buf, count, n_rows, row_len);
        else rows_f64_i64(out.buf, idx.buf, upd.buf, count, n_rows, row_len);
        Py_END_ALLOW_THREADS
        result = Py_True;
    }
    PyBuffer_Release(&upd);
    PyBuffer_Release(&idx);
    PyBuffer_Release(&out);
    Py_INCREF(result);
    return result;
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
