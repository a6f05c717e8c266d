/* Sums and maxima along the last axis, row by row, with NumPy's bits.

   np.add.reduce over the last axis of a C-contiguous array calls its inner
   loop once per row, and that loop sums the row pairwise (NumPy's
   pairwise_sum: 8 accumulators over blocks of up to 128 elements, halves
   above that) from the identity +0.0. For the short rows of attention's
   scores and a layer norm's statistics (64 elements: the transformer's
   softmax sums and 11 layer-norm sums per step) the call per row costs
   more than the adds: 128x4x64x64 -> 128x4x64 took 1.2 ms, 128x64x64 ->
   128x64 0.3 ms at one thread. Here the same algorithm runs on every row
   in one call, without the interpreter lock, so the bits are NumPy's.

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
   took 1.9 ms in NumPy.

   Both take `threads` and `rows_per_task` after n: rows in tasks of that
   many on the C pool (_task_pool.h), each row still one call of the same
   loop, so the bits are the same at any split; they then return (caller
   tasks, its own seconds, its wait) after the result (sum_last: the
   triple; max_last: (undecided, caller tasks, own, wait)). Which ones
   split is last_axis_reductions.py's choice. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdatomic.h>

#include "_buffers.h"
#include "_module.h"
#include "_task_pool.h"

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
   maximum of zero) without a branch in the loop. LANES runs the groups of
   8 elements and returns where they end: lane j takes elements i + j. */
#define LANES_SCALAR(NAME, T)                                                     \
    static Py_ssize_t NAME(const T *a, Py_ssize_t n, T *m, T *z) {               \
        Py_ssize_t i = 0;                                                         \
        for (; i + 8 <= n; i += 8)                                                \
            for (int j = 0; j < 8; j++) {                                         \
                T v = a[i + j];                                                   \
                z[j] += v - v;                                                    \
                m[j] = v > m[j] ? v : m[j];                                       \
            }                                                                     \
        return i;                                                                 \
    }

#if defined(__x86_64__) || defined(_M_X64)
/* GCC leaves the scalar loop scalar here (maxss, 1.1 ms for the softmax's
   8 MB of scores, where the sum reads them in 0.2): the same lanes in SSE2
   registers. MAXPS(v, m) is v > m ? v : m, lane by lane, NaN and zeros
   included: the same values. */
#include <emmintrin.h>
static Py_ssize_t lanes_f32(const float *a, Py_ssize_t n, float *m, float *z) {
    __m128 m0 = _mm_loadu_ps(m), m1 = _mm_loadu_ps(m + 4);
    __m128 z0 = _mm_loadu_ps(z), z1 = _mm_loadu_ps(z + 4);
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128 v0 = _mm_loadu_ps(a + i), v1 = _mm_loadu_ps(a + i + 4);
        z0 = _mm_add_ps(z0, _mm_sub_ps(v0, v0));
        z1 = _mm_add_ps(z1, _mm_sub_ps(v1, v1));
        m0 = _mm_max_ps(v0, m0);
        m1 = _mm_max_ps(v1, m1);
    }
    _mm_storeu_ps(m, m0);
    _mm_storeu_ps(m + 4, m1);
    _mm_storeu_ps(z, z0);
    _mm_storeu_ps(z + 4, z1);
    return i;
}

static Py_ssize_t lanes_f64(const double *a, Py_ssize_t n, double *m, double *z) {
    __m128d m0 = _mm_loadu_pd(m), m1 = _mm_loadu_pd(m + 2), m2 = _mm_loadu_pd(m + 4),
            m3 = _mm_loadu_pd(m + 6);
    __m128d z0 = _mm_loadu_pd(z), z1 = _mm_loadu_pd(z + 2), z2 = _mm_loadu_pd(z + 4),
            z3 = _mm_loadu_pd(z + 6);
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128d v0 = _mm_loadu_pd(a + i), v1 = _mm_loadu_pd(a + i + 2),
                v2 = _mm_loadu_pd(a + i + 4), v3 = _mm_loadu_pd(a + i + 6);
        z0 = _mm_add_pd(z0, _mm_sub_pd(v0, v0));
        z1 = _mm_add_pd(z1, _mm_sub_pd(v1, v1));
        z2 = _mm_add_pd(z2, _mm_sub_pd(v2, v2));
        z3 = _mm_add_pd(z3, _mm_sub_pd(v3, v3));
        m0 = _mm_max_pd(v0, m0);
        m1 = _mm_max_pd(v1, m1);
        m2 = _mm_max_pd(v2, m2);
        m3 = _mm_max_pd(v3, m3);
    }
    _mm_storeu_pd(m, m0);
    _mm_storeu_pd(m + 2, m1);
    _mm_storeu_pd(m + 4, m2);
    _mm_storeu_pd(m + 6, m3);
    _mm_storeu_pd(z, z0);
    _mm_storeu_pd(z + 2, z1);
    _mm_storeu_pd(z + 4, z2);
    _mm_storeu_pd(z + 6, z3);
    return i;
}
#else
LANES_SCALAR(lanes_f32, float)
LANES_SCALAR(lanes_f64, double)
#endif

#define MAX_ROWS(NAME, T, LANES)                                                  \
    static Py_ssize_t NAME(T *out, const T *x, Py_ssize_t rows, Py_ssize_t n) {   \
        Py_ssize_t undecided = 0;                                                 \
        for (Py_ssize_t row = 0; row < rows; row++) {                             \
            const T *a = x + row * n;                                             \
            T m[8], z[8];                                                         \
            for (int j = 0; j < 8; j++) {                                         \
                m[j] = a[0];                                                      \
                z[j] = 0;                                                         \
            }                                                                     \
            Py_ssize_t i = LANES(a, n, m, z);                                     \
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
MAX_ROWS(max_rows_f32, float, lanes_f32)
MAX_ROWS(max_rows_f64, double, lanes_f64)

/* The operands of both calls: x of rows x n and out of rows, one float
   kind, and the split: (threads, rows per task) where the call passed
   them, else (1, all rows; 1 where there are none: the task count
   divides by it). */
typedef struct {
    Py_buffer v[2]; /* x, out */
    Py_ssize_t rows, n, per_task;
    int threads, split;
    char kind;
} row_operands;

/* 1: the buffers fit (held); 0: one does not (none held); -1: an error
   is set (bad arguments). */
static int take_rows(PyObject *args, row_operands *o) {
    PyObject *x_obj, *out_obj;
    o->threads = 1;
    o->per_task = 0;
    o->split = PyTuple_GET_SIZE(args) > 3;
    if (!PyArg_ParseTuple(args, o->split ? "OOnin" : "OOn", &x_obj, &out_obj, &o->n,
                          &o->threads, &o->per_task))
        return -1;
    if (o->split && (o->threads < 1 || o->per_task < 1)) {
        PyErr_SetString(PyExc_ValueError, "threads and rows_per_task must be positive");
        return -1;
    }
    if (o->n < 1) return 0;
    PyObject *objs[2] = {x_obj, out_obj};
    int held = get_buffers(objs, o->v, 2, 2);
    if (held == 2) {
        o->kind = float_kind(&o->v[0]);
        Py_ssize_t size = o->kind ? o->v[0].len / o->v[0].itemsize : 0;
        o->rows = size / o->n;
        if (o->kind && float_kind(&o->v[1]) == o->kind && o->rows * o->n == size
            && o->v[1].len == o->rows * o->v[1].itemsize) {
            if (!o->split) o->per_task = o->rows > 0 ? o->rows : 1;
            return 1;
        }
    }
    release_buffers(o->v, held);
    return 0;
}

/* Rows [lo, hi) of one call, one task each: per_task rows. */
typedef struct {
    const row_operands *o;
    int max;
    atomic_llong undecided;
} row_task_t;

static void row_task(void *arg, int64_t i) {
    row_task_t *t = (row_task_t *)arg;
    const row_operands *o = t->o;
    Py_ssize_t lo = i * o->per_task, rows = o->rows - lo < o->per_task ? o->rows - lo : o->per_task;
    Py_ssize_t sz = o->v[0].itemsize;
    char *out = (char *)o->v[1].buf + lo * sz;
    const char *x = (const char *)o->v[0].buf + lo * o->n * sz;
    if (!t->max) {
        if (o->kind == 'f') sum_rows_f32((float *)out, (const float *)x, rows, o->n);
        else sum_rows_f64((double *)out, (const double *)x, rows, o->n);
        return;
    }
    Py_ssize_t undecided = o->kind == 'f'
                               ? max_rows_f32((float *)out, (const float *)x, rows, o->n)
                               : max_rows_f64((double *)out, (const double *)x, rows, o->n);
    if (undecided) atomic_fetch_add(&t->undecided, (long long)undecided);
}

static PyObject *reduce_rows(PyObject *args, int max) {
    row_operands o;
    int taken = take_rows(args, &o);
    if (taken < 0) return NULL;
    if (!taken) {
        if (max) return PyLong_FromSsize_t(-1);
        Py_RETURN_FALSE;
    }
    row_task_t t = {&o, max, 0};
    int64_t ran = 0, own = 0, wait = 0;
    run_tasks(row_task, &t, (o.rows + o.per_task - 1) / o.per_task, o.threads, &ran, &own,
              &wait);
    release_buffers(o.v, 2);
    long long undecided = atomic_load(&t.undecided);
    if (o.split) {
        if (!max) return split_stats(ran, own, wait);
        PyObject *stats = split_stats_after(1, ran, own, wait), *first;
        if (stats == NULL) return NULL;
        if ((first = PyLong_FromLongLong(undecided)) == NULL) {
            Py_DECREF(stats);
            return NULL;
        }
        PyTuple_SET_ITEM(stats, 0, first);
        return stats;
    }
    if (max) return PyLong_FromLongLong(undecided);
    Py_RETURN_TRUE;
}

static PyObject *sum_last(PyObject *self, PyObject *args) { return reduce_rows(args, 0); }

static PyObject *max_last(PyObject *self, PyObject *args) { return reduce_rows(args, 1); }

static PyMethodDef methods[] = {
    {"sum_last", sum_last, METH_VARARGS,
     "sum_last(x, out, n[, threads, rows_per_task]) -> bool: out[r] = the sum of "
     "x's row r of n elements, NumPy's pairwise order and bits (np.add.reduce over "
     "the last axis); False (nothing written) when a buffer does not fit. With "
     "threads: rows in tasks on the C pool, returning (caller_tasks, own_s, wait_s)."},
    {"max_last", max_last, METH_VARARGS,
     "max_last(x, out, n[, threads, rows_per_task]) -> int: out[r] = the largest "
     "element of x's row r of n elements; returns the number of rows left to NumPy "
     "(a NaN, or a maximum of zero whose sign the order picks), -1 when a buffer "
     "does not fit. With threads: rows in tasks on the C pool, returning "
     "(undecided, caller_tasks, own_s, wait_s)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_rows",
    "Reductions along the last axis in one call (see native/last_axis_reductions.py).", -1, methods,
};

/* SPLITS: the split arguments; a build before them (an editable install
   not rebuilt) lacks it, and last_axis_reductions.py keeps its calls
   whole. */
PyMODINIT_FUNC PyInit__rows(void) { return module_with_constants(&module, "SPLITS", 1, NULL); }
