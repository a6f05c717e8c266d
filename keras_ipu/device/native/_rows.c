/* Sums and maxima along the last axis, row by row, with NumPy's bits.

   np.add.reduce over the last axis of a C-contiguous array calls its inner
   loop once per row, and that loop sums the row pairwise (NumPy's
   pairwise_sum: 8 accumulators over blocks of up to 128 elements, halves
   above that) from the identity +0.0. For the short rows of attention's
   scores and a layer norm's statistics (64 elements: the transformer's
   softmax sums and 11 layer-norm sums per step) the call per row costs
   more than the adds: 128x4x64x64 -> 128x4x64 took 1.2 ms, 128x64x64 ->
   128x64 0.3 ms at one thread. Here the same algorithm runs on every row
   in one call, without the interpreter lock, so the bits are NumPy's. The
   call runs whole on the caller's thread (last_axis_reductions.py says
   why).

   sum_last(x, out, n) -> bool
     x: C-contiguous float32 or float64, rows * n elements (n >= 1)
     out: writable C-contiguous, x's dtype, rows elements
   False (nothing written) when a buffer does not fit: the caller then runs
   NumPy's reduction.

   max_last(x, out, n) -> int: out[r] = the largest element of row r, for
   the same buffers; the number of rows whose maximum it leaves to NumPy
   (-1: a buffer does not fit). A maximum is one value whatever the order
   of the comparisons, except where the row holds a NaN (NumPy returns one
   of its NaNs) or its maximum is a zero (+0.0 and -0.0 compare equal: the
   order picks the sign): such rows are counted, and the caller runs
   NumPy's reduction. The softmax's row maxima (128x4x64x64 -> 128x4x64)
   took 1.9 ms in NumPy. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "_buffers.h"

/* NumPy's numpy/_core/src/umath/loops_utils.h.src pairwise_sum, for
   contiguous rows: the same adds in the same order (no -ffast-math, no FMA:
   hatch_build's flags), so the same roundings. */
#define PW_BLOCKSIZE 128

#define PAIRWISE_SUM(NAME, T)                                                       \
    static T NAME(const T *a, Py_ssize_t n) {                                       \
        if (n < 8) {                                                                \
            T res = 0.;                                                             \
            for (Py_ssize_t i = 0; i < n; i++) res += a[i];                         \
            return res;                                                             \
        }                                                                           \
        if (n <= PW_BLOCKSIZE) {                                                    \
            T r[8], res;                                                            \
            Py_ssize_t i;                                                           \
            for (int j = 0; j < 8; j++) r[j] = a[j];                                \
            for (i = 8; i < n - (n % 8); i += 8)                                    \
                for (int j = 0; j < 8; j++) r[j] += a[i + j];                       \
            res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7])); \
            for (; i < n; i++) res += a[i];                                         \
            return res;                                                             \
        }                                                                           \
        Py_ssize_t n2 = n / 2;                                                      \
        n2 -= n2 % 8;                                                               \
        return NAME(a, n2) + NAME(a + n2, n - n2);                                  \
    }
PAIRWISE_SUM(pairwise_f32, float)
PAIRWISE_SUM(pairwise_f64, double)

/* The reduction's result for a row: its identity (+0.0) plus the row's
   pairwise sum, as NumPy's add loop does for a reduction (a row of -0.0
   sums to +0.0). */
#define SUM_ROWS(NAME, T, PAIRWISE)                                            \
    static void NAME(T *out, const T *x, Py_ssize_t rows, Py_ssize_t n) {      \
        for (Py_ssize_t r = 0; r < rows; r++) out[r] = (T)0 + PAIRWISE(x + r * n, n); \
    }
SUM_ROWS(sum_rows_f32, float, pairwise_f32)
SUM_ROWS(sum_rows_f64, double, pairwise_f64)

/* 8 running maxima over the row (as the sum's accumulators: vector
   registers), then theirs. v - v is 0 for a finite v and NaN for a NaN or
   an infinity: their sums z mark the rows to look at again (a NaN, a
   maximum of zero) without a branch in the loop. */
#define MAX_ROWS(NAME, T)                                                         \
    static Py_ssize_t NAME(T *out, const T *x, Py_ssize_t rows, Py_ssize_t n) {   \
        Py_ssize_t undecided = 0;                                                 \
        for (Py_ssize_t row = 0; row < rows; row++) {                             \
            const T *a = x + row * n;                                             \
            T m[8], z[8];                                                         \
            Py_ssize_t i = 0;                                                     \
            for (int j = 0; j < 8; j++) {                                         \
                m[j] = a[0];                                                      \
                z[j] = 0;                                                         \
            }                                                                     \
            for (; i + 8 <= n; i += 8)                                            \
                for (int j = 0; j < 8; j++) {                                     \
                    T v = a[i + j];                                               \
                    z[j] += v - v;                                                \
                    m[j] = v > m[j] ? v : m[j];                                   \
                }                                                                 \
            for (; i < n; i++) {                                                  \
                T v = a[i];                                                       \
                z[0] += v - v;                                                    \
                m[0] = v > m[0] ? v : m[0];                                       \
            }                                                                     \
            T best = m[0], marks = z[0];                                          \
            for (int j = 1; j < 8; j++) {                                         \
                best = m[j] > best ? m[j] : best;                                 \
                marks += z[j];                                                    \
            }                                                                     \
            if (marks != 0 || best == 0) {                                        \
                /* An infinity only: its maximum is decided. */                   \
                int nan = 0;                                                      \
                for (Py_ssize_t k = 0; k < n; k++) nan |= a[k] != a[k];           \
                undecided += nan || best == 0;                                    \
            }                                                                     \
            out[row] = best;                                                      \
        }                                                                         \
        return undecided;                                                         \
    }
MAX_ROWS(max_rows_f32, float)
MAX_ROWS(max_rows_f64, double)

/* The operands of both calls: x of rows x n and out of rows, one float
   kind; 0 (no buffer held) when one does not fit. */
typedef struct {
    Py_buffer x, out;
    Py_ssize_t rows, n;
    char kind;
} row_operands;

static int take_rows(PyObject *args, row_operands *o) {
    PyObject *x_obj, *out_obj;
    if (!PyArg_ParseTuple(args, "OOn", &x_obj, &out_obj, &o->n)) return -1;
    if (o->n < 1 || !get_buffer(x_obj, &o->x, 0)) return 0;
    if (!get_buffer(out_obj, &o->out, 1)) {
        PyBuffer_Release(&o->x);
        return 0;
    }
    o->kind = float_kind(&o->x);
    Py_ssize_t size = o->x.itemsize ? o->x.len / o->x.itemsize : 0;
    o->rows = size / o->n;
    if (o->kind && float_kind(&o->out) == o->kind && o->rows * o->n == size
        && o->out.len == o->rows * o->out.itemsize)
        return 1;
    PyBuffer_Release(&o->out);
    PyBuffer_Release(&o->x);
    return 0;
}

static PyObject *sum_last(PyObject *self, PyObject *args) {
    row_operands o;
    int taken = take_rows(args, &o);
    if (taken < 0) return NULL;
    if (!taken) Py_RETURN_FALSE;
    Py_BEGIN_ALLOW_THREADS
    if (o.kind == 'f') sum_rows_f32(o.out.buf, o.x.buf, o.rows, o.n);
    else sum_rows_f64(o.out.buf, o.x.buf, o.rows, o.n);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&o.out);
    PyBuffer_Release(&o.x);
    Py_RETURN_TRUE;
}

static PyObject *max_last(PyObject *self, PyObject *args) {
    row_operands o;
    Py_ssize_t undecided;
    int taken = take_rows(args, &o);
    if (taken < 0) return NULL;
    if (!taken) return PyLong_FromSsize_t(-1);
    Py_BEGIN_ALLOW_THREADS
    if (o.kind == 'f') undecided = max_rows_f32(o.out.buf, o.x.buf, o.rows, o.n);
    else undecided = max_rows_f64(o.out.buf, o.x.buf, o.rows, o.n);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&o.out);
    PyBuffer_Release(&o.x);
    return PyLong_FromSsize_t(undecided);
}

static PyMethodDef methods[] = {
    {"sum_last", sum_last, METH_VARARGS,
     "sum_last(x, out, n) -> bool: out[r] = the sum of x's row r of n elements, "
     "NumPy's pairwise order and bits (np.add.reduce over the last axis); "
     "False (nothing written) when a buffer does not fit."},
    {"max_last", max_last, METH_VARARGS,
     "max_last(x, out, n) -> int: out[r] = the largest element of x's row r of n "
     "elements; returns the number of rows left to NumPy (a NaN, or a maximum of "
     "zero whose sign the order picks), -1 when a buffer does not fit."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_rows",
    "Reductions along the last axis in one call (see native/last_axis_reductions.py).", -1, methods,
};

PyMODINIT_FUNC PyInit__rows(void) { return PyModule_Create(&module); }
