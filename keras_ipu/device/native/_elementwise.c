/* One pass over memory for a fused elementwise chain.

   NumPy runs a fused chain one ufunc at a time: each step reads and writes
   whole arrays, so a four-step optimizer update streams its megabytes
   through the caches about nine times. Here the chain runs block by block
   (a block is at most a few thousand elements, its temporaries stay in L1/L2):
   every operand is read once and every result written once.

   The program is built by keras_ipu/device/compiler/native_fusion.py, which
   decides what qualifies (float32 and bool operands, operations whose
   IEEE result is exact, so this kernel and NumPy's give the same bits).
   run() returns False without touching anything when a buffer does not
   match the program (wrong size or type, an output or a repeated operand
   not C-contiguous, a full-size operand neither C-contiguous nor 2-d rows
   apart): the caller then runs its NumPy kernel. A full-size operand whose
   rows lie apart (a slice's view of a wider array, such as an LSTM cell's
   gates cut from one product) is read in place, each block's rows
   gathered into its register. An output may lie rows apart too (a column
   block of a wider array: the LSTM's backward gate gradients written
   straight into their concatenate's columns, compiler/stack_slots.py):
   each block's result is scattered to its rows at the end of the block.
   A result goes straight into its output array when
   nothing reads that array later in the block (a fresh array, or a donated
   operand past its last read); otherwise it is copied there at the end of
   the block, after every read.

   run(code, n, L, B, inputs, outputs)
     code: int32 words
       n_in n_regs n_ops n_out
       n_in  x (mode dtype)        inputs are registers 0 .. n_in-1
       n_regs x dtype
       n_ops x (opcode dst a b c)
       n_out x (reg mode)       mode 1 (direct): the step writes straight
                                into the output (nothing reads that buffer
                                after it); 0: copied there at the end of
                                each block; 2 (stream): copied there with
                                non-temporal stores (below)
     n: elements of the result; L: the inner length that ROW/COL operands
     repeat along (1 if none); B: block size, a multiple of L.
     loops (optional): a tuple of NumPy's own float32 strided loops (the
     capsules of ufunc._get_strided_loop), for the opcodes below that call
     them (NumPy's transcendentals: see call_loop).
     threads, task (optional): split [lo, hi) into ranges of `task`
     elements (a multiple of B) run on up to `threads` threads of the C
     pool (_task_pool.h); each element is computed as in one pass, so the
     bits do not depend on the split. With threads > 1 it returns the
     pool's (caller_tasks, own_s, wait_s) instead of True. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>

#include "_buffers.h"
#include "_module.h"
#include "_scratch.h"
#include "_task_pool.h"

enum { T_F32 = 0, T_BOOL = 1 };
/* FULL: n elements; SCALAR: one; ROW: L elements, element i is row[i % L];
   COL: n / L elements, element i is col[i / L]. */
enum { M_FULL = 0, M_SCALAR = 1, M_ROW = 2, M_COL = 3 };
enum {
    OP_ADD = 1, OP_SUB, OP_MUL, OP_DIV, OP_MAX, OP_MIN,
    OP_NEG, OP_ABS, OP_SQRT, OP_SQUARE, OP_RECIP, OP_FLOOR, OP_CEIL,
    OP_GT, OP_GE, OP_LT, OP_LE, OP_EQ, OP_NE,
    OP_AND, OP_OR, OP_XOR, OP_NOT,
    OP_SELECT_F, OP_SELECT_B, OP_F2B, OP_B2F,
    OP_LAST
};

/* Opcodes calling NumPy's own float32 loop number k of `loops`: a unary
   ufunc (exp, log, tanh, ...) is OP_LOOP + k; the logistic function built
   on the exp loop k (primitives/elementwise.py's logistic, step by step)
   is OP_LOGISTIC + k. */
enum { OP_LOOP = 64, OP_LOGISTIC = 128, MAX_LOOPS = 64 };

#define MAX_REGS 512

enum { OUT_COPY = 0, OUT_DIRECT = 1, OUT_STREAM = 2 };

/* A fresh output that nothing reads soon (an array the program returns,
   such as a training step's new weights) is written with non-temporal
   stores: an ordinary store first reads each cache line it overwrites from
   memory (read for ownership), so writing a large array out of place costs
   about half as much memory traffic again as updating it in place; these
   stores skip that read. The values are the same bytes. The sfence at the
   end of run() orders them before the array is handed on. */
#if defined(__x86_64__) || defined(_M_X64)
#include <emmintrin.h>
static void stream_copy(char *dst, const char *src, size_t bytes) {
    while (bytes > 0 && ((uintptr_t)dst & 15) != 0) {
        *dst++ = *src++;
        bytes--;
    }
    for (; bytes >= 16; bytes -= 16, dst += 16, src += 16)
        _mm_stream_si128((__m128i *)dst, _mm_loadu_si128((const __m128i *)src));
    memcpy(dst, src, bytes);
}
#define STREAM_FENCE() _mm_sfence()
#else
static void stream_copy(char *dst, const char *src, size_t bytes) {
    memcpy(dst, src, bytes);
}
#define STREAM_FENCE() ((void)0)
#endif

static int itemsize_of(int dtype) { return dtype == T_F32 ? 4 : 1; }

/* Whether the buffer's items are of `dtype`: its size and format. */
static int items_ok(const Py_buffer *view, int dtype) {
    return view->itemsize == itemsize_of(dtype)
           && format_code(view) == (dtype == T_F32 ? 'f' : '?');
}

/* A C-contiguous buffer of `count` items of `dtype`, or 0 (none held). */
static int get_items(PyObject *obj, Py_buffer *view, int dtype, Py_ssize_t count, int writable) {
    if (!get_buffer(obj, view, writable)) return 0;
    if (!items_ok(view, dtype) || view->len != count * view->itemsize) {
        PyBuffer_Release(view);
        return 0;
    }
    return 1;
}

/* A 2-d operand of `count` elements whose rows lie apart (strides[0]
   beyond its row, strides[1] one item): its columns per row and the bytes
   from one row to the next. */
static int get_rows_buffer(PyObject *obj, Py_buffer *view, int dtype, Py_ssize_t count,
                           Py_ssize_t *cols, Py_ssize_t *pitch, int writable) {
    int flags = PyBUF_STRIDES | PyBUF_FORMAT;
    if (writable) flags |= PyBUF_WRITABLE;
    if (PyObject_GetBuffer(obj, view, flags) != 0) {
        PyErr_Clear();
        return 0;
    }
    Py_ssize_t size = itemsize_of(dtype);
    if (!items_ok(view, dtype) || view->ndim != 2
        || view->strides == NULL || view->shape[1] < 1
        || view->shape[0] * view->shape[1] != count || view->strides[1] != size
        || view->strides[0] < view->shape[1] * size) {
        PyBuffer_Release(view);
        return 0;
    }
    *cols = view->shape[1];
    *pitch = view->strides[0];
    return 1;
}

/* dst = elements [start, start + m) of a rows-apart operand, in order. */
static void gather_rows(char *dst, const char *base, Py_ssize_t start, Py_ssize_t m,
                        Py_ssize_t cols, Py_ssize_t pitch, int size) {
    Py_ssize_t row = start / cols, col = start % cols;
    while (m > 0) {
        Py_ssize_t take = cols - col < m ? cols - col : m;
        memcpy(dst, base + row * pitch + col * size, (size_t)(take * size));
        dst += take * size;
        m -= take;
        row++;
        col = 0;
    }
}

/* Elements [start, start + m) of a rows-apart output = src, in order. */
static void scatter_rows(char *base, const char *src, Py_ssize_t start, Py_ssize_t m,
                         Py_ssize_t cols, Py_ssize_t pitch, int size) {
    Py_ssize_t row = start / cols, col = start % cols;
    while (m > 0) {
        Py_ssize_t take = cols - col < m ? cols - col : m;
        memcpy(base + row * pitch + col * size, src, (size_t)(take * size));
        src += take * size;
        m -= take;
        row++;
        col = 0;
    }
}

/* The elementwise operations on one block of m elements. Not inlined: inside
   run() GCC stops vectorizing these loops. Built twice, for AVX2 and for the
   baseline, the loader picking the one the CPU runs (GCC's target_clones):
   the same IEEE results, twice the width. Not for AVX-512: the operands
   (Keras' variables, NumPy's arrays) lie at 16-byte offsets, so most of a
   512-bit loop's loads cross a cache line. Measured on a Zen 5 host, one
   thread (issue 16, seventeenth pass): Adam's update of 512x512 weights
   63 -> 42 us in cache, but 100 -> 118 us over nine weight sets at a
   16-byte offset (95 -> 82 64-byte aligned), demo_functional's eight
   updates in the step 0.75 -> 0.99 ms (s17demo); the LSTM's gate chains
   4-7% faster, about 0.3 of its 27 ms step (s17lstm). */
#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__)
#define VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define VECTOR_CLONES
#endif
VECTOR_CLONES __attribute__((noinline)) static void apply(int op, void *dst, void *a, void *b, void *c, Py_ssize_t m) {
    float *d = (float *)dst, *x = (float *)a, *y = (float *)b;
    uint8_t *db = (uint8_t *)dst, *xb = (uint8_t *)a, *yb = (uint8_t *)b;
    Py_ssize_t i;
    switch (op) {
    case OP_ADD: for (i = 0; i < m; i++) d[i] = x[i] + y[i]; break;
    case OP_SUB: for (i = 0; i < m; i++) d[i] = x[i] - y[i]; break;
    case OP_MUL: for (i = 0; i < m; i++) d[i] = x[i] * y[i]; break;
    case OP_DIV: for (i = 0; i < m; i++) d[i] = x[i] / y[i]; break;
    /* NumPy's maximum/minimum: a NaN in either operand is the result, and
       on equal values (-0.0 and 0.0) the second operand is. */
    case OP_MAX:
        for (i = 0; i < m; i++) d[i] = (x[i] != x[i] || x[i] > y[i]) ? x[i] : y[i];
        break;
    case OP_MIN:
        for (i = 0; i < m; i++) d[i] = (x[i] != x[i] || x[i] < y[i]) ? x[i] : y[i];
        break;
    case OP_NEG: for (i = 0; i < m; i++) d[i] = -x[i]; break;
    case OP_ABS: for (i = 0; i < m; i++) d[i] = fabsf(x[i]); break;
    case OP_SQRT: for (i = 0; i < m; i++) d[i] = sqrtf(x[i]); break;
    case OP_SQUARE: for (i = 0; i < m; i++) d[i] = x[i] * x[i]; break;
    case OP_RECIP: for (i = 0; i < m; i++) d[i] = 1.0f / x[i]; break;
    case OP_FLOOR: for (i = 0; i < m; i++) d[i] = floorf(x[i]); break;
    case OP_CEIL: for (i = 0; i < m; i++) d[i] = ceilf(x[i]); break;
    case OP_GT: for (i = 0; i < m; i++) db[i] = x[i] > y[i]; break;
    case OP_GE: for (i = 0; i < m; i++) db[i] = x[i] >= y[i]; break;
    case OP_LT: for (i = 0; i < m; i++) db[i] = x[i] < y[i]; break;
    case OP_LE: for (i = 0; i < m; i++) db[i] = x[i] <= y[i]; break;
    case OP_EQ: for (i = 0; i < m; i++) db[i] = x[i] == y[i]; break;
    case OP_NE: for (i = 0; i < m; i++) db[i] = x[i] != y[i]; break;
    case OP_AND: for (i = 0; i < m; i++) db[i] = xb[i] & yb[i]; break;
    case OP_OR: for (i = 0; i < m; i++) db[i] = xb[i] | yb[i]; break;
    case OP_XOR: for (i = 0; i < m; i++) db[i] = xb[i] ^ yb[i]; break;
    case OP_NOT: for (i = 0; i < m; i++) db[i] = !xb[i]; break;
    case OP_SELECT_F: {
        /* On the bit patterns: NaN payloads and -0.0 pass unchanged. */
        const uint8_t *p = (const uint8_t *)a;
        const uint32_t *t = (const uint32_t *)b, *f = (const uint32_t *)c;
        uint32_t *o = (uint32_t *)dst;
        for (i = 0; i < m; i++) {
            uint32_t mask = (uint32_t)0 - (uint32_t)(p[i] != 0);
            o[i] = f[i] ^ (mask & (t[i] ^ f[i]));
        }
        break;
    }
    case OP_SELECT_B: {
        const uint8_t *p = (const uint8_t *)a, *t = (const uint8_t *)b,
                      *f = (const uint8_t *)c;
        for (i = 0; i < m; i++) db[i] = p[i] ? t[i] : f[i];
        break;
    }
    case OP_F2B: for (i = 0; i < m; i++) db[i] = x[i] != 0.0f; break;
    case OP_B2F: for (i = 0; i < m; i++) d[i] = xb[i] ? 1.0f : 0.0f; break;
    }
}

/* NumPy's SIMD exp, log, tanh, ... round differently from libm's (and
   from each other on different CPUs), so the chain calls the very loop
   NumPy's ufunc runs on a contiguous float32 array: the same function, on
   the same values, gives NumPy's bits on any machine and NumPy version.
   ufunc._get_strided_loop hands it out in a capsule whose layout NumPy
   documents (numpy.ufunc._get_strided_loop; named numpy_1.24_ufunc_call_info
   since 1.24). A loop is taken only when it needs no Python (checked by
   loop_usable). Each element's result depends only on its own value
   (tests/device/test_native_transcendentals.py checks blocks of every
   length against whole-array calls), so calling it block by block changes
   nothing. */
#define CALL_INFO_NAME "numpy_1.24_ufunc_call_info"
typedef int (*strided_loop_t)(void *context, char *const *data, const Py_ssize_t *dimensions,
                              const Py_ssize_t *strides, void *auxdata);
typedef struct {
    strided_loop_t strided_loop;
    void *context;
    void *auxdata;
    unsigned char requires_pyapi;
    unsigned char no_floatingpoint_errors;
} ufunc_call_info;

static ufunc_call_info *call_info_of(PyObject *capsule) {
    if (!PyCapsule_IsValid(capsule, CALL_INFO_NAME)) return NULL;
    ufunc_call_info *info = (ufunc_call_info *)PyCapsule_GetPointer(capsule, CALL_INFO_NAME);
    if (info == NULL || info->strided_loop == NULL || info->requires_pyapi) return NULL;
    return info;
}

static void call_loop(const ufunc_call_info *info, float *dst, const float *x, Py_ssize_t m) {
    char *data[2] = {(char *)x, (char *)dst};
    Py_ssize_t strides[2] = {4, 4};
    /* A float loop without Python cannot fail (it returns 0). */
    (void)info->strided_loop(info->context, data, &m, strides, info->auxdata);
}

/* logistic(x) as primitives/elementwise.py computes it: e = exp(-|x|)
   (in place, as np.exp(e, out=e) there), then the numerator 1 (x >= 0) or
   e (otherwise, NaN included) over e + 1. The loops around the call are
   not inlined, for the reason apply() is not. */
VECTOR_CLONES __attribute__((noinline)) static void minus_abs(float *d, const float *x,
                                                               Py_ssize_t m) {
    for (Py_ssize_t i = 0; i < m; i++) d[i] = -fabsf(x[i]);
}

VECTOR_CLONES __attribute__((noinline)) static void logistic_of_exp(float *d, const float *x,
                                                                     Py_ssize_t m) {
    for (Py_ssize_t i = 0; i < m; i++) d[i] = (x[i] >= 0.0f ? 1.0f : d[i]) / (d[i] + 1.0f);
}

static void logistic(const ufunc_call_info *exp_info, float *d, const float *x, Py_ssize_t m) {
    minus_abs(d, x, m);
    call_loop(exp_info, d, d, m);
    logistic_of_exp(d, x, m);
}

/* Cloned for AVX2 as apply() is: a column operand is filled out in every
   block, and with 16-byte stores the fills took about a fifth of a softmax
   chain's time (perf); a transformer's LayerNorm chains with column
   operands ran 12-15% faster with 32-byte stores (issue 16, twenty-third
   pass). */
VECTOR_CLONES __attribute__((noinline)) static void fill(char *dst, const char *src,
                                                         Py_ssize_t count, int size,
                                                         Py_ssize_t repeat) {
    /* dst = src[0..count) each element repeated `repeat` times. */
    Py_ssize_t i, r;
    if (size == 4) {
        uint32_t *d = (uint32_t *)dst;
        const uint32_t *s = (const uint32_t *)src;
        for (i = 0; i < count; i++)
            for (r = 0; r < repeat; r++) *d++ = s[i];
    } else {
        for (i = 0; i < count; i++) {
            memset(dst, src[i], (size_t)repeat);
            dst += repeat;
        }
    }
}

/* Whole-chain kernels. The block loop above makes one pass over a block
   per operation: every operation loads its operands from and stores its
   result to the scratch registers, so a long chain costs its loads and
   stores, not its arithmetic (Adam's update of 12 operations: about 4
   cycles per element, where the same operations on values held in CPU
   registers take about 1.3, bound by the sqrt and the division). A chain
   the optimizer emits for every variable of every model is worth its own
   loop: the program is matched word for word (inputs' layouts and dtypes,
   operations, result registers; not how results are written), and the
   loop computes each element with the same operations in the same order,
   each rounded to float32 (built with -ffp-contract=off): NumPy's bits.
   An element's inputs are all read before its results are written, so a
   result may go into the buffer of an input (a donated operand); `ivdep`
   says so to the vectorizer, which would otherwise find that the result
   and input pointers may overlap and run the scalar loop. */
/* L: the row length (a M_ROW input's element i is row[i % L], a M_COL
   input's col[i / L]); loops: the program's NumPy loops (call_loop). */
typedef void (*whole_fn)(char *const *in, char *const *out, Py_ssize_t lo, Py_ssize_t hi,
                         Py_ssize_t L, const ufunc_call_info *const *loops);

/* Keras' Adam (keras/src/optimizers/adam.py, amsgrad off): inputs g, m,
   1 - beta_1, v, 1 - beta_2, alpha (the step's learning rate with both
   bias corrections), epsilon, w; results m + (g - m) (1 - beta_1),
   v + (g^2 - v) (1 - beta_2), w - m' alpha / (sqrt(v') + epsilon). */
static const int32_t ADAM_WORDS[] = {
    8, 20, 12, 3,
    M_FULL, T_F32, M_FULL, T_F32, M_SCALAR, T_F32, M_FULL, T_F32,
    M_SCALAR, T_F32, M_SCALAR, T_F32, M_SCALAR, T_F32, M_FULL, T_F32,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    OP_SUB, 8, 0, 1, 0,      OP_MUL, 9, 8, 2, 8,       OP_ADD, 10, 1, 9, 1,
    OP_SQUARE, 11, 0, 0, 0,  OP_SUB, 12, 11, 3, 11,    OP_MUL, 13, 12, 4, 12,
    OP_ADD, 14, 3, 13, 3,    OP_MUL, 15, 10, 5, 10,    OP_SQRT, 16, 14, 14, 14,
    OP_ADD, 17, 16, 6, 16,   OP_DIV, 18, 15, 17, 15,   OP_SUB, 19, 7, 18, 7,
    10, -1, 14, -1, 19, -1, /* result registers; -1: any write mode */
};

/* Adam's loop, AdamW's with `decoupled` (a constant where it is inlined):
   w first becomes w - (w decay) lr. */
static inline __attribute__((always_inline)) void adam_loop(
    const float *g, const float *m, const float *v, const float *w, float one_minus_b1,
    float one_minus_b2, float alpha, float epsilon, int decoupled, float decay, float lr,
    char *const *out, Py_ssize_t lo, Py_ssize_t hi) {
    float *m_out = (float *)out[0], *v_out = (float *)out[1], *w_out = (float *)out[2];
#pragma GCC ivdep
    for (Py_ssize_t i = lo; i < hi; i++) {
        float gi = g[i], mi = m[i], vi = v[i], wi = w[i];
        if (decoupled) wi = wi - (wi * decay) * lr;
        float m2 = mi + (gi - mi) * one_minus_b1;
        float v2 = vi + (gi * gi - vi) * one_minus_b2;
        float step = (m2 * alpha) / (sqrtf(v2) + epsilon);
        m_out[i] = m2;
        v_out[i] = v2;
        w_out[i] = wi - step;
    }
}

#define F32_AT(k) (*(const float *)in[k])

VECTOR_CLONES __attribute__((noinline)) static void adam_update(
    char *const *in, char *const *out, Py_ssize_t lo, Py_ssize_t hi, Py_ssize_t L,
    const ufunc_call_info *const *loops) {
    (void)L;
    (void)loops;
    adam_loop((const float *)in[0], (const float *)in[1], (const float *)in[3],
              (const float *)in[7], F32_AT(2), F32_AT(4), F32_AT(5), F32_AT(6), 0, 0.0f, 0.0f,
              out, lo, hi);
}

/* Keras' AdamW: Adam after the decoupled weight decay (keras/src/
   optimizers/base_optimizer.py's _apply_weight_decay, w - w wd lr, fused
   into the same chain): inputs w, weight decay, learning rate, g, m,
   1 - beta_1, v, 1 - beta_2, alpha, epsilon; results m', v', w'. */
static const int32_t ADAMW_WORDS[] = {
    10, 25, 15, 3,
    M_FULL, T_F32, M_SCALAR, T_F32, M_SCALAR, T_F32, M_FULL, T_F32, M_FULL, T_F32,
    M_SCALAR, T_F32, M_FULL, T_F32, M_SCALAR, T_F32, M_SCALAR, T_F32, M_SCALAR, T_F32,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    OP_MUL, 10, 0, 1, 0,     OP_MUL, 11, 10, 2, 10,    OP_SUB, 12, 0, 11, 0,
    OP_SUB, 13, 3, 4, 3,     OP_MUL, 14, 13, 5, 13,    OP_ADD, 15, 4, 14, 4,
    OP_SQUARE, 16, 3, 3, 3,  OP_SUB, 17, 16, 6, 16,    OP_MUL, 18, 17, 7, 17,
    OP_ADD, 19, 6, 18, 6,    OP_MUL, 20, 15, 8, 15,    OP_SQRT, 21, 19, 19, 19,
    OP_ADD, 22, 21, 9, 21,   OP_DIV, 23, 20, 22, 20,   OP_SUB, 24, 12, 23, 12,
    15, -1, 19, -1, 24, -1,
};

VECTOR_CLONES __attribute__((noinline)) static void adamw_update(
    char *const *in, char *const *out, Py_ssize_t lo, Py_ssize_t hi, Py_ssize_t L,
    const ufunc_call_info *const *loops) {
    (void)L;
    (void)loops;
    adam_loop((const float *)in[3], (const float *)in[4], (const float *)in[6],
              (const float *)in[0], F32_AT(5), F32_AT(7), F32_AT(8), F32_AT(9), 1, F32_AT(1),
              F32_AT(2), out, lo, hi);
}

/* Keras' SGD with momentum (keras/src/optimizers/sgd.py, nesterov off):
   inputs m, momentum, g, the learning rate, w; results
   m' = m momentum - g lr, w + m'. Four operations: the block loop's
   loads and stores of its scratch registers still cost about as much as
   the arithmetic and the memory traffic of m, g and w. */
static const int32_t SGD_MOMENTUM_WORDS[] = {
    5, 9, 4, 2,
    M_FULL, T_F32, M_SCALAR, T_F32, M_FULL, T_F32, M_SCALAR, T_F32, M_FULL, T_F32,
    0, 0, 0, 0, 0, 0, 0, 0, 0,
    OP_MUL, 5, 0, 1, 0,  OP_MUL, 6, 2, 3, 2,  OP_SUB, 7, 5, 6, 5,  OP_ADD, 8, 4, 7, 4,
    7, -1, 8, -1,
};

VECTOR_CLONES __attribute__((noinline)) static void sgd_momentum_update(
    char *const *in, char *const *out, Py_ssize_t lo, Py_ssize_t hi, Py_ssize_t L,
    const ufunc_call_info *const *loops) {
    (void)L;
    (void)loops;
    const float *m = (const float *)in[0], *g = (const float *)in[2], *w = (const float *)in[4];
    const float momentum = F32_AT(1), lr = F32_AT(3);
    float *m_out = (float *)out[0], *w_out = (float *)out[1];
#pragma GCC ivdep
    for (Py_ssize_t i = lo; i < hi; i++) {
        float m2 = m[i] * momentum - g[i] * lr, wi = w[i];
        m_out[i] = m2;
        w_out[i] = wi + m2;
    }
}


/* A Dense layer's bias and ReLU with the derivative JAX's max rule keeps
   for the backward pass (what Keras' relu traces to): inputs x (rows of
   L), the bias (one row), and six scalars c2..c7; results
   y = max(x + b, c2) and select(x + b > c3, c7, select(x + b == c4, c5, c6)).
   NumPy's maximum (a NaN operand is the result, equal values give the
   second) and the selects on bit patterns, as the block loop does. */
static const int32_t BIAS_RELU_WORDS[] = {
    8, 14, 6, 2,
    M_FULL, T_F32, M_ROW, T_F32, M_SCALAR, T_F32, M_SCALAR, T_F32, M_SCALAR, T_F32,
    M_SCALAR, T_F32, M_SCALAR, T_F32, M_SCALAR, T_F32,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, T_BOOL, T_BOOL, 0, 0,
    OP_ADD, 8, 0, 1, 0,        OP_MAX, 9, 8, 2, 8,        OP_GT, 10, 8, 3, 8,
    OP_EQ, 11, 8, 4, 8,        OP_SELECT_F, 12, 11, 5, 6, OP_SELECT_F, 13, 10, 7, 12,
    9, -1, 13, -1,
};

#define U32_AT(k) (*(const uint32_t *)in[k])

/* Elements [0, m) of rows, bias from its element j: y and the derivative. */
VECTOR_CLONES __attribute__((noinline)) static void bias_relu_span(
    const float *x, const float *b, float floor_, float above, float at, uint32_t c5,
    uint32_t c6, uint32_t c7, float *y, uint32_t *d, Py_ssize_t m) {
#pragma GCC ivdep
    for (Py_ssize_t i = 0; i < m; i++) {
        float t = x[i] + b[i];
        y[i] = (t != t || t > floor_) ? t : floor_;
        uint32_t eq = (uint32_t)0 - (uint32_t)(t == at);
        uint32_t inner = c6 ^ (eq & (c5 ^ c6));
        uint32_t gt = (uint32_t)0 - (uint32_t)(t > above);
        d[i] = inner ^ (gt & (c7 ^ inner));
    }
}

static void bias_relu(char *const *in, char *const *out, Py_ssize_t lo, Py_ssize_t hi,
                      Py_ssize_t L, const ufunc_call_info *const *loops) {
    (void)loops;
    const float *x = (const float *)in[0], *b = (const float *)in[1];
    float *y = (float *)out[0];
    uint32_t *d = (uint32_t *)out[1];
    for (Py_ssize_t i = lo; i < hi;) {
        Py_ssize_t j = i % L, m = L - j < hi - i ? L - j : hi - i;
        bias_relu_span(x + i, b + j, F32_AT(2), F32_AT(3), F32_AT(4), U32_AT(5), U32_AT(6),
                       U32_AT(7), y + i, d + i, m);
        i += m;
    }
}

/* Softmax along rows of L, as JAX's division rule traces e / s (s the
   row's sum, a column operand: element i reads s[i / L]). Its forward,
   inputs e, s: results e / s and the divisor's gradient factor
   -((e / s) / s). Its backward, inputs g, a, b (two columns), e: result
   (g a + b) e. The block loop spends most of these chains filling the
   columns out to the block and passing the block through its scratch
   registers between operations (a 128x4x64x64 backward: 1.3 ms, where
   one NumPy multiply of two such arrays takes 0.28); these loops read
   each row's column value once and keep the element in a CPU register. */
static const int32_t SOFTMAX_FORWARD_WORDS[] = {
    2, 5, 3, 2,
    M_FULL, T_F32, M_COL, T_F32,
    0, 0, 0, 0, 0,
    OP_DIV, 2, 0, 1, 0,  OP_DIV, 3, 2, 1, 2,  OP_NEG, 4, 3, 3, 3,
    2, -1, 4, -1,
};

static const int32_t SOFTMAX_BACKWARD_WORDS[] = {
    4, 7, 3, 1,
    M_FULL, T_F32, M_COL, T_F32, M_COL, T_F32, M_FULL, T_F32,
    0, 0, 0, 0, 0, 0, 0,
    OP_MUL, 4, 0, 1, 0,  OP_ADD, 5, 4, 2, 4,  OP_MUL, 6, 5, 3, 5,
    6, -1,
};

/* The end of row r's elements [r L, r L + L) within a range ending at hi. */
static inline Py_ssize_t row_end(Py_ssize_t r, Py_ssize_t hi, Py_ssize_t L) {
    return (r + 1) * L < hi ? (r + 1) * L : hi;
}

VECTOR_CLONES __attribute__((noinline)) static void softmax_forward(
    char *const *in, char *const *out, Py_ssize_t lo, Py_ssize_t hi, Py_ssize_t L,
    const ufunc_call_info *const *loops) {
    (void)loops;
    const float *e = (const float *)in[0], *s = (const float *)in[1];
    float *z = (float *)out[0], *f = (float *)out[1];
    for (Py_ssize_t i = lo, r = lo / L; i < hi; r++) {
        const Py_ssize_t end = row_end(r, hi, L);
        const float sr = s[r];
#pragma GCC ivdep
        for (; i < end; i++) {
            float q = e[i] / sr;
            z[i] = q;
            f[i] = -(q / sr);
        }
    }
}

VECTOR_CLONES __attribute__((noinline)) static void softmax_backward(
    char *const *in, char *const *out, Py_ssize_t lo, Py_ssize_t hi, Py_ssize_t L,
    const ufunc_call_info *const *loops) {
    (void)loops;
    const float *g = (const float *)in[0], *a = (const float *)in[1],
                *b = (const float *)in[2], *e = (const float *)in[3];
    float *d = (float *)out[0];
    for (Py_ssize_t i = lo, r = lo / L; i < hi; r++) {
        const Py_ssize_t end = row_end(r, hi, L);
        const float ar = a[r], br = b[r];
#pragma GCC ivdep
        for (; i < end; i++) d[i] = (g[i] * ar + br) * e[i];
    }
}

/* Softmax's exponentials, exp(x - m) with m the row's maximum (a column),
   or any unary NumPy loop 0 after the subtraction: the differences of a
   span of SPAN_ELEMENTS go to a buffer on the stack that stays in L1 and
   the loop writes the result from there, where the block loop filled the
   column out and passed the block through two scratch registers. A span
   as long as the block loop's longest block: the loop's per-call cost
   showed at a quarter of it (a 128x4x64x64 chain: 1.07 -> 1.45 ms). */
static const int32_t SOFTMAX_EXP_WORDS[] = {
    2, 4, 2, 1,
    M_FULL, T_F32, M_COL, T_F32,
    0, 0, 0, 0,
    OP_SUB, 2, 0, 1, 0,  OP_LOOP, 3, 2, 2, 2,
    3, -1,
};

#define SPAN_ELEMENTS 4096

/* d[0 .. hi - lo) = x[i] - col[i / L] for i in [lo, hi). */
VECTOR_CLONES __attribute__((noinline)) static void minus_column(
    float *d, const float *x, const float *col, Py_ssize_t lo, Py_ssize_t hi, Py_ssize_t L) {
    for (Py_ssize_t i = lo, r = lo / L; i < hi; r++) {
        const Py_ssize_t end = row_end(r, hi, L);
        const float cr = col[r];
        for (; i < end; i++) d[i - lo] = x[i] - cr;
    }
}

static void softmax_exp(char *const *in, char *const *out, Py_ssize_t lo, Py_ssize_t hi,
                        Py_ssize_t L, const ufunc_call_info *const *loops) {
    float span[SPAN_ELEMENTS];
    const float *x = (const float *)in[0], *m = (const float *)in[1];
    float *y = (float *)out[0];
    for (Py_ssize_t i = lo; i < hi; i += SPAN_ELEMENTS) {
        Py_ssize_t end = hi - i < SPAN_ELEMENTS ? hi : i + SPAN_ELEMENTS;
        minus_column(span, x, m, i, end, L);
        call_loop(loops[0], y + i, span, end - i);
    }
}

/* Keras' LayerNormalization as a transformer block traces it: inputs a,
   gamma, c, beta, x (a and c columns: the row's inverse deviation and the
   term of its mean; gamma and beta rows); results the scale t = a gamma
   (full size: the backward pass reads it) and x t + (c t + beta). In the
   block loop both columns were filled out and every block passed through
   five scratch registers. */
static const int32_t LAYER_NORM_WORDS[] = {
    5, 10, 5, 2,
    M_COL, T_F32, M_ROW, T_F32, M_COL, T_F32, M_ROW, T_F32, M_FULL, T_F32,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    OP_MUL, 5, 0, 1, 0,  OP_MUL, 6, 2, 5, 2,  OP_ADD, 7, 6, 3, 6,
    OP_MUL, 8, 4, 5, 4,  OP_ADD, 9, 8, 7, 8,
    5, -1, 9, -1,
};

VECTOR_CLONES __attribute__((noinline)) static void layer_norm(
    char *const *in, char *const *out, Py_ssize_t lo, Py_ssize_t hi, Py_ssize_t L,
    const ufunc_call_info *const *loops) {
    (void)loops;
    const float *a = (const float *)in[0], *gamma = (const float *)in[1],
                *c = (const float *)in[2], *beta = (const float *)in[3],
                *x = (const float *)in[4];
    float *t = (float *)out[0], *y = (float *)out[1];
    for (Py_ssize_t i = lo, r = lo / L; i < hi; r++) {
        const Py_ssize_t start = r * L, end = row_end(r, hi, L);
        const float ar = a[r], cr = c[r];
#pragma GCC ivdep
        for (; i < end; i++) {
            float scale = ar * gamma[i - start];
            float shift = cr * scale + beta[i - start];
            t[i] = scale;
            y[i] = x[i] * scale + shift;
        }
    }
}

/* Its backward with the residual's gradient added first, as a
   transformer block traces it: inputs g, h, p, q (full), c, gamma (a row), d
   (columns c, d); results s = g + h, s p, (s q + s c) gamma, (s q + s c) d:
   four full results from one pass, where the block loop passed every
   block through seven scratch registers. */
static const int32_t LAYER_NORM_BACKWARD_WORDS[] = {
    7, 14, 7, 4,
    M_FULL, T_F32, M_FULL, T_F32, M_FULL, T_F32, M_FULL, T_F32, M_COL, T_F32,
    M_ROW, T_F32, M_COL, T_F32,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    OP_ADD, 7, 0, 1, 0,    OP_MUL, 8, 7, 2, 7,    OP_MUL, 9, 7, 3, 7,
    OP_MUL, 10, 7, 4, 7,   OP_ADD, 11, 9, 10, 9,  OP_MUL, 12, 11, 5, 11,
    OP_MUL, 13, 11, 6, 11,
    7, -1, 8, -1, 12, -1, 13, -1,
};

VECTOR_CLONES __attribute__((noinline)) static void layer_norm_backward(
    char *const *in, char *const *out, Py_ssize_t lo, Py_ssize_t hi, Py_ssize_t L,
    const ufunc_call_info *const *loops) {
    (void)loops;
    const float *g = (const float *)in[0], *h = (const float *)in[1],
                *p = (const float *)in[2], *q = (const float *)in[3],
                *c = (const float *)in[4], *gamma = (const float *)in[5],
                *d = (const float *)in[6];
    float *sum = (float *)out[0], *sp = (float *)out[1], *by_gamma = (float *)out[2],
          *by_d = (float *)out[3];
    for (Py_ssize_t i = lo, r = lo / L; i < hi; r++) {
        const Py_ssize_t start = r * L, end = row_end(r, hi, L);
        const float cr = c[r], dr = d[r];
#pragma GCC ivdep
        for (; i < end; i++) {
            float s = g[i] + h[i];
            float u = s * q[i] + s * cr;
            sum[i] = s;
            sp[i] = s * p[i];
            by_gamma[i] = u * gamma[i - start];
            by_d[i] = u * dr;
        }
    }
}

/* An entry of WHOLE_CHAINS: its words' count taken from the array itself. */
#define WHOLE_CHAIN(name, words, fn) {name, words, sizeof(words) / sizeof((words)[0]), fn}

static const struct {
    const char *name;
    const int32_t *words;
    Py_ssize_t n_words;
    whole_fn fn;
} WHOLE_CHAINS[] = {
    WHOLE_CHAIN("adam", ADAM_WORDS, adam_update),
    WHOLE_CHAIN("adamw", ADAMW_WORDS, adamw_update),
    WHOLE_CHAIN("sgd_momentum", SGD_MOMENTUM_WORDS, sgd_momentum_update),
    WHOLE_CHAIN("bias_relu", BIAS_RELU_WORDS, bias_relu),
    WHOLE_CHAIN("softmax_forward", SOFTMAX_FORWARD_WORDS, softmax_forward),
    WHOLE_CHAIN("softmax_backward", SOFTMAX_BACKWARD_WORDS, softmax_backward),
    WHOLE_CHAIN("layer_norm", LAYER_NORM_WORDS, layer_norm),
    WHOLE_CHAIN("layer_norm_backward", LAYER_NORM_BACKWARD_WORDS, layer_norm_backward),
    WHOLE_CHAIN("softmax_exp", SOFTMAX_EXP_WORDS, softmax_exp),
};
#define N_WHOLE_CHAINS ((int)(sizeof(WHOLE_CHAINS) / sizeof(WHOLE_CHAINS[0])))

/* Off: every program runs in the block loop (benchmarks and tests compare
   the two in one process). */
static int whole_chains_on = 1;

/* The index in WHOLE_CHAINS of the kernel computing this program, or -1. */
static int whole_chain_of(const int32_t *w, Py_ssize_t words) {
    if (!whole_chains_on) return -1;
    for (int k = 0; k < N_WHOLE_CHAINS; k++) {
        const int32_t *p = WHOLE_CHAINS[k].words;
        if (words != WHOLE_CHAINS[k].n_words) continue;
        Py_ssize_t j = 0;
        for (; j < words; j++)
            if (p[j] != -1 && p[j] != w[j]) break;
        if (j == words) return k;
    }
    return -1;
}

/* Each thread's scratch slots (_scratch.h): a chain's block registers
   (SCRATCH_REGISTERS) and a launched pair's product result
   (SCRATCH_PRODUCT: pair_task). */
enum { SCRATCH_REGISTERS = 0, SCRATCH_PRODUCT = 1 };

/* One chain, checked and bound to its buffers: what each range needs. */
typedef struct {
    int n_in, n_regs, n_ops, n_out;
    const int32_t *in_desc, *reg_dtype, *ops, *out_regs;
    const ufunc_call_info *const *loops;
    char *const *base, *const *out_base;
    const Py_ssize_t *cols, *pitch; /* per input: rows apart (cols > 0) or not */
    const Py_ssize_t *out_cols, *out_pitch; /* per output: the same */
    Py_ssize_t L, block, lo, hi, task;
    size_t stride;
    int failed; /* a range found no memory for its scratch */
    whole_fn whole; /* the program's whole-chain kernel, or NULL */
} chain_t;

/* Elements [lo, hi) of the chain, block by block (lo a multiple of the
   block). Returns 0 when no scratch memory could be had. */
static int chain_range(const chain_t *c, Py_ssize_t lo, Py_ssize_t hi) {
    int n_in = c->n_in, n_regs = c->n_regs, n_ops = c->n_ops, n_out = c->n_out;
    const int32_t *in_desc = c->in_desc, *reg_dtype = c->reg_dtype, *ops = c->ops,
                  *out_regs = c->out_regs;
    Py_ssize_t block = c->block, L = c->L;
    size_t stride = c->stride;
    if (c->whole != NULL) {
        c->whole(c->base, c->out_base, lo, hi, L, c->loops);
        return 1;
    }
    char *scratch = thread_scratch(SCRATCH_REGISTERS, (size_t)n_regs * stride + 64);
    if (scratch == NULL) return 0;
    char *ptr[MAX_REGS];
    /* Scalars and rows are the same in every block: expanded once. */
    for (int k = 0; k < n_in; k++) {
        int mode = in_desc[2 * k], size = itemsize_of(reg_dtype[k]);
        char *slot = scratch + (size_t)k * stride;
        if (mode == M_SCALAR) fill(slot, c->base[k], 1, size, block);
        else if (mode == M_ROW) {
            for (Py_ssize_t r = 0; r < block / L; r++)
                memcpy(slot + r * L * size, c->base[k], L * size);
        }
    }
    for (int r = 0; r < n_regs; r++) ptr[r] = scratch + (size_t)r * stride;
    for (Py_ssize_t start = lo; start < hi; start += block) {
        Py_ssize_t m = hi - start < block ? hi - start : block;
        for (int k = 0; k < n_in; k++) {
            int mode = in_desc[2 * k], size = itemsize_of(reg_dtype[k]);
            if (mode == M_FULL && c->cols[k] > 0)
                gather_rows(scratch + (size_t)k * stride, c->base[k], start, m, c->cols[k],
                            c->pitch[k], size);
            else if (mode == M_FULL) ptr[k] = c->base[k] + start * size;
            else if (mode == M_COL)
                fill(scratch + (size_t)k * stride, c->base[k] + (start / L) * size,
                     m / L, size, L);
        }
        for (int k = 0; k < n_out; k++)
            if (out_regs[2 * k + 1] == OUT_DIRECT && c->out_cols[k] == 0)
                ptr[out_regs[2 * k]] =
                    c->out_base[k] + start * itemsize_of(reg_dtype[out_regs[2 * k]]);
        for (int k = 0; k < n_ops; k++) {
            const int32_t *o = ops + 5 * k;
            if (o[0] < OP_LOOP)
                apply(o[0], ptr[o[1]], ptr[o[2]], ptr[o[3]], ptr[o[4]], m);
            else if (o[0] < OP_LOGISTIC)
                call_loop(c->loops[o[0] - OP_LOOP], (float *)ptr[o[1]], (float *)ptr[o[2]], m);
            else
                logistic(c->loops[o[0] - OP_LOGISTIC], (float *)ptr[o[1]], (float *)ptr[o[2]],
                         m);
        }
        for (int k = 0; k < n_out; k++) {
            int reg = out_regs[2 * k], size = itemsize_of(reg_dtype[reg]);
            if (c->out_cols[k] > 0) /* any mode: its register holds the block's result */
                scatter_rows(c->out_base[k], ptr[reg], start, m, c->out_cols[k],
                             c->out_pitch[k], size);
            else if (out_regs[2 * k + 1] == OUT_COPY)
                memcpy(c->out_base[k] + start * size, ptr[reg], m * size);
            else if (out_regs[2 * k + 1] == OUT_STREAM)
                stream_copy(c->out_base[k] + start * size, ptr[reg], (size_t)(m * size));
        }
    }
    STREAM_FENCE();
    return 1;
}

static void chain_task(void *arg, int64_t i) {
    chain_t *c = (chain_t *)arg;
    Py_ssize_t lo = c->lo + i * c->task, hi = lo + c->task < c->hi ? lo + c->task : c->hi;
    if (!chain_range(c, lo, hi)) c->failed = 1; /* one int, set by any: no atomics needed */
}

/* A chain checked and bound to its operands' buffers (held until
   release_chain): run() runs it at once, launch_pair() on a helper. */
typedef struct {
    chain_t c;
    Py_buffer code;
    Py_buffer views[MAX_REGS];
    int n_views;
    int64_t count; /* tasks: ranges of c.task elements */
    char *base[MAX_REGS], *out_base[MAX_REGS];
    Py_ssize_t cols[MAX_REGS], pitch[MAX_REGS], out_cols[MAX_REGS], out_pitch[MAX_REGS];
    const ufunc_call_info *loops[MAX_LOOPS];
} bound_chain;

static void release_chain(bound_chain *b) {
    for (int k = 0; k < b->n_views; k++) PyBuffer_Release(&b->views[k]);
    b->n_views = 0;
    PyBuffer_Release(&b->code);
}

/* Checks the program in b->code against the operands and binds it (run's
   arguments). 1: bound (count 0: nothing to compute); 0: a buffer does
   not fit (run returns False); -1: an error is set. Holds the buffers in
   every case: release_chain. */
static int bind_chain(bound_chain *b, Py_ssize_t n, Py_ssize_t L, Py_ssize_t B, PyObject *ins,
                      PyObject *outs, Py_ssize_t lo, Py_ssize_t hi, PyObject *loop_capsules,
                      int threads, Py_ssize_t task) {
    const int32_t *w = (const int32_t *)b->code.buf;
    Py_ssize_t words = b->code.len / 4;
    Py_buffer *views = b->views;
    b->n_views = 0;
    b->count = 0;

    if (hi < 0) hi = n;
    if (words < 4 || L < 1 || B < L || B % L != 0 || n < 0 || n % L != 0
        || lo < 0 || lo > hi || hi > n || lo % B != 0
        || (threads > 1 && (task < B || task % B != 0))) {
        PyErr_SetString(PyExc_ValueError, "native elementwise: bad header");
        return -1;
    }
    int n_in = w[0], n_regs = w[1], n_ops = w[2], n_out = w[3];
    if (n_in < 0 || n_regs > MAX_REGS || n_in > n_regs || n_ops < 0 || n_out < 0
        || words != 4 + 2 * n_in + n_regs + 5 * n_ops + 2 * n_out
        || PyTuple_GET_SIZE(ins) != n_in || PyTuple_GET_SIZE(outs) != n_out) {
        PyErr_SetString(PyExc_ValueError, "native elementwise: bad program");
        return -1;
    }
    const int32_t *in_desc = w + 4, *reg_dtype = in_desc + 2 * n_in;
    const int32_t *ops = reg_dtype + n_regs, *out_regs = ops + 5 * n_ops;
    const ufunc_call_info **loops = b->loops;
    Py_ssize_t n_loops = loop_capsules == NULL ? 0 : PyTuple_GET_SIZE(loop_capsules);
    if (n_loops > MAX_LOOPS) {
        PyErr_SetString(PyExc_ValueError, "native elementwise: too many loops");
        return -1;
    }
    for (Py_ssize_t k = 0; k < n_loops; k++) {
        loops[k] = call_info_of(PyTuple_GET_ITEM(loop_capsules, k));
        if (loops[k] == NULL) {
            PyErr_SetString(PyExc_ValueError, "native elementwise: not a usable NumPy loop");
            return -1;
        }
    }
    for (int k = 0; k < n_ops; k++) {
        const int32_t *o = ops + 5 * k;
        for (int j = 1; j < 5; j++)
            if (o[j] < 0 || o[j] >= n_regs) {
                PyErr_SetString(PyExc_ValueError, "native elementwise: bad register");
                return -1;
            }
        int is_loop = o[0] >= OP_LOOP && o[0] < OP_LOGISTIC + MAX_LOOPS;
        if (is_loop && ((o[0] - OP_LOOP) % MAX_LOOPS >= n_loops || reg_dtype[o[1]] != T_F32
                        || reg_dtype[o[2]] != T_F32 || o[2] == o[1])) {
            PyErr_SetString(PyExc_ValueError, "native elementwise: bad loop op");
            return -1;
        }
        if (((o[0] <= 0 || o[0] >= OP_LAST) && !is_loop) || o[1] < n_in) {
            PyErr_SetString(PyExc_ValueError, "native elementwise: bad op");
            return -1;
        }
    }
    char **base = b->base;
    Py_ssize_t *cols = b->cols, *pitch = b->pitch;
    int rows_apart = 0;
    Py_ssize_t counts[4] = {n, 1, L, n / L};
    for (int k = 0; k < n_in; k++) {
        int mode = in_desc[2 * k], dtype = in_desc[2 * k + 1];
        PyObject *obj = PyTuple_GET_ITEM(ins, k);
        cols[k] = pitch[k] = 0;
        if (mode < 0 || mode > 3 || dtype != reg_dtype[k]) return 0;
        if (!get_items(obj, &views[b->n_views], dtype, counts[mode], 0)
            && !(mode == M_FULL
                 && get_rows_buffer(obj, &views[b->n_views], dtype, n, &cols[k], &pitch[k], 0)))
            return 0;
        rows_apart |= cols[k] > 0;
        base[k] = (char *)views[b->n_views++].buf;
    }
    char **out_base = b->out_base;
    Py_ssize_t *out_cols = b->out_cols, *out_pitch = b->out_pitch;
    if (n_out > MAX_REGS - b->n_views) return 0;
    for (int k = 0; k < n_out; k++) {
        int reg = out_regs[2 * k];
        int mode = out_regs[2 * k + 1];
        PyObject *obj = PyTuple_GET_ITEM(outs, k);
        out_cols[k] = out_pitch[k] = 0;
        if (reg < 0 || reg >= n_regs || mode < OUT_COPY || mode > OUT_STREAM
            || (mode == OUT_DIRECT && reg < n_in))
            return 0;
        if (!get_items(obj, &views[b->n_views], reg_dtype[reg], n, 1)
            && !get_rows_buffer(obj, &views[b->n_views], reg_dtype[reg], n, &out_cols[k],
                                &out_pitch[k], 1))
            return 0;
        rows_apart |= out_cols[k] > 0;
        out_base[k] = (char *)views[b->n_views++].buf;
    }
    if (n == 0 || lo == hi) return 1;
    chain_t c = {n_in, n_regs, n_ops, n_out, in_desc, reg_dtype, ops, out_regs,
                 loops, base, out_base, cols, pitch, out_cols, out_pitch, L, B < n ? B : n,
                 lo, hi, 0, 0, 0, NULL};
    /* A whole-chain kernel reads and writes its buffers contiguous; the block loop
       computes the same steps, in the same order. */
    int whole = rows_apart ? -1 : whole_chain_of(w, words);
    if (whole >= 0) c.whole = WHOLE_CHAINS[whole].fn;
    /* Registers a multiple of 4 KiB apart make every load look like it may
       depend on the store before it (4K aliasing) and ran this loop at a
       third of its speed: each slot is padded off that stride. */
    c.stride = (size_t)c.block * 4 + 192;
    c.task = threads > 1 ? task : hi - lo;
    b->c = c;
    b->count = (hi - lo + c.task - 1) / c.task;
    return 1;
}

static PyObject *run(PyObject *self, PyObject *args) {
    Py_ssize_t n, L, B, lo = 0, hi = -1, task = 0;
    int threads = 1;
    PyObject *ins, *outs, *loop_capsules = NULL;
    bound_chain b;
    if (!PyArg_ParseTuple(args, "y*nnnO!O!|nnO!in", &b.code, &n, &L, &B, &PyTuple_Type,
                          &ins, &PyTuple_Type, &outs, &lo, &hi, &PyTuple_Type,
                          &loop_capsules, &threads, &task))
        return NULL;
    PyObject *result = NULL;
    int bound = bind_chain(&b, n, L, B, ins, outs, lo, hi, loop_capsules, threads, task);
    if (bound == 0) {
        result = Py_False;
        Py_INCREF(result);
    } else if (bound > 0) {
        int64_t ran = 0, own = 0, wait = 0;
        if (b.count) run_tasks(chain_task, &b.c, b.count, threads, &ran, &own, &wait);
        if (b.count && b.c.failed) PyErr_NoMemory();
        else result = split_result(threads, ran, own, wait);
    }
    release_chain(&b);
    return result;
}

/* -- a product and then a chain reading its result, launched on the C pool -

   A training step's weight gradient and its optimizer update (the chain)
   as one job of a helper thread (_task_pool.h: submit, join), while the
   run loop goes on with the next layer: no Python and no GIL in the job,
   where a job on a Python thread took the GIL back after each kernel
   (compiler/concurrent_steps.py). Each runs as alone on one thread: the
   product is NumPy's matmul's one gemm call, the chain one range of all
   its elements; the bits of the two kernels called in turn. A chain
   launched alone (an update beside the next steps) is the same job
   without the product, and a product launched alone (launch_product)
   the same job without the chain. */
typedef struct {
    launched_job job;
    void *product;      /* task_pool_api.bind_product's */
    bound_chain chain;
    int has_chain;      /* 0: the product alone (launch_product) */
    PyObject *keep;     /* the operands' owners, held until the join */
    int joined;
    int64_t caller_ran, wait_ns;
    /* The product's result goes to the running thread's SCRATCH_PRODUCT
       buffer instead of product_out (private_result: nothing but the
       chain reads it) where this is its size in bytes, 0: no; the chain's
       inputs that read it. */
    size_t scratch_bytes;
    uint64_t result_inputs; /* bit k: chain input k */
} pair_job;

#define PAIR_CAPSULE "keras_ipu.device.native._elementwise.pair_job"

/* A weight gradient read only by its update: written into a buffer its
   thread reuses for every such job, which the thread's last job left in
   its caches, where a new array each step comes in cold and OpenBLAS'
   zeroing of it (beta 0) and its kernel's read of it fetch it from
   memory. The same gemm call into another address: the same bits. The
   512x512 weight gradient of Keras' demo_functional (b32) then its Adam,
   one thread, nine weight sets in turn: 375 -> 316 us for the product,
   Adam the same (issue 16, fifteenth pass, s15demo). */
static void pair_task(void *arg, int64_t unused) {
    (void)unused;
    pair_job *p = (pair_job *)arg;
    if (p->product != NULL) {
        char *into = p->scratch_bytes ? thread_scratch(SCRATCH_PRODUCT, p->scratch_bytes) : NULL;
        if (into != NULL) {
            task_pool()->run_product_into(p->product, into);
            for (int k = 0; k < p->chain.c.n_in; k++)
                if (p->result_inputs >> k & 1) p->chain.base[k] = into;
        } else {
            task_pool()->run_product(p->product);
        }
    }
    if (p->has_chain) chain_task(&p->chain.c, 0);
}

/* Up to this size a pair's product goes to the thread's reused buffer:
   one that size stays allocated per thread that ran such a pair, and a
   larger one would not stay in cache from one pair to the next anyway
   (demo_functional's gradients are 1 MiB, the MLP's 1.6 MiB). */
#define MAX_REUSED_PRODUCT_BYTES (8 << 20)

/* Whether the pair's chain reads product_out only as whole contiguous
   inputs and writes none of its results into it (then pair_task may put
   the product's result elsewhere), and it is at most
   MAX_REUSED_PRODUCT_BYTES: sets p->scratch_bytes and p->result_inputs. */
static void find_result_inputs(pair_job *p, PyObject *product_out) {
    Py_buffer v;
    if (PyObject_GetBuffer(product_out, &v, PyBUF_C_CONTIGUOUS) != 0) {
        PyErr_Clear();
        return;
    }
    const chain_t *c = &p->chain.c;
    const char *lo = (const char *)v.buf, *hi = lo + v.len;
    uint64_t at = 0;
    int ok = v.len > 0 && v.len <= MAX_REUSED_PRODUCT_BYTES && c->n_in <= 64;
    for (int k = 0; ok && k < c->n_in; k++) {
        const char *b = p->chain.base[k];
        if (b == lo && c->in_desc[2 * k] == M_FULL && c->cols[k] == 0
            && (Py_ssize_t)c->hi * itemsize_of(c->reg_dtype[k]) == v.len)
            at |= (uint64_t)1 << k;
        else if (b >= lo && b < hi)
            ok = 0; /* another view of it */
    }
    for (int k = 0; ok && k < c->n_out; k++) {
        const char *b = p->chain.out_base[k];
        ok = !(b >= lo && b < hi);
    }
    if (ok && at) {
        p->scratch_bytes = (size_t)v.len;
        p->result_inputs = at;
    }
    PyBuffer_Release(&v);
}

/* Joins (without the GIL) and releases the buffers: once. */
static void pair_finish(pair_job *p) {
    if (p->joined) return;
    p->joined = 1;
    const task_pool_api *pool = task_pool(); /* launch_pair found it */
    Py_BEGIN_ALLOW_THREADS
    pool->join(&p->job, &p->caller_ran, &p->wait_ns);
    Py_END_ALLOW_THREADS
    if (p->product != NULL) pool->release_product(p->product);
    if (p->has_chain) release_chain(&p->chain);
    Py_CLEAR(p->keep);
}

static void pair_capsule_free(PyObject *capsule) {
    pair_job *p = (pair_job *)PyCapsule_GetPointer(capsule, PAIR_CAPSULE);
    if (p == NULL) {
        PyErr_Clear();
        return;
    }
    pair_finish(p); /* a job never joined (an error in the run loop) */
    free(p);
}

/* The bound job p (its product, its chain where has_chain; p->keep: the
   operands' owners, NULL where building it failed) submitted to the pool:
   its capsule, which join_pair takes; NULL (the error set, p released and
   freed) where it cannot be made. */
static PyObject *submit_pair(pair_job *p, const task_pool_api *api) {
    PyObject *capsule = p->keep ? PyCapsule_New(p, PAIR_CAPSULE, pair_capsule_free) : NULL;
    if (capsule == NULL) {
        if (p->product != NULL) api->release_product(p->product);
        if (p->has_chain) release_chain(&p->chain);
        Py_XDECREF(p->keep);
        free(p);
        return NULL;
    }
    p->job.fn = pair_task;
    p->job.arg = p;
    api->submit(&p->job);
    return capsule;
}

static PyObject *launch_pair(PyObject *self, PyObject *args) {
    PyObject *x, *y, *product_out, *ins, *outs, *loop_capsules = NULL;
    Py_ssize_t n, L, B;
    int private_result = 0;
    const task_pool_api *api = task_pool();
    pair_job *p = (pair_job *)calloc(1, sizeof(pair_job));
    if (p == NULL) return PyErr_NoMemory();
    if (!PyArg_ParseTuple(args, "OOOy*nnnO!O!|O!p", &x, &y, &product_out, &p->chain.code, &n,
                          &L, &B, &PyTuple_Type, &ins, &PyTuple_Type, &outs, &PyTuple_Type,
                          &loop_capsules, &private_result)) {
        free(p);
        return NULL;
    }
    if (api == NULL
        || (x != Py_None && (p->product = api->bind_product(x, y, product_out)) == NULL)) {
        release_chain(&p->chain);
        free(p);
        Py_RETURN_NONE;
    }
    int bound = bind_chain(&p->chain, n, L, B, ins, outs, 0, -1, loop_capsules, 1, 0);
    if (bound <= 0 || p->chain.count != 1) {
        if (p->product != NULL) api->release_product(p->product);
        release_chain(&p->chain);
        free(p);
        if (bound < 0) return NULL;
        Py_RETURN_FALSE;
    }
    if (private_result && p->product != NULL && p->chain.count == 1)
        find_result_inputs(p, product_out);
    p->has_chain = 1;
    p->keep = Py_BuildValue("(OOOOOO)", x, y, product_out, ins, outs,
                            loop_capsules ? loop_capsules : Py_None);
    return submit_pair(p, api);
}

static PyObject *launch_product(PyObject *self, PyObject *args) {
    PyObject *x, *y, *product_out;
    if (!PyArg_ParseTuple(args, "OOO", &x, &y, &product_out)) return NULL;
    const task_pool_api *api = task_pool();
    pair_job *p = (pair_job *)calloc(1, sizeof(pair_job));
    if (p == NULL) return PyErr_NoMemory();
    if (api == NULL || (p->product = api->bind_product(x, y, product_out)) == NULL) {
        free(p);
        Py_RETURN_NONE;
    }
    p->keep = Py_BuildValue("(OOO)", x, y, product_out);
    return submit_pair(p, api);
}

static PyObject *join_pair(PyObject *self, PyObject *capsule) {
    pair_job *p = (pair_job *)PyCapsule_GetPointer(capsule, PAIR_CAPSULE);
    if (p == NULL) return NULL;
    if (p->joined) {
        PyErr_SetString(PyExc_ValueError, "join_pair: joined already");
        return NULL;
    }
    pair_finish(p);
    if (p->has_chain && p->chain.c.failed) return PyErr_NoMemory();
    return Py_BuildValue("idd", (int)p->caller_ran, p->wait_ns * 1e-9, p->job.cpu_ns * 1e-9);
}

/* sum_rows(x, out, rows, cols) -> bool: out[j] = x[0][j] + x[1][j] + ...
   + x[rows-1][j] for a C-contiguous float32 x of rows x cols and a float32
   out of cols. A sum over an array's leading axes (BatchNormalization's
   statistics and gradients, a bias gradient) is this. NumPy adds the rows
   in the same order, one after another (it sums pairwise only along the
   innermost axis), starting from +0.0, so the bits are NumPy's; but it
   calls its inner loop once per row, which for a few dozen columns costs
   more than the adds (a 128x32x32x32 sum over all but the channels ran
   at about a quarter of the memory's speed). Columns go in blocks that
   stay in L1 while the rows stream past; each column still adds its rows
   in order. False (nothing written) when a buffer does not fit. */
#define SUM_COLUMN_BLOCK 2048

VECTOR_CLONES __attribute__((noinline)) static void add_rows(float *out, const float *x,
                                                             Py_ssize_t rows, Py_ssize_t cols,
                                                             Py_ssize_t width) {
    /* From NumPy's identity, +0.0: a column of -0.0 sums to +0.0 there. */
    for (Py_ssize_t j = 0; j < width; j++) out[j] = 0.0f + x[j];
    for (Py_ssize_t r = 1; r < rows; r++) {
        const float *row = x + r * cols;
        for (Py_ssize_t j = 0; j < width; j++) out[j] += row[j];
    }
}

/* Column blocks of a row sum, one task each: every column still adds its
   rows in order, so the bits are NumPy's at any split. Or, with
   block_rows, row blocks: task i adds rows [i * block_rows, ...) of every
   column in order into row i of dst (a partial sum per block; the caller
   adds the partials in block order). A sum of few columns (a
   BatchNormalization's 32 channels over 131072 rows) has no column
   blocks wide enough to keep the threads off each other's cache lines
   (SUM_TASK_COLUMNS), so it splits by rows. */
typedef struct {
    const float *src;
    float *dst;
    Py_ssize_t rows, cols, width, block_rows;
} row_sum_t;

static void row_block_sum_task(void *arg, int64_t i) {
    const row_sum_t *s = (const row_sum_t *)arg;
    Py_ssize_t lo = i * s->block_rows;
    Py_ssize_t n = lo + s->block_rows < s->rows ? s->block_rows : s->rows - lo;
    for (Py_ssize_t j = 0; j < s->cols; j += SUM_COLUMN_BLOCK) {
        Py_ssize_t width = s->cols - j < SUM_COLUMN_BLOCK ? s->cols - j : SUM_COLUMN_BLOCK;
        add_rows(s->dst + i * s->cols + j, s->src + lo * s->cols + j, n, s->cols, width);
    }
}

static void row_sum_task(void *arg, int64_t i) {
    const row_sum_t *s = (const row_sum_t *)arg;
    Py_ssize_t lo = i * s->width, hi = lo + s->width < s->cols ? lo + s->width : s->cols;
    for (Py_ssize_t j = lo; j < hi; j += SUM_COLUMN_BLOCK) {
        Py_ssize_t width = hi - j < SUM_COLUMN_BLOCK ? hi - j : SUM_COLUMN_BLOCK;
        add_rows(s->dst + j, s->src + j, s->rows, s->cols, width);
    }
}

static PyObject *sum_rows(PyObject *self, PyObject *args) {
    PyObject *x_obj, *out_obj;
    Py_ssize_t rows, cols, width = 0, block_rows = 0;
    int threads = 1;
    if (!PyArg_ParseTuple(args, "OOnn|inn", &x_obj, &out_obj, &rows, &cols, &threads, &width,
                          &block_rows))
        return NULL;
    if (rows < 1 || cols < 1 || rows > PY_SSIZE_T_MAX / cols) Py_RETURN_FALSE;
    if (!split_size_ok(threads, block_rows > 0 ? block_rows : width,
                       "sum_rows: a split needs a column width or rows per block"))
        return NULL;
    if (block_rows < 0) {
        PyErr_SetString(PyExc_ValueError, "sum_rows: block_rows must not be negative");
        return NULL;
    }
    /* Row blocks: one partial sum of cols per block in out. */
    Py_ssize_t blocks = block_rows > 0 ? (rows + block_rows - 1) / block_rows : 0;
    Py_buffer x, out;
    if (!get_items(x_obj, &x, T_F32, rows * cols, 0)) Py_RETURN_FALSE;
    if (!get_items(out_obj, &out, T_F32, blocks ? blocks * cols : cols, 1)) {
        PyBuffer_Release(&x);
        Py_RETURN_FALSE;
    }
    row_sum_t s = {(const float *)x.buf, (float *)out.buf, rows, cols,
                   threads > 1 && width > 0 ? width : cols, block_rows};
    int64_t ran = 0, own = 0, wait = 0;
    if (blocks)
        run_tasks(row_block_sum_task, &s, blocks, threads, &ran, &own, &wait);
    else
        run_tasks(row_sum_task, &s, (cols + s.width - 1) / s.width, threads, &ran, &own, &wait);
    PyBuffer_Release(&out);
    PyBuffer_Release(&x);
    return split_result(threads, ran, own, wait);
}

static PyObject *whole_chain(PyObject *self, PyObject *args) {
    Py_buffer code;
    if (!PyArg_ParseTuple(args, "y*", &code)) return NULL;
    int k = whole_chain_of((const int32_t *)code.buf, code.len / 4);
    PyBuffer_Release(&code);
    if (k < 0) Py_RETURN_NONE;
    return PyUnicode_FromString(WHOLE_CHAINS[k].name);
}

static PyObject *whole_chains(PyObject *self, PyObject *on) {
    int was = whole_chains_on, value = PyObject_IsTrue(on);
    if (value < 0) return NULL;
    whole_chains_on = value;
    return PyBool_FromLong(was);
}

static PyObject *loop_usable(PyObject *self, PyObject *capsule) {
    return PyBool_FromLong(call_info_of(capsule) != NULL);
}

static PyMethodDef methods[] = {
    {"loop_usable", loop_usable, METH_O,
     "loop_usable(call_info) -> bool: a capsule of ufunc._get_strided_loop "
     "whose loop run() can call without Python."},
    {"whole_chain", whole_chain, METH_VARARGS,
     "whole_chain(code) -> str or None: the name of the whole-chain kernel "
     "run() uses for this program (one loop computing each element), or None "
     "(the block loop, one pass per operation)."},
    {"whole_chains", whole_chains, METH_O,
     "whole_chains(on) -> bool: use the whole-chain kernels (on, the default) "
     "or run every program in the block loop; returns the previous setting."},
    {"run", run, METH_VARARGS,
     "run(code, n, L, B, inputs, outputs[, lo, hi[, loops[, threads, task]]]) "
     "-> bool: one fused chain, block by block, over elements [lo, hi) "
     "(default all; hi -1: n); loops: NumPy's strided loops its loop opcodes "
     "call; threads > 1: ranges of `task` elements on the C pool, returning "
     "(caller_tasks, own_s, wait_s); False (nothing written) when a buffer "
     "does not fit the program."},
    {"launch_pair", launch_pair, METH_VARARGS,
     "launch_pair(x, y, product_out, code, n, L, B, inputs, outputs[, loops[, "
     "private_result]]) -> "
     "job, None or False: product_out = x @ y (2-d, NumPy's matmul's bits) and "
     "then the chain run(code, n, L, B, inputs, outputs, 0, -1, loops) (its "
     "inputs may include product_out), both on one thread of the C pool "
     "(x None: the chain alone); private_result: nothing but the chain reads "
     "the product, which may then go to the running thread's reused buffer "
     "instead of product_out (product_out is then left as it was), "
     "launched: join_pair(job) waits for them. None: the C pool cannot take "
     "the product; False: a buffer does not fit the chain (nothing runs)."},
    {"launch_product", launch_product, METH_VARARGS,
     "launch_product(x, y, product_out) -> job or None: launch_pair's product "
     "alone, launched on the C pool; None where the pool cannot take it."},
    {"join_pair", join_pair, METH_O,
     "join_pair(job) -> (caller_ran, wait_s, cpu_s): once launch_pair's job "
     "is done (the caller runs it if no helper took it: caller_ran 1, or 2 where "
     "the helpers were on earlier launched jobs meanwhile); wait_s: "
     "the caller's wait for the helper, cpu_s: the job's thread CPU time."},
    {"sum_rows", sum_rows, METH_VARARGS,
     "sum_rows(x, out, rows, cols[, threads, width]) -> bool: out = the rows "
     "of the float32 rows x cols x added in order (NumPy's bits); False "
     "(nothing written) when a buffer does not fit. threads > 1: blocks of "
     "`width` columns on the C pool, returning (caller_tasks, own_s, wait_s). "
     "block_rows > 0: out holds one partial sum per block of block_rows rows "
     "(each adding its rows in order), the blocks the C pool's tasks."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_elementwise",
    "Fused elementwise chains in one pass (see native_fusion.py).", -1, methods,
};

/* TASK_POOL_VERSION: run() and sum_rows() take the threads arguments
   (product_pool.tasks_available checks it: an editable install not
   rebuilt keeps an older module, whose calls must not get them);
   SUM_ROW_BLOCKS: sum_rows takes block_rows (leading_sums.py checks it). */
PyMODINIT_FUNC PyInit__elementwise(void) {
    return module_with_constants(&module, "TASK_POOL_VERSION", TASK_POOL_VERSION,
                                 "SUM_ROW_BLOCKS", 1, NULL);
}
