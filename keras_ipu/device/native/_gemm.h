/* Our own float32 gemm for CPUs with AVX-512 (issue 16, twenty-first pass).

   Why: the machine's environment pins NumPy's OpenBLAS to its AVX2
   (Haswell) kernels (OPENBLAS_CORETYPE), which run about half the rate
   of the CPU's AVX-512 on the NumPy engine's products; the library does
   not override the user's environment, so the engine's float32 products
   run here instead where the CPU has AVX-512 (native_sgemm_available).
   hatch_build.py builds without -march: only these functions are built
   for AVX-512 (target attributes) and called after a run-time check.

   C = op(A) @ op(B), row-major, alpha 1, beta 0, with CBLAS' transpose
   flags and leading dimensions as NumPy's matmul passes them.

   Every element of C is one sequential chain of float32 FMAs over
   k = 0 .. K-1 starting from zero, whatever block of rows or columns a
   call covers and whatever layout its operands have (B^T is packed into
   the layout of B first, which moves no arithmetic): a split of a product
   into blocks of rows, columns or rectangles anywhere gives the bits of
   the whole call (product_pool.py's Rule(1, "any")).

   Register block: GEMM_MR rows x GEMM_NR columns (2 zmm per row, 24
   accumulators), op(B)'s row k loaded once per row block (contiguous in
   NN, packed for NT), op(A)[i, k] broadcast from memory (NN: GEMM_MR
   strided streams; TN: GEMM_MR contiguous floats). The row blocks run
   inside a column strip, so the strip (K x GEMM_NR floats) stays in L2;
   where op(B) is larger than L2, its strips are packed per block of k and
   stay in L1 (gemm_blocks). The blocks of k keep each element's one chain:
   a block after the first goes on from the partial sums C holds. */

#ifndef KERAS_IPU_GEMM_H
#define KERAS_IPU_GEMM_H

#include <stdint.h>

#include "_scratch.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define KERAS_IPU_GEMM_AVX512 1
#include <immintrin.h>
#endif

#define GEMM_MR 12
#define GEMM_NR 32
/* k per packed chunk of op(B): GEMM_KC x GEMM_NR floats, 32 KiB. */
#define GEMM_KC 256
/* Large products (native_sgemm_avx512) pack op(B)'s columns GEMM_NC at a
   time (GEMM_KC x GEMM_NC floats, 1 MiB) and TN's op(A) GEMM_MC rows at a
   time (GEMM_KC x GEMM_MC floats, 144 KiB, in L2). */
#define GEMM_NC 1024
#define GEMM_MC 144
#define GEMM_PACK_FLOATS (GEMM_KC * GEMM_NC + GEMM_KC * GEMM_MC)
/* Which products are large: GEMM_PACK_B_ROWS rows or more reusing an
   op(B) of more than GEMM_PACK_B_FLOATS (L2's size) and a strip of
   GEMM_PACK_B_K rows of k or more (128 KiB), and TN's op(A) packed where
   GEMM_PACK_A_COLUMNS columns or more reuse it. Measured on one core of
   the AMD EPYC VM (Zen 5, L1 48 KiB, L2 1 MiB; issue 16, twenty-second
   pass, s22gemm), both kernels in one process, calls alternated: the
   packed kernel gained 1.9-2.9x on ResNet-18's 2304x256 weight gradient
   (k 2048), 1.1-1.4x on its 512x512 and 2048x256 forward products (k
   4608 and 2304) and 1.4-3.1x on 2048^3 NN and TN; products whose op(B)
   fits L2, or whose strip does (512x2304 @ 2304x512, k 512), ran 2-6%
   slower packed (the strip, in place, stays in cache), and TN's op(A)
   packed for 64-128 columns 8-20% slower. From 64 rows, not 256 (issue
   16, twenty-third pass, s23tail: the same in-process A/B, min of 9, in
   3-12 processes): of the five benchmark models' products only the
   LSTM's and the transformer's TN weight gradients lie between; the
   LSTM's 128x4096 @ 4096x512 ran 63-158 -> 179-220 GFLOP/s (faster in
   every process), its 64x4096 @ 4096x512 124-228 -> 160-215, the
   transformer's (64-128 x 8192 @ 8192 x 64-128) 173-257 -> 212-244: the
   strided strips and op(A) columns fall into few cache sets, so the
   kernel in place swings with where the operands lie, packed it does not.
   16-32 rows (two or three row blocks over each strip) ran 0.63-1.28x,
   so they keep the strip-by-strip kernel. */
#define GEMM_PACK_B_ROWS 64
#define GEMM_PACK_B_FLOATS (256 * 1024)
#define GEMM_PACK_B_K 1024
#define GEMM_PACK_A_COLUMNS 256
/* NT's products by rows of C (gemm_nt_by_rows) from this ratio. */
#define GEMM_NT_BY_ROWS 2
/* _scratch.h's slot of the packed blocks. */
#define SCRATCH_GEMM 0

#ifdef KERAS_IPU_GEMM_AVX512

#define GEMM_TARGET __attribute__((target("avx512f,fma")))
#define GEMM_INLINE static inline __attribute__((always_inline)) GEMM_TARGET

/* A strip's columns: all GEMM_NR, fewer (masks m0 and m1 of each 16),
   or at most 16 (mask m0; half the FMAs: the MLP's 10-column products). */
enum { GEMM_FULL, GEMM_MASKED, GEMM_HALF };

/* The masks of a strip of w (1 .. GEMM_NR) columns: its first 16 columns
   (m0), its next 16 (m1). */
GEMM_INLINE __mmask16 gemm_mask_lo(int64_t w) {
    return (__mmask16)(w >= 16 ? 0xffff : (1u << w) - 1);
}
GEMM_INLINE __mmask16 gemm_mask_hi(int64_t w) {
    return (__mmask16)(w >= GEMM_NR ? 0xffff : w <= 16 ? 0 : (1u << (w - 16)) - 1);
}

/* mr (<= GEMM_MR) rows x up to 32 columns of C: op(A)[i, k] at
   a[i * rs + k * ks], op(B)[k, j] at b[k * ldb + j]; columns past the
   masks m0 (first 16) and m1 (next 16) are neither read nor written.
   trans_c: the block is C^T's, written to C transposed (element (i, j)
   at c[j * ldc + i]; from_c 0): gemm_strip_ct_full's. */
GEMM_INLINE void gemm_block(const int mr, const int cols, int64_t K, const float *a,
                            const int64_t rs, const int64_t ks, const float *b, int64_t ldb,
                            float *c, int64_t ldc, __mmask16 m0, __mmask16 m1, int from_c,
                            const int trans_c) {
    const int full = cols == GEMM_FULL, two = cols != GEMM_HALF;
    __m512 acc0[GEMM_MR], acc1[GEMM_MR];
#pragma GCC unroll 16
    for (int i = 0; i < mr; i++) {
        /* from_c: the chains go on from the partial sums C holds (a
           k-chunk after the first: the same FMAs in the same order). */
        acc0[i] = from_c ? _mm512_maskz_loadu_ps(m0, c + i * ldc) : _mm512_setzero_ps();
        if (two)
            acc1[i] = from_c ? _mm512_maskz_loadu_ps(m1, c + i * ldc + 16) : _mm512_setzero_ps();
    }
    for (int64_t k = 0; k < K; k++) {
        const float *bk = b + k * ldb;
        __m512 b0 = full ? _mm512_loadu_ps(bk) : _mm512_maskz_loadu_ps(m0, bk);
        __m512 b1 = full ? _mm512_loadu_ps(bk + 16)
                         : two ? _mm512_maskz_loadu_ps(m1, bk + 16) : _mm512_setzero_ps();
        const float *ak = a + k * ks;
#pragma GCC unroll 16
        for (int i = 0; i < mr; i++) {
            __m512 ai = _mm512_set1_ps(ak[i * rs]);
            acc0[i] = _mm512_fmadd_ps(ai, b0, acc0[i]);
            if (two) acc1[i] = _mm512_fmadd_ps(ai, b1, acc1[i]);
        }
    }
    if (trans_c) {
        float t[GEMM_MR * GEMM_NR] __attribute__((aligned(64)));
#pragma GCC unroll 16
        for (int i = 0; i < mr; i++) {
            _mm512_store_ps(t + i * GEMM_NR, acc0[i]);
            if (two) _mm512_store_ps(t + i * GEMM_NR + 16, acc1[i]);
        }
        const int cols_used = __builtin_popcount(m0) + (two ? __builtin_popcount(m1) : 0);
        for (int j = 0; j < cols_used; j++) {
#pragma GCC unroll 16
            for (int i = 0; i < mr; i++) c[j * ldc + i] = t[i * GEMM_NR + j];
        }
        return;
    }
#pragma GCC unroll 16
    for (int i = 0; i < mr; i++) {
        if (full) {
            _mm512_storeu_ps(c + i * ldc, acc0[i]);
            _mm512_storeu_ps(c + i * ldc + 16, acc1[i]);
        } else {
            _mm512_mask_storeu_ps(c + i * ldc, m0, acc0[i]);
            if (two) _mm512_mask_storeu_ps(c + i * ldc + 16, m1, acc1[i]);
        }
    }
}

/* Rows 0 .. m-1 of a strip of up to 32 columns, GEMM_MR at a time then
   the tail's: each block's op(A) at a + i * as (i its first row;
   gemm_block's rs and ks within it), its results at c + i * cs.
   Row-major C: cs = ldc; trans_c (gemm_block's): C^T's rows, cs = 1. */
GEMM_INLINE void gemm_rows(const int cols, int64_t m, int64_t K, const float *a,
                           const int64_t as, const int64_t rs, const int64_t ks,
                           const float *b, int64_t ldb, float *c, int64_t ldc,
                           const int64_t cs, __mmask16 m0, __mmask16 m1, int from_c,
                           const int trans_c) {
    int64_t i = 0;
    for (; i + GEMM_MR <= m; i += GEMM_MR)
        gemm_block(GEMM_MR, cols, K, a + i * as, rs, ks, b, ldb, c + i * cs, ldc, m0, m1,
                   from_c, trans_c);
    const float *ai = a + i * as;
    float *ci = c + i * cs;
#define GEMM_TAIL(r)                                                                        \
    case r:                                                                                 \
        gemm_block(r, cols, K, ai, rs, ks, b, ldb, ci, ldc, m0, m1, from_c, trans_c);        \
        break;
    switch (m - i) {
        GEMM_TAIL(1) GEMM_TAIL(2) GEMM_TAIL(3) GEMM_TAIL(4) GEMM_TAIL(5) GEMM_TAIL(6)
        GEMM_TAIL(7) GEMM_TAIL(8) GEMM_TAIL(9) GEMM_TAIL(10) GEMM_TAIL(11)
        default: break;
    }
#undef GEMM_TAIL
}

/* All rows of one column strip. NN: row i of op(A) is row i of A (stride
   lda), k contiguous; TN: row i of op(A) is column i of A (contiguous), k
   strided by lda. */
GEMM_INLINE void gemm_strip(const int cols, const int trans_a, int64_t m, int64_t K,
                            const float *a, int64_t lda, const float *b, int64_t ldb,
                            float *c, int64_t ldc, __mmask16 m0, __mmask16 m1, int from_c) {
    if (trans_a) gemm_rows(cols, m, K, a, 1, 1, lda, b, ldb, c, ldc, ldc, m0, m1, from_c, 0);
    else gemm_rows(cols, m, K, a, lda, lda, 1, b, ldb, c, ldc, ldc, m0, m1, from_c, 0);
}

/* C^T's rows j < n (NT: op(B)^T's row j, B's row j, at b + j * ldb, k
   contiguous) times op(A)^T's strip of up to 32 of C's rows, packed
   (pack[k * GEMM_NR + i]), over all of k: C's rows of the strip, written
   transposed 12 columns at a time. Each element is the chain of NN's and
   the other layouts' kernel (op(A)[i, k] op(B)[k, j] in order of k: a
   product of two floats is the same either way round). */
static GEMM_TARGET void gemm_strip_ct_full(int64_t n, int64_t K, const float *b, int64_t ldb,
                                           const float *pack, float *c, int64_t ldc) {
    gemm_rows(GEMM_FULL, n, K, b, ldb, ldb, 1, pack, GEMM_NR, c, ldc, 1, 0xffff, 0xffff, 0, 1);
}
static GEMM_TARGET void gemm_strip_ct_masked(int64_t n, int64_t K, const float *b, int64_t ldb,
                                             const float *pack, float *c, int64_t ldc,
                                             __mmask16 m0, __mmask16 m1) {
    if (m1 == 0) gemm_rows(GEMM_HALF, n, K, b, ldb, ldb, 1, pack, GEMM_NR, c, ldc, 1, m0, 0, 0, 1);
    else gemm_rows(GEMM_MASKED, n, K, b, ldb, ldb, 1, pack, GEMM_NR, c, ldc, 1, m0, m1, 0, 1);
}

/* The full row blocks, with NN's and TN's strides as constants. */
static GEMM_TARGET void gemm_strip_nn_full(int64_t m, int64_t K, const float *a, int64_t lda,
                                           const float *b, int64_t ldb, float *c,
                                           int64_t ldc, int from_c) {
    gemm_strip(GEMM_FULL, 0, m, K, a, lda, b, ldb, c, ldc, 0xffff, 0xffff, from_c);
}
static GEMM_TARGET void gemm_strip_tn_full(int64_t m, int64_t K, const float *a, int64_t lda,
                                           const float *b, int64_t ldb, float *c,
                                           int64_t ldc, int from_c) {
    gemm_strip(GEMM_FULL, 1, m, K, a, lda, b, ldb, c, ldc, 0xffff, 0xffff, from_c);
}
static GEMM_TARGET void gemm_strip_masked(int trans_a, int64_t m, int64_t K, const float *a,
                                          int64_t lda, const float *b, int64_t ldb, float *c,
                                          int64_t ldc, __mmask16 m0, __mmask16 m1,
                                          int from_c) {
    if (m1 == 0 && trans_a) gemm_strip(GEMM_HALF, 1, m, K, a, lda, b, ldb, c, ldc, m0, 0, from_c);
    else if (m1 == 0) gemm_strip(GEMM_HALF, 0, m, K, a, lda, b, ldb, c, ldc, m0, 0, from_c);
    else if (trans_a) gemm_strip(GEMM_MASKED, 1, m, K, a, lda, b, ldb, c, ldc, m0, m1, from_c);
    else gemm_strip(GEMM_MASKED, 0, m, K, a, lda, b, ldb, c, ldc, m0, m1, from_c);
}

/* 16 rows of 16 floats (src, stride ld) -> their transpose (dst, stride
   GEMM_NR): columns j .. j+15 of a packed strip for k .. k+15. */
GEMM_INLINE void transpose16(const float *src, int64_t ld, float *dst) {
    __m512 r[16], t[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_ps(src + i * ld);
#pragma GCC unroll 8
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
#pragma GCC unroll 4
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i]),
                                                   _mm512_castps_pd(t[i + 2])));
        r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i]),
                                                       _mm512_castps_pd(t[i + 2])));
        r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i + 1]),
                                                       _mm512_castps_pd(t[i + 3])));
        r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i + 1]),
                                                       _mm512_castps_pd(t[i + 3])));
    }
    /* r[4q + s] holds, in each 128-bit lane l, column 4l + s' of rows
       4q .. 4q+3 (s' = s's position in the unpack order: 0, 1, 2, 3 for
       s = 0, 1, 2, 3). Gather lanes: first across groups q (0,1) and (2,3). */
#pragma GCC unroll 4
    for (int s = 0; s < 4; s++) {
        t[s] = _mm512_shuffle_f32x4(r[s], r[4 + s], 0x88);       /* lanes 0,2 | 0,2 */
        t[4 + s] = _mm512_shuffle_f32x4(r[s], r[4 + s], 0xdd);   /* lanes 1,3 | 1,3 */
        t[8 + s] = _mm512_shuffle_f32x4(r[8 + s], r[12 + s], 0x88);
        t[12 + s] = _mm512_shuffle_f32x4(r[8 + s], r[12 + s], 0xdd);
    }
#pragma GCC unroll 4
    for (int s = 0; s < 4; s++) {
        /* t[s]: lanes (q0 l0, q0 l2, q1 l0, q1 l2); t[8+s]: (q2 l0, q2 l2,
           q3 l0, q3 l2). Column 4l + s over rows 0..15: lanes q0..q3 of l. */
        __m512 l0 = _mm512_shuffle_f32x4(t[s], t[8 + s], 0x88);      /* l0: q0 q1 q2 q3 */
        __m512 l2 = _mm512_shuffle_f32x4(t[s], t[8 + s], 0xdd);      /* l2 */
        __m512 l1 = _mm512_shuffle_f32x4(t[4 + s], t[12 + s], 0x88); /* l1 */
        __m512 l3 = _mm512_shuffle_f32x4(t[4 + s], t[12 + s], 0xdd); /* l3 */
        _mm512_storeu_ps(dst + (0 + s) * GEMM_NR, l0);
        _mm512_storeu_ps(dst + (4 + s) * GEMM_NR, l1);
        _mm512_storeu_ps(dst + (8 + s) * GEMM_NR, l2);
        _mm512_storeu_ps(dst + (12 + s) * GEMM_NR, l3);
    }
}

/* Columns j0 .. j0+w-1 of op(B) = B^T (B row j at b + j * ldb, k
   contiguous) into pack[k * GEMM_NR + j - j0] for k < K. */
static GEMM_TARGET void gemm_pack_bt(int64_t K, int64_t w, const float *b, int64_t ldb,
                                     float *pack) {
    int64_t k = 0;
    if (w == GEMM_NR) {
        for (; k + 16 <= K; k += 16) {
            transpose16(b + k, ldb, pack + k * GEMM_NR);
            transpose16(b + 16 * ldb + k, ldb, pack + k * GEMM_NR + 16);
        }
    }
    for (int64_t j = 0; j < w; j++)
        for (int64_t kk = k; kk < K; kk++) pack[kk * GEMM_NR + j] = b[j * ldb + kk];
}

/* Rows k < K of op(B)'s columns j0 .. j0+w-1 (B row k at b + k * ldb)
   into pack[k * GEMM_NR + j - j0]: NN's and TN's strip, contiguous. */
static GEMM_TARGET void gemm_pack_b(int64_t K, int64_t w, const float *b, int64_t ldb,
                                    float *pack) {
    __mmask16 m0 = gemm_mask_lo(w), m1 = gemm_mask_hi(w);
    for (int64_t k = 0; k < K; k++) {
        _mm512_store_ps(pack + k * GEMM_NR, _mm512_maskz_loadu_ps(m0, b + k * ldb));
        _mm512_store_ps(pack + k * GEMM_NR + 16, _mm512_maskz_loadu_ps(m1, b + k * ldb + 16));
    }
}

/* Rows k < K of A^T's block (TN: A row k at a + k * lda, mc contiguous
   floats) into panels of GEMM_MR rows of op(A), each contiguous:
   op(A)[i, k] at pack[(i / GEMM_MR) * GEMM_MR * K + k * GEMM_MR + i % GEMM_MR]. */
static GEMM_TARGET void gemm_pack_at(int64_t K, int64_t mc, const float *a, int64_t lda,
                                     float *pack) {
    for (int64_t p = 0; p < mc; p += GEMM_MR) {
        int64_t r = mc - p < GEMM_MR ? mc - p : GEMM_MR;
        __mmask16 mask = (__mmask16)((1u << r) - 1);
        float *dst = pack + p * K;
        const float *src = a + p;
        for (int64_t k = 0; k < K; k++)
            _mm512_mask_storeu_ps(dst + k * GEMM_MR, mask,
                                  _mm512_maskz_loadu_ps(mask, src + k * lda));
    }
}

/* All rows of one column strip from gemm_pack_at's panels (row i's at
   pa + i * K: panel i / GEMM_MR, row i % GEMM_MR). */
static GEMM_TARGET void gemm_strip_panels_full(int64_t m, int64_t K, const float *pa,
                                               const float *b, int64_t ldb, float *c,
                                               int64_t ldc, int from_c) {
    gemm_rows(GEMM_FULL, m, K, pa, K, 1, GEMM_MR, b, ldb, c, ldc, ldc, 0xffff, 0xffff, from_c,
              0);
}
static GEMM_TARGET void gemm_strip_panels_masked(int64_t m, int64_t K, const float *pa,
                                                 const float *b, int64_t ldb, float *c,
                                                 int64_t ldc, __mmask16 m0, __mmask16 m1,
                                                 int from_c) {
    if (m1 == 0)
        gemm_rows(GEMM_HALF, m, K, pa, K, 1, GEMM_MR, b, ldb, c, ldc, ldc, m0, 0, from_c, 0);
    else gemm_rows(GEMM_MASKED, m, K, pa, K, 1, GEMM_MR, b, ldb, c, ldc, ldc, m0, m1, from_c, 0);
}

/* C (m x n, ldc) = op(A) @ op(B); trans_a, trans_b: 0 or 1.

   Blocks of GEMM_KC along k, each block's chains going on from the last
   block's partial sums in C (the same FMAs in the same order), and in
   each, op(B)'s columns nc_max at a time: packed (`pack_b`, and always
   for NT) into contiguous strips of GEMM_NR (GEMM_KC x GEMM_NR floats, 32
   KiB: in L1 while every row block of GEMM_MC rows runs over it), each
   strip at pack + j * GEMM_KC; in TN with `pack_a` (not NULL) op(A)'s
   block of GEMM_MC rows too, in panels (gemm_pack_at: in L2 while every
   strip runs over it). NN's op(A) is read in place (its rows are
   contiguous in k), and TN's without pack_a. */
static GEMM_TARGET void gemm_blocks(int trans_a, int trans_b, int64_t m, int64_t n, int64_t K,
                                    const float *a, int64_t lda, const float *b, int64_t ldb,
                                    float *c, int64_t ldc, float *pack, int64_t nc_max,
                                    int pack_b, float *pack_a) {
    /* Nothing packed: op(B)'s strip over all of k, read in place. Else
       blocks of at most GEMM_KC, as even as multiples of 16 make them (a
       short last block reloads C's partial sums for little work). */
    int64_t kstep = K > 0 ? K : 1;
    if (pack_b || trans_b || pack_a != NULL) {
        int64_t blocks = (K + GEMM_KC - 1) / GEMM_KC;
        kstep = blocks > 1 ? ((K + blocks - 1) / blocks + 15) / 16 * 16 : GEMM_KC;
    }
    for (int64_t jc = 0; jc < n; jc += nc_max) {
        int64_t nc = n - jc < nc_max ? n - jc : nc_max;
        /* K = 0 still writes C's zeros (one block of no k). */
        for (int64_t k0 = 0; k0 == 0 || k0 < K; k0 += kstep) {
            int64_t kc = K - k0 < kstep ? K - k0 : kstep;
            for (int64_t j = 0; j < nc && (pack_b || trans_b); j += GEMM_NR) {
                int64_t w = nc - j < GEMM_NR ? nc - j : GEMM_NR;
                float *strip = pack + j * GEMM_KC;
                if (trans_b) gemm_pack_bt(kc, w, b + (jc + j) * ldb + k0, ldb, strip);
                else gemm_pack_b(kc, w, b + k0 * ldb + jc + j, ldb, strip);
            }
            for (int64_t i0 = 0; i0 < m; i0 += GEMM_MC) {
                int64_t mc = m - i0 < GEMM_MC ? m - i0 : GEMM_MC;
                const float *ai = trans_a ? a + k0 * lda + i0 : a + i0 * lda + k0;
                if (pack_a != NULL) gemm_pack_at(kc, mc, ai, lda, pack_a);
                float *ci = c + i0 * ldc + jc;
                for (int64_t j = 0; j < nc; j += GEMM_NR) {
                    int64_t w = nc - j < GEMM_NR ? nc - j : GEMM_NR;
                    const float *bj = b + k0 * ldb + jc + j;
                    int64_t ld = ldb;
                    if (pack_b || trans_b) {
                        bj = pack + j * GEMM_KC;
                        ld = GEMM_NR;
                    }
                    __mmask16 m0 = gemm_mask_lo(w), m1 = gemm_mask_hi(w);
                    if (pack_a != NULL && w == GEMM_NR)
                        gemm_strip_panels_full(mc, kc, pack_a, bj, ld, ci + j, ldc, k0 > 0);
                    else if (pack_a != NULL)
                        gemm_strip_panels_masked(mc, kc, pack_a, bj, ld, ci + j, ldc, m0, m1,
                                                 k0 > 0);
                    else if (w == GEMM_NR && trans_a)
                        gemm_strip_tn_full(mc, kc, ai, lda, bj, ld, ci + j, ldc, k0 > 0);
                    else if (w == GEMM_NR)
                        gemm_strip_nn_full(mc, kc, ai, lda, bj, ld, ci + j, ldc, k0 > 0);
                    else
                        gemm_strip_masked(trans_a, mc, kc, ai, lda, bj, ld, ci + j, ldc, m0, m1,
                                          k0 > 0);
                }
            }
        }
    }
}

/* C (m x n, ldc) = op(A) @ B^T (NT, or TT) as C^T = B @ op(A)^T, 32 of
   C's rows at a time: op(A)^T's strip packed (K x 32 floats in `pack`),
   B's rows broadcast in place (gemm_strip_ct_full). Where m < n this
   packs m x K floats where gemm_blocks packs B^T's n x K (demo_functional's
   32x512 @ (512x512)^T: 16 times less), for a transposed write of each of
   C's m x n elements: native_sgemm_avx512 takes it where the packing it
   saves, K (n - m), is at least GEMM_NT_BY_ROWS times that, m n. Measured
   on one core (issue 16, twenty-second pass): 32x512 @ (512x512)^T 181 ->
   242 GFLOP/s, 128x784 @ (784x512)^T 231 -> 247, 128x512 @ (512x512)^T
   236 -> 245; the CNN's 128x10 @ (4096x10)^T, taken at first (m < n),
   0.12 -> 0.31 ms. */
static GEMM_TARGET void gemm_nt_by_rows(int trans_a, int64_t m, int64_t n, int64_t K,
                                        const float *a, int64_t lda, const float *b,
                                        int64_t ldb, float *c, int64_t ldc, float *pack) {
    for (int64_t i = 0; i < m; i += GEMM_NR) {
        int64_t w = m - i < GEMM_NR ? m - i : GEMM_NR;
        if (trans_a) gemm_pack_b(K, w, a + i, lda, pack);
        else gemm_pack_bt(K, w, a + i * lda, lda, pack);
        if (w == GEMM_NR) {
            gemm_strip_ct_full(n, K, b, ldb, pack, c + i * ldc, ldc);
        } else {
            __mmask16 m0 = gemm_mask_lo(w), m1 = gemm_mask_hi(w);
            gemm_strip_ct_masked(n, K, b, ldb, pack, c + i * ldc, ldc, m0, m1);
        }
    }
}

/* C (m x n, ldc) = op(A) @ op(B) (gemm_blocks): a large product (see
   GEMM_PACK_B_ROWS) packed in the thread's scratch; else, and where
   memory is short, strip by strip, NT's strip packed on the stack. */
static GEMM_TARGET void native_sgemm_avx512(int trans_a, int trans_b, int64_t m, int64_t n,
                                            int64_t K, const float *a, int64_t lda,
                                            const float *b, int64_t ldb, float *c,
                                            int64_t ldc) {
    if (m <= 0 || n <= 0) return;
    int pack_b = m >= GEMM_PACK_B_ROWS && K >= GEMM_PACK_B_K && K * n > GEMM_PACK_B_FLOATS;
    if (trans_b && !pack_b && K * (n - m) >= GEMM_NT_BY_ROWS * m * n
        && K * GEMM_NR <= GEMM_PACK_FLOATS) {
        char *scratch = thread_scratch(SCRATCH_GEMM, GEMM_PACK_FLOATS * 4 + 64);
        if (scratch != NULL) {
            gemm_nt_by_rows(trans_a, m, n, K, a, lda, b, ldb, c, ldc,
                            (float *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63));
            return;
        }
    }
    int pack_a = pack_b && trans_a && n >= GEMM_PACK_A_COLUMNS;
    char *scratch = pack_a || pack_b
                        ? thread_scratch(SCRATCH_GEMM, GEMM_PACK_FLOATS * 4 + 64) : NULL;
    if (scratch != NULL) {
        float *pack = (float *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
        gemm_blocks(trans_a, trans_b, m, n, K, a, lda, b, ldb, c, ldc, pack, GEMM_NC, pack_b,
                    pack_a ? pack + GEMM_KC * GEMM_NC : NULL);
    } else {
        float pack[GEMM_KC * GEMM_NR] __attribute__((aligned(64)));
        gemm_blocks(trans_a, trans_b, m, n, K, a, lda, b, ldb, c, ldc, pack, GEMM_NR, 0, NULL);
    }
}

#endif /* KERAS_IPU_GEMM_AVX512 */

/* Whether this CPU runs native_sgemm_avx512. */
static int native_sgemm_available(void) {
#ifdef KERAS_IPU_GEMM_AVX512
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma");
#else
    return 0;
#endif
}

#endif /* KERAS_IPU_GEMM_H */
