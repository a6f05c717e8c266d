/* A max or min pool's gradient over windows that tile the operand, in one
   pass (primitives/pooling.py: select_and_scatter_add).

   Where each window covers its own cells (window = stride, no dilation,
   no padding: a 2x2 pool of stride 2), each cell of the result takes its
   window's cotangent or zero: the window's first tap, in row-major tap
   order, equal to the window's result y takes it (XLA's select-and-scatter
   tie rule), no tap when y is NaN (NaN equals nothing), +0.0 elsewhere.
   The NumPy kernel makes one pass over the operand per tap, with a mask,
   a running "taken" mask and a bitwise select each (16 ms of the
   benchmark CNN's first pool gradient, 128x32x32x32, at one thread);
   this one reads x, y and g once and writes each result cell once,
   moving g's bits (a -0.0 stays -0.0), so both give the same bits.

   select_tiled(g, x, y, out, inner, lead, steps, taps[, threads, rows])
     x, out: C-contiguous, one dtype (float32 or float64), the operand's
       shape; out is written only at the windows' cells (the caller zeroes
       a remainder the windows do not cover).
     y, g: C-contiguous, x's dtype, the window results' shape.
     inner: the length of the run of trailing axes the window does not
       span (window 1: the channels of a channels-last pool), a row of y.
     lead: int64, y's shape over the axes before that run (its rows'
       multi-index); steps: int64, per lead axis, x's element offset per
       step of the window (window x x's element stride).
     taps: int64, x's element offset of each tap in row-major tap order.
     threads, rows: split y's rows in tasks of `rows` rows on up to
       `threads` threads of the C pool (_task_pool.h); each cell is
       computed as in one pass, so the bits do not depend on the split.
       With threads > 1 it returns the pool's (caller_tasks, own_s,
       wait_s) instead of True.
   False (nothing written) where a buffer does not fit: the caller then
   runs its NumPy kernel.

   reduce_max(x, out, inner, lead, steps, taps, is_min[, threads, rows])
     The window results themselves (reduce_window max or min) for windows
     with no padding, overlapping or not, in one pass: out (y's shape) is
     each window's largest (smallest) tap, NaN where one is NaN, as
     NumPy's max (min); of equal taps (+0.0 and -0.0) the first. The same
     geometry arguments, y in place of g; x's taps read in place where
     the NumPy kernel's reduction over a 2N-d window view runs its inner
     loop a few elements at a time. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "_buffers.h"
#include "_module.h"
#include "_task_pool.h"

#define MAX_RANK 32
/* Channels per pass over a window's taps: the running "taken" mask stays
   in registers / L1. */
#define CHUNK 256

typedef struct {
    const char *g, *x, *y;
    char *out;
    int64_t inner, rank, rows, task_rows, n_taps;
    const int64_t *lead, *steps, *taps;
    int f64, is_min;
} tiled_t;

/* The multi-index of y's row `r` over the lead axes. */
static void first_row(const tiled_t *s, int64_t r, int64_t *idx) {
    for (int64_t d = s->rank - 1; d >= 0; d--) {
        idx[d] = r % s->lead[d];
        r /= s->lead[d];
    }
}

/* x's offset of the row's window (its first tap's cells). */
static inline int64_t row_base(const tiled_t *s, const int64_t *idx) {
    int64_t base = 0;
    for (int64_t d = 0; d < s->rank; d++) base += idx[d] * s->steps[d];
    return base;
}

static inline void next_row(const tiled_t *s, int64_t *idx) {
    for (int64_t d = s->rank - 1; d >= 0; d--) {
        if (++idx[d] < s->lead[d]) break;
        idx[d] = 0;
    }
}

/* Rows [lo, hi) of y. */
#define SELECT_ROWS(NAME, F, U)                                                      \
    static void NAME(const tiled_t *s, int64_t lo, int64_t hi) {                      \
        const F *x = (const F *)s->x, *y = (const F *)s->y;                          \
        const U *g = (const U *)s->g;                                                \
        U *out = (U *)s->out;                                                        \
        int64_t idx[MAX_RANK];                                                       \
        first_row(s, lo, idx);                                                       \
        U taken[CHUNK];                                                              \
        for (int64_t r = lo; r < hi; r++) {                                          \
            int64_t base = row_base(s, idx);                                         \
            const F *yr = y + r * s->inner;                                          \
            const U *gr = g + r * s->inner;                                          \
            for (int64_t c0 = 0; c0 < s->inner; c0 += CHUNK) {                       \
                int64_t n = s->inner - c0 < CHUNK ? s->inner - c0 : CHUNK;           \
                memset(taken, 0, (size_t)n * sizeof(U));                             \
                for (int64_t t = 0; t < s->n_taps; t++) {                            \
                    const F *xp = x + base + s->taps[t] + c0;                        \
                    U *op = out + base + s->taps[t] + c0;                            \
                    for (int64_t j = 0; j < n; j++) {                                \
                        U hit = ((U)0 - (U)(xp[j] == yr[c0 + j])) & ~taken[j];      \
                        op[j] = gr[c0 + j] & hit;                                    \
                        taken[j] |= hit;                                             \
                    }                                                                \
                }                                                                    \
            }                                                                        \
            next_row(s, idx);                                                        \
        }                                                                            \
    }
SELECT_ROWS(select_rows_f32, float, uint32_t)
SELECT_ROWS(select_rows_f64, double, uint64_t)

/* Rows [lo, hi) of the window results. */
#define REDUCE_ROWS(NAME, F)                                                         \
    static void NAME(const tiled_t *s, int64_t lo, int64_t hi) {                      \
        const F *x = (const F *)s->x;                                                \
        F *y = (F *)s->out;                                                          \
        int64_t idx[MAX_RANK];                                                       \
        first_row(s, lo, idx);                                                       \
        for (int64_t r = lo; r < hi; r++) {                                          \
            int64_t base = row_base(s, idx);                                         \
            F *yr = y + r * s->inner;                                                \
            memcpy(yr, x + base + s->taps[0], (size_t)s->inner * sizeof(F));         \
            for (int64_t t = 1; t < s->n_taps; t++) {                                \
                const F *xp = x + base + s->taps[t];                                 \
                if (s->is_min)                                                       \
                    for (int64_t j = 0; j < s->inner; j++) {                         \
                        F v = xp[j], m = yr[j];                                      \
                        yr[j] = (v < m || v != v) && m == m ? v : m;                 \
                    }                                                                \
                else                                                                 \
                    for (int64_t j = 0; j < s->inner; j++) {                         \
                        F v = xp[j], m = yr[j];                                      \
                        yr[j] = (v > m || v != v) && m == m ? v : m;                 \
                    }                                                                \
            }                                                                        \
            next_row(s, idx);                                                        \
        }                                                                            \
    }
REDUCE_ROWS(reduce_rows_f32, float)
REDUCE_ROWS(reduce_rows_f64, double)

static void reduce_task(void *arg, int64_t i) {
    const tiled_t *s = (const tiled_t *)arg;
    int64_t lo = i * s->task_rows;
    int64_t hi = lo + s->task_rows < s->rows ? lo + s->task_rows : s->rows;
    if (s->f64) reduce_rows_f64(s, lo, hi);
    else reduce_rows_f32(s, lo, hi);
}

static void select_task(void *arg, int64_t i) {
    const tiled_t *s = (const tiled_t *)arg;
    int64_t lo = i * s->task_rows;
    int64_t hi = lo + s->task_rows < s->rows ? lo + s->task_rows : s->rows;
    if (s->f64) select_rows_f64(s, lo, hi);
    else select_rows_f32(s, lo, hi);
}

/* Whether x (v[0]) and the int64 geometry (v[1..3]: lead, steps, taps)
   fit (module doc): every cell read or written lies inside x. Fills s's
   geometry and dtype. */
static int bind_geometry(tiled_t *s, const Py_buffer *v, Py_ssize_t inner) {
    char kind = float_kind(&v[0]);
    int64_t rank = v[1].len / 8, n_taps = v[3].len / 8;
    if (kind == 0 || inner < 1 || rank > MAX_RANK || v[2].len != v[1].len || n_taps < 1)
        return 0;
    for (int k = 1; k < 4; k++)
        if (!is_int64(&v[k])) return 0;
    const int64_t *lead = (const int64_t *)v[1].buf, *steps = (const int64_t *)v[2].buf;
    const int64_t *taps = (const int64_t *)v[3].buf;
    int64_t rows = 1, last = inner - 1, tap_max = 0;
    for (int64_t d = 0; d < rank; d++) {
        if (lead[d] < 1 || steps[d] < 0) return 0;
        rows *= lead[d];
        last += (lead[d] - 1) * steps[d];
    }
    for (int64_t t = 0; t < n_taps; t++) {
        if (taps[t] < 0) return 0;
        if (taps[t] > tap_max) tap_max = taps[t];
    }
    if ((last + tap_max + 1) * v[0].itemsize > v[0].len) return 0;
    memset(s, 0, sizeof(*s));
    s->x = v[0].buf;
    s->inner = inner;
    s->rank = rank;
    s->rows = s->task_rows = rows;
    s->n_taps = n_taps;
    s->lead = lead;
    s->steps = steps;
    s->taps = taps;
    s->f64 = kind == 'd';
    return 1;
}

/* Whether `view` holds rows x inner values of x's dtype. */
static int holds_rows(const tiled_t *s, const Py_buffer *view, const Py_buffer *x) {
    return float_kind(view) == float_kind(x) && view->len == s->rows * s->inner * x->itemsize;
}

/* Runs fn over s's rows, in tasks of `task_rows` rows on up to `threads`
   threads of the C pool (or in order on the caller), without the GIL:
   True, or the pool's (caller_tasks, own_s, wait_s) for threads > 1. */
static PyObject *run_rows(task_fn fn, tiled_t *s, int threads, Py_ssize_t task_rows) {
    if (threads > 1) s->task_rows = task_rows;
    int64_t ran = 0, own = 0, wait = 0;
    run_tasks(fn, s, (s->rows + s->task_rows - 1) / s->task_rows, threads, &ran, &own, &wait);
    return split_result(threads, ran, own, wait);
}

/* Binds a kernel's buffers past x's geometry (v[4 ..]) to s: whether they
   fit. */
typedef int (*bind_fn)(tiled_t *s, const Py_buffer *v);

static int bind_select(tiled_t *s, const Py_buffer *v) { /* g y out */
    if (!holds_rows(s, &v[4], &v[0]) || !holds_rows(s, &v[5], &v[0])
        || float_kind(&v[6]) != float_kind(&v[0]) || v[6].len != v[0].len)
        return 0;
    s->g = v[4].buf;
    s->y = v[5].buf;
    s->out = v[6].buf;
    return 1;
}

static int bind_reduce(tiled_t *s, const Py_buffer *v) { /* out */
    if (!holds_rows(s, &v[4], &v[0])) return 0;
    s->out = v[4].buf;
    return 1;
}

#define MAX_OPERANDS 7

/* Both entries past their arguments: the buffers of objs[0 .. n) (x, lead,
   steps, taps, then the kernel's own; the last written), x's geometry and
   `bind`'s buffers bound, fn over the rows (run_rows); False where a
   buffer does not fit. */
static PyObject *run_bound(PyObject **objs, int n, Py_ssize_t inner, bind_fn bind, int is_min,
                           task_fn fn, int threads, Py_ssize_t task_rows) {
    Py_buffer v[MAX_OPERANDS];
    int held = get_buffers(objs, v, n, 1u << (n - 1));
    tiled_t s;
    PyObject *result = NULL;
    if (held == n && bind_geometry(&s, v, inner) && bind(&s, v)) {
        s.is_min = is_min;
        result = run_rows(fn, &s, threads, task_rows);
    }
    return released(v, held, result);
}

#define SPLIT_NEEDS_ROWS "_pooling: a split needs rows per task"

static PyObject *select_tiled(PyObject *self, PyObject *args) {
    PyObject *objs[MAX_OPERANDS]; /* x lead steps taps g y out */
    Py_ssize_t inner, task_rows = 0;
    int threads = 1;
    if (!PyArg_ParseTuple(args, "OOOOnOOO|in", &objs[4], &objs[0], &objs[5], &objs[6],
                          &inner, &objs[1], &objs[2], &objs[3], &threads, &task_rows)
        || !split_size_ok(threads, task_rows, SPLIT_NEEDS_ROWS))
        return NULL;
    return run_bound(objs, 7, inner, bind_select, 0, select_task, threads, task_rows);
}

static PyObject *reduce_max(PyObject *self, PyObject *args) {
    PyObject *objs[5]; /* x lead steps taps out */
    Py_ssize_t inner, task_rows = 0;
    int is_min, threads = 1;
    if (!PyArg_ParseTuple(args, "OOnOOOp|in", &objs[0], &objs[4], &inner, &objs[1], &objs[2],
                          &objs[3], &is_min, &threads, &task_rows)
        || !split_size_ok(threads, task_rows, SPLIT_NEEDS_ROWS))
        return NULL;
    return run_bound(objs, 5, inner, bind_reduce, is_min, reduce_task, threads, task_rows);
}

static PyMethodDef methods[] = {
    {"select_tiled", select_tiled, METH_VARARGS,
     "select_tiled(g, x, y, out, inner, lead, steps, taps[, threads, rows]) -> bool: a max "
     "or min pool's gradient over windows that tile x, in one pass (each window's first tap "
     "equal to y takes g's bits, the others +0.0); False (nothing written) when a buffer "
     "does not fit. threads > 1: tasks of `rows` rows of y on the C pool, returning "
     "(caller_tasks, own_s, wait_s)."},
    {"reduce_max", reduce_max, METH_VARARGS,
     "reduce_max(x, out, inner, lead, steps, taps, is_min[, threads, rows]) -> bool: "
     "reduce_window max (min) of windows with no padding, in one pass (NaN wins; of equal "
     "taps the first); False (nothing written) when a buffer does not fit."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_pooling",
    "Pooling kernels in one pass (see device/primitives/pooling.py).", -1, methods,
};

/* TASK_POOL_VERSION: the pool this module was built against (product_pool
   checks it, as _elementwise's). */
PyMODINIT_FUNC PyInit__pooling(void) {
    return module_with_constants(&module, "TASK_POOL_VERSION", TASK_POOL_VERSION, NULL);
}
