/** Block storage of a Dense layer pruned by 1 x 4 blocks ("structure": "blocks") whose mask is
 * final ("blocks" in tinytrain/codegen/sparse.py), and kernels that skip the pruned blocks. The
 * masked dense layer of tinytrain/ops/dense.py + graph/prune.py is the specification; every
 * kernel here equals it bit for bit.
 *
 * Block j of row n of w[N][K] is w[n][4j .. 4j + 3] (the last of a row holds K % 4 weights when
 * 4 does not divide K); a block is kept or pruned whole. The kept weights are packed in element
 * order (row by row, as tt_sparse_rows.h: the int32 master, accumulator and momentum too). The
 * code, uint8 in flash: code[n] the kept blocks of row n, then each row's kept block indices j,
 * increasing, from code + N. So ceil(K / 4) <= 255 (K <= 1020; and K <= TT_DENSE_S32_MAX_K,
 * N <= TT_DENSE_S32_MAX_N: every sum is an exact int32). One byte per kept block and one per row:
 * W1 at 80 % takes 1,104 of dense's 4,736 bytes.
 *
 * Why blocks: four consecutive inputs are one word of x; the forward widens x to int16 pairs
 * once, then a kept block is its index byte, one LDRD of x, one LDRD of the weights and two
 * SMLADs on the Cortex-M4 (8 instructions, 2 per kept weight); the input error one LDRD of the
 * weights, two LDRD / STRD of the sums and four SMLABB / SMLABT (14); the fused update the
 * SMLAWB / SMLAWT steps of two pairs, SSUB16 and the exact saturation guard (23). Rows of a K
 * that 4 divides, 4-byte aligned (W1), take loops with no tail or alignment test. The input
 * error and the update pass a row whose error is 0 whole, like the rows format, and the update a
 * row whose steps all round to 0 (m_t |e| 128 < 2^(s - 1)) too (its bias still updated). Since the
 * code is a constant, codegen unrolls the forward's rows from it on DSP cores
 * (tt_sparse_blocks_fwd_rows_s8, TT_SPARSE_BLOCKS_UNROLL): 4 instructions a kept block, no index.
 *
 * The parameters and layouts are tt_sparse_rows.h's structs, their code being the block code.
 * The element-by-element paths (stochastic rounding, decay, masters, accumulate, end of batch)
 * are tt_sparse_rows.c's walks over the block code: same PRNG order as the dense tensor,
 * saturations of pruned elements not counted. */
#ifndef TT_SPARSE_BLOCKS_H
#define TT_SPARSE_BLOCKS_H

#include <stdint.h>
#include "tt_sparse_rows.h"

#ifdef __cplusplus
extern "C" {
#endif

/** tt_dense_fwd_s8 over the kept blocks. Scratch: N + K / 2 int32 (within TT_SPARSE_BUFFER_SIZE). */
int32_t tt_sparse_blocks_fwd_s8(const tt_ctx *ctx, const tt_sparse_rows_params *p, const int8_t *x,
                                int32_t ex, int8_t *y);

/** tt_dense_bwd_s8 (dx = requant(w^T e), pre-update weights) over the kept blocks. Scratch: K int32. */
int32_t tt_sparse_blocks_bwd_s8(const tt_ctx *ctx, const tt_sparse_rows_params *p, const int8_t *e,
                                int32_t ee, int8_t *dx);

/** The packed weight gradient gw[nnz] = e[n] x[k] of the kept (n, k), element order (exponent
 *  ee + ex), and gb[N] = e[n] (exponent ee). */
void tt_sparse_blocks_grad_s32(const tt_sparse_rows_params *p, const int8_t *e, const int8_t *x,
                               int32_t *gw, int32_t *gb);

/** tt_sgd_dense_direct_s16 / _s32 on the kept weights (element order, then biases, same PRNG order). */
void tt_sparse_blocks_sgd_direct_s16(const tt_sgd_step *u, const tt_sparse_rows_sgd_s16_params *p,
                                     const int8_t *e, int32_t ee, const int8_t *x, int32_t ex);
void tt_sparse_blocks_sgd_direct_s32(const tt_sgd_step *u, const tt_sparse_rows_sgd_s32_params *p,
                                     const int8_t *e, int32_t ee, const int8_t *x, int32_t ex);

/** tt_sgd_accumulate_s32 on the packed accumulator A[nnz] with the packed gradient g[nnz]. */
void tt_sparse_blocks_sgd_accumulate_s32(const tt_sgd_step *u, const tt_sparse_rows_layout *l, int32_t *A,
                                         int32_t ew, const int32_t *g, int32_t eg);

/** tt_sgd_apply_accumulated_s16 / _s32 / _s16_v16 on packed w, A, V (V NULL: no momentum). */
void tt_sparse_blocks_sgd_apply_accumulated_s16(const tt_sgd_step *u, const tt_sparse_rows_layout *l,
                                                int16_t *w, int32_t *A, int32_t *V);
void tt_sparse_blocks_sgd_apply_accumulated_s32(const tt_sgd_step *u, const tt_sparse_rows_layout *l,
                                                int32_t *w, int32_t *A, int32_t *V);
void tt_sparse_blocks_sgd_apply_accumulated_s16_v16(const tt_sgd_step *u, const tt_sparse_rows_layout *l,
                                                    int16_t *w, int32_t *A, int16_t *V);

/** The kept weights of a block code of w[N][K]. */
int32_t tt_sparse_blocks_count(const uint8_t *code, int32_t K, int32_t N);

/** The kept weights of row n of a block code (its blocks' sizes). */
int32_t tt_sparse_blocks_row_count(const uint8_t *code, int32_t K, int32_t N, int32_t n);

/** The columns of the kept weights of row n into cols (at most K); returns how many. */
int32_t tt_sparse_blocks_columns(const uint8_t *code, int32_t K, int32_t N, int32_t n, int32_t *cols);

/** The forward's rows unrolled by codegen from a layer's code (the code is a constant in flash, so
 *  its block offsets can be immediates): acc[n] = tt_sparse_blocks_bias(b[n], d1) + the row's
 *  kept blocks (tt_sparse_blocks_mac), xx the input widened to int16 pairs (two words per block
 *  of four inputs), w the packed weights (4-byte aligned); returns the OR of every
 *  acc[n] ^ (acc[n] >> 31) (tt_requant_s8_from_s32_or's m). */
typedef uint32_t (*tt_sparse_blocks_rows_fn)(const uint32_t *xx, const int16_t *w, const int32_t *b, int32_t d1,
                                             int32_t *acc);

/** tt_sparse_blocks_fwd_s8 with the rows by `rows` (a generated tt_sparse_blocks_rows_fn for this
 *  layer's code) when every block is full, every row 4-byte aligned and the biases take a plain
 *  rounding shift d = ex + ew - eb in [1, 31]; else (and without TT_SPARSE_BLOCKS_UNROLL) the
 *  generic kernel. Scratch: N + K / 2 int32, as tt_sparse_blocks_fwd_s8. */
int32_t tt_sparse_blocks_fwd_rows_s8(const tt_ctx *ctx, const tt_sparse_rows_params *p, const int8_t *x,
                                     int32_t ex, int8_t *y, tt_sparse_blocks_rows_fn rows);

/** 1 where generated code may define a tt_sparse_blocks_rows_fn (Cortex-M with the DSP
 *  instructions, GCC-style inline asm): one row's block is then two LDRDs at immediate offsets
 *  and two SMLADs (4 instructions against the generic loop's 8, and no per-block index). */
#if defined(__ARM_FEATURE_DSP) && __ARM_FEATURE_DSP && defined(__GNUC__)
#include "tt_dsp.h"
#if TT_HAVE_DSP
#define TT_SPARSE_BLOCKS_UNROLL 1
#endif
#endif
#ifndef TT_SPARSE_BLOCKS_UNROLL
#define TT_SPARSE_BLOCKS_UNROLL 0
#endif

#if TT_SPARSE_BLOCKS_UNROLL
#define TT_SPARSE_BLOCKS_NOINLINE __attribute__((noinline))

/** round(b / 2^(d1 + 1)), d1 in [0, 30], as (t >> 1) + (t & 1), t = b >> d1 (tt_rshift_round_s32
 *  without the overflow of ((b >> d1) + 1) >> 1 at b = INT32_MAX). */
static inline int32_t tt_sparse_blocks_bias(int32_t b, int32_t d1)
{
    const int32_t t = b >> d1;
    return (t >> 1) + (t & 1);
}

/** a += the four products of a kept block: its widened inputs at byte offset XO of xx and its
 *  weights at byte offset WO of w (literal constants, multiples of 4 in [0, 1020]). */
#define TT_SPARSE_BLOCKS_MAC(a, xx, XO, w, WO)                                                     \
    do {                                                                                          \
        int32_t x0_, x1_, w0_, w1_;                                                               \
        __asm__("ldrd %0, %1, [%4, #" #XO "]\n\tldrd %2, %3, [%5, #" #WO "]"                      \
                : "=&r"(x0_), "=&r"(x1_), "=r"(w0_), "=r"(w1_)                                    \
                : "r"(xx), "r"(w), "m"(*(const uint32_t(*)[(XO) / 4 + 2])(xx)),                   \
                  "m"(*(const int16_t(*)[(WO) / 2 + 4])(w)));                                     \
        (a) = __smlad(x0_, w0_, (a));                                                             \
        (a) = __smlad(x1_, w1_, (a));                                                             \
    } while (0)
#endif

/** tt_sparse_blocks_sgd_direct_s16 whole (weights and biases) when every block is full, every row
 *  4-byte aligned, the core has the DSP instructions and the fast rules apply (no stochastic
 *  rounding, no decay, 0 <= m_t < 2^15, the weights' and the biases' shifts in [1, 31]): returns 1;
 *  else 0, nothing written. */
int32_t tt_sparse_blocks_direct_full(const tt_sgd_step *u, const tt_sparse_rows_sgd_s16_params *p,
                                     const int8_t *e, int32_t ee, const int8_t *x, int32_t ex);

/** The fused direct update's fast path (no stochastic rounding, no decay, 0 <= m_t < 2^15,
 *  s = ew + k - (ee + ex) in [1, 31]) on the packed int16 weights; returns 0, nothing written,
 *  when it does not apply exactly (then the element walk runs), 2 when it also did the biases
 *  (tt_sgd_dense_bias_s32's fast rule, in its row loop), else 1 (the biases left to the caller). */
int32_t tt_sparse_blocks_fast_s16(const tt_sgd_step *u, const tt_sparse_rows_sgd_s16_params *p, int32_t s,
                                  const int8_t *e, const int8_t *x, int32_t ee);

#ifdef __cplusplus
}
#endif

#endif /* TT_SPARSE_BLOCKS_H */
