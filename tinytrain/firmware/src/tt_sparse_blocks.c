/** Dense layers pruned by 1 x 4 blocks, stored by blocks (tt_sparse_blocks.h): the block code's
 *  helpers and the kernels that use the blocks (forward, input error, gradient, the fused
 *  update); the element walks are tt_sparse_rows.c's. */
#include "tt_sparse_blocks.h"
#include "tt_dense.h"
#include "tt_dsp.h"

/* Weights of block j of a row of K: 4, the last K % 4 when 4 does not divide K. */
static int32_t tt_blocks_size(int32_t K, int32_t j)
{
    const int32_t r = K - 4 * j;
    return r < 4 ? r : 4;
}

/* The kept weights of the blocks [s, end) of a row (the short block, if there, last). */
static int32_t tt_blocks_weights(const uint8_t *s, const uint8_t *end, int32_t K)
{
    const int32_t m = 4 * (int32_t)(end - s);
    return (K & 3) && end > s && end[-1] == (uint32_t)K / 4u ? m - 4 + (K & 3) : m;
}

int32_t tt_sparse_blocks_row_count(const uint8_t *code, int32_t K, int32_t N, int32_t n)
{
    const uint8_t *s = code + N;
    int32_t i;
    for (i = 0; i < n; i++) s += code[i];
    return tt_blocks_weights(s, s + code[n], K);
}

int32_t tt_sparse_blocks_count(const uint8_t *code, int32_t K, int32_t N)
{
    const uint8_t *s = code + N;
    int32_t n, c = 0;
    for (n = 0; n < N; n++) {
        c += tt_blocks_weights(s, s + code[n], K);
        s += code[n];
    }
    return c;
}

int32_t tt_sparse_blocks_columns(const uint8_t *code, int32_t K, int32_t N, int32_t n, int32_t *cols)
{
    const uint8_t *s = code + N;
    int32_t i, c, m = 0;
    for (i = 0; i < n; i++) s += code[i];
    for (i = 0; i < code[n]; i++) {
        const int32_t a = 4 * s[i], b = a + tt_blocks_size(K, s[i]);
        for (c = a; c < b; c++) cols[m++] = c;
    }
    return m;
}

#if !TT_HAVE_DSP
/* The kept blocks of a row [s, end) split: the full ones first, *tail the weights of the last one
 * when it is the short block of a K that 4 does not divide (0 else). */
static const uint8_t *tt_blocks_full_end(const uint8_t *s, const uint8_t *end, int32_t K, int32_t *tail)
{
    *tail = (K & 3) && end > s && end[-1] == (uint32_t)K / 4u ? K & 3 : 0;
    return *tail ? end - 1 : end;
}
#endif

#if TT_HAVE_DSP
#if defined(__GNUC__)
#define TT_BLOCKS_INLINE static inline __attribute__((always_inline))
#define TT_BLOCKS_NOINLINE static __attribute__((noinline)) /* its own registers: the callers' loops stay lean */
#define TT_BLOCKS_UNLIKELY(c) __builtin_expect((c), 0)
#else
#define TT_BLOCKS_UNLIKELY(c) (c)
#define TT_BLOCKS_INLINE static inline
#define TT_BLOCKS_NOINLINE static
#endif

/* SXTB16 of v rotated right by 8 (bytes 1 and 3 sign-extended into the lanes): one instruction
 * on the target (GCC 12 forms a separate ROR). */
#if defined(__ARM_FEATURE_DSP) && __ARM_FEATURE_DSP
static inline uint32_t tt_blocks_sxtb16_ror8(uint32_t v)
{
    uint32_t r;
    __asm__("sxtb16 %0, %1, ror #8" : "=r"(r) : "r"(v));
    return r;
}
#else
static inline uint32_t tt_blocks_sxtb16_ror8(uint32_t v)
{
    return (uint32_t)__sxtb16((int32_t)((v >> 8) | (v << 24)));
}
#endif

/* tt_widen_s8(x, n, 0, xx), n a multiple of 4: per four inputs one LDR, the two SXTB16 (one
 * instruction each here), PKHBT, PKHTB and one STRD. */
static inline void tt_blocks_widen0(const int8_t *x, int32_t n, uint32_t *xx)
{
    const int8_t *const end = x + n;
    for (; x != end; x += 4, xx += 2) {
        const uint32_t v = tt_ld_s8x4(x), ev = (uint32_t)__sxtb16((int32_t)v), od = tt_blocks_sxtb16_ror8(v);
        xx[0] = tt_pack_lo(ev, od);
        xx[1] = tt_pack_hi(ev, od);
    }
}

/* The full blocks [s, end) of a row into a: per block its index byte, the widened input pair
 * xx[2j], xx[2j + 1] (one LDRD), the weights (one LDRD when the row is 4-byte aligned: AL, a
 * constant after inlining, else two LDRs) and two SMLADs. Returns the weights past the blocks. */
TT_BLOCKS_INLINE const int16_t *tt_blocks_dot(const uint8_t *s, const uint8_t *end, const uint32_t *xx,
                                              const int16_t *w, int32_t *pa, int32_t AL)
{
    int32_t a = *pa;
    for (; s != end; s++) {
        int32_t X0, X1;
        uint32_t W0, W1;
        tt_ld_s32x2((const int32_t *)(const void *)(xx + 2u * *s), &X0, &X1);
        if (AL) tt_ld_s16x4_next(&w, &W0, &W1);
        else { W0 = tt_ld_s16x2(w); W1 = tt_ld_s16x2(w + 2); w += 4; }
        a = __smlad(X0, (int32_t)W0, a);
        a = __smlad(X1, (int32_t)W1, a);
    }
    *pa = a;
    return w;
}

/* The forward's rows when every block is full and every row 4-byte aligned, the biases on the
 * sums' exponent by a plain rounding shift d in [1, 31]: acc[n] = round(b[n] / 2^d) + the row's
 * blocks; returns the OR of every acc ^ (acc >> 31) (tt_requant_s8_from_s32_or). Pointer steps
 * and few live values: the per-row cost is a handful of instructions. */
TT_BLOCKS_NOINLINE uint32_t tt_blocks_fwd_full(const uint8_t *cnt, int32_t N, const uint32_t *xx, const int16_t *w,
                                   const int32_t *b, int32_t d, int32_t *acc)
{
    const uint8_t *s = cnt + N, *const cend = cnt + N;
    uint32_t m = 0;
    const int32_t d1 = d - 1;
    for (; cnt != cend; cnt++) {
        const uint8_t *end = s + *cnt;
        /* tt_rshift_round_s32(b, d), d >= 1, as (t >> 1) + (t & 1), t = b >> (d - 1): b >> d plus
         * bit d - 1 of b (((b >> (d - 1)) + 1) >> 1 overflows for d = 1 and b = INT32_MAX) */
        const int32_t t = *b++ >> d1;
        int32_t a = (t >> 1) + (t & 1);
        for (; s != end; s++) { /* tt_blocks_dot with the row's own pointer: no copy of it */
            int32_t X0, X1;
            uint32_t W0, W1;
            tt_ld_s32x2((const int32_t *)(const void *)(xx + 2u * *s), &X0, &X1);
            tt_ld_s16x4_next(&w, &W0, &W1);
            a = __smlad(X0, (int32_t)W0, a);
            a = __smlad(X1, (int32_t)W1, a);
        }
        *acc++ = a;
        m |= (uint32_t)(a ^ (a >> 31));
    }
    return m;
}

/* The four int32 sums q[0..3] (4-byte aligned) of a block: two LDRDs, then two STRDs at q and q + 8
 * bytes (immediate offsets: no second pointer). */
#if defined(__ARM_FEATURE_DSP) && __ARM_FEATURE_DSP
static inline void tt_blocks_ld_s32x4(const int32_t *q, int32_t *a0, int32_t *a1, int32_t *a2, int32_t *a3)
{
    __asm__("ldrd %0, %1, [%4]\n\tldrd %2, %3, [%4, #8]"
            : "=&r"(*a0), "=&r"(*a1), "=r"(*a2), "=r"(*a3) : "r"(q), "m"(*(const int32_t(*)[4])q));
}

static inline void tt_blocks_st_s32x4(int32_t *q, int32_t a0, int32_t a1, int32_t a2, int32_t a3)
{
    __asm__("strd %1, %2, [%5]\n\tstrd %3, %4, [%5, #8]"
            : "=m"(*(int32_t(*)[4])q) : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(q));
}
#else
static inline void tt_blocks_ld_s32x4(const int32_t *q, int32_t *a0, int32_t *a1, int32_t *a2, int32_t *a3)
{
    *a0 = q[0];
    *a1 = q[1];
    *a2 = q[2];
    *a3 = q[3];
}

static inline void tt_blocks_st_s32x4(int32_t *q, int32_t a0, int32_t a1, int32_t a2, int32_t a3)
{
    q[0] = a0;
    q[1] = a1;
    q[2] = a2;
    q[3] = a3;
}
#endif

/* acc[c .. c + 3] += en w[0..3] of the full blocks [s, end) of a row (acc 4-byte aligned: two
 * LDRDs, four SMLABB / SMLABT, two STRDs a block (tt_blocks_ld_s32x4, _st_s32x4); the weights
 * by LDRD when AL). Returns the weights past the blocks. */
TT_BLOCKS_INLINE const int16_t *tt_blocks_scatter(const uint8_t *s, const uint8_t *end, int32_t *acc,
                                                  const int16_t *w, int32_t en, int32_t AL)
{
    for (; s != end; s++) {
        int32_t *q = acc + 4u * *s, a0, a1, a2, a3;
        uint32_t W0, W1;
        if (AL) tt_ld_s16x4_next(&w, &W0, &W1);
        else { W0 = tt_ld_s16x2(w); W1 = tt_ld_s16x2(w + 2); w += 4; }
        tt_blocks_ld_s32x4(q, &a0, &a1, &a2, &a3);
        tt_blocks_st_s32x4(q, __smlabb(en, (int32_t)W0, a0), __smlabt(en, (int32_t)W0, a1),
                           __smlabb(en, (int32_t)W1, a2), __smlabt(en, (int32_t)W1, a3));
    }
    return w;
}
#endif

int32_t tt_sparse_blocks_fwd_s8(const tt_ctx *ctx, const tt_sparse_rows_params *p, const int8_t *x,
                                int32_t ex, int8_t *y)
{
    const int32_t N = p->N, K = p->K, eb = p->eb, ea = ex + p->ew, d = ea - eb;
    const uint8_t *s = p->code + N;
    const int16_t *w = p->w;
    int32_t *acc = (int32_t *)(void *)ctx->scratch; /* K <= TT_DENSE_S32_MAX_K: every sum fits int32 */
    int32_t n;
#if TT_HAVE_DSP
    const uint32_t last = (K & 3) ? (uint32_t)K / 4u : 256u; /* the short block's index (none: 256) */
    const int32_t plain = d >= 1 && d <= 31;
    uint32_t *xx = (uint32_t *)(void *)(acc + N); /* x[4j .. 4j + 3] as int16 pairs xx[2j], xx[2j + 1] */
    uint32_t m = 0;
    tt_blocks_widen0(x, K & ~3, xx);
    if ((K & 3) == 0 && ((uintptr_t)w & 3u) == 0 && plain) { /* every block full, every row aligned */
        m = tt_blocks_fwd_full(p->code, N, xx, w, p->b, d, acc);
    } else {
        for (n = 0; n < N; n++) {
            const uint8_t *end = s + p->code[n], *full = end;
            int32_t a = plain ? tt_rshift_round_s32(p->b[n], d) : tt_align_s32(p->b[n], eb, ea), i;
            if (end != s && end[-1] == last) full--;
            if (((uintptr_t)w & 3u) == 0) w = tt_blocks_dot(s, full, xx, w, &a, 1);
            else w = tt_blocks_dot(s, full, xx, w, &a, 0);
            if (full != end)
                for (i = 0; i < (K & 3); i++) a += (int32_t)x[(K & ~3) + i] * (int32_t)*w++;
            s = end;
            acc[n] = a;
            m |= (uint32_t)(a ^ (a >> 31));
        }
    }
    return ea + tt_requant_s8_from_s32_or(acc, N, m, y, ctx->stats);
#else
    if (d >= 1 && d <= 31) /* the common case, a plain rounding shift, said apart (as tt_dense.c) */
        for (n = 0; n < N; n++) acc[n] = tt_rshift_round_s32(p->b[n], d);
    else
        for (n = 0; n < N; n++) acc[n] = tt_align_s32(p->b[n], eb, ea);
    for (n = 0; n < N; n++) {
        const uint8_t *end = s + p->code[n];
        int32_t a = acc[n], tail, i;
        const uint8_t *full = tt_blocks_full_end(s, end, K, &tail);
        for (; s < full; s++) {
            const int8_t *q = x + 4u * *s;
            a += (int32_t)q[0] * w[0] + (int32_t)q[1] * w[1] + (int32_t)q[2] * w[2] + (int32_t)q[3] * w[3];
            w += 4;
        }
        for (i = 0; i < tail; i++) a += (int32_t)x[(K & ~3) + i] * (int32_t)*w++;
        s = end;
        acc[n] = a;
    }
    return ea + tt_requant_s8_from_s32(acc, N, y, ctx->stats);
#endif
}

int32_t tt_sparse_blocks_fwd_rows_s8(const tt_ctx *ctx, const tt_sparse_rows_params *p, const int8_t *x,
                                     int32_t ex, int8_t *y, tt_sparse_blocks_rows_fn rows)
{
#if TT_SPARSE_BLOCKS_UNROLL
    const int32_t N = p->N, K = p->K, ea = ex + p->ew, d = ea - p->eb;
    if ((K & 3) == 0 && ((uintptr_t)p->w & 3u) == 0 && d >= 1 && d <= 31) {
        int32_t *acc = (int32_t *)(void *)ctx->scratch; /* K <= TT_DENSE_S32_MAX_K: every sum fits int32 */
        uint32_t *xx = (uint32_t *)(void *)(acc + N);
        tt_blocks_widen0(x, K, xx);
        return ea + tt_requant_s8_from_s32_or(acc, N, rows(xx, p->w, p->b, d - 1, acc), y, ctx->stats);
    }
#endif
    (void)rows;
    return tt_sparse_blocks_fwd_s8(ctx, p, x, ex, y);
}

int32_t tt_sparse_blocks_bwd_s8(const tt_ctx *ctx, const tt_sparse_rows_params *p, const int8_t *e,
                                int32_t ee, int8_t *dx)
{
    const int32_t K = p->K, N = p->N;
    const uint8_t *s = p->code + N;
    const int16_t *w = p->w;
    int32_t *acc = (int32_t *)(void *)ctx->scratch; /* N <= TT_DENSE_S32_MAX_N: every sum fits int32 */
    int32_t n, k;
#if TT_HAVE_DSP
    const uint32_t last = (K & 3) ? (uint32_t)K / 4u : 256u;
    uint32_t m = 0;
    int32_t *q = acc;
    for (k = 0; k + 4 <= K; k += 4) { /* two STRDs and one loop test per four sums */
        tt_st_s32x2_next(&q, 0, 0);
        tt_st_s32x2_next(&q, 0, 0);
    }
    for (; k < K; k++) acc[k] = 0;
    if ((K & 3) == 0 && ((uintptr_t)w & 3u) == 0) { /* every block full, every row aligned */
        const uint8_t *cnt = p->code;
        for (; cnt != p->code + N; cnt++, e++) {
            const uint8_t *end = s + *cnt;
            if (TT_BLOCKS_UNLIKELY(*e != 0)) tt_blocks_scatter(s, end, acc, w, *e, 1); /* else it adds nothing */
            w += 4 * (end - s);
            s = end;
        }
    } else {
        for (n = 0; n < N; n++) {
            const uint8_t *end = s + p->code[n], *full = end;
            const int32_t en = e[n];
            if (end != s && end[-1] == last) full--;
            if (en == 0) { /* adds nothing: pass the row */
                w += 4 * (full - s) + (full != end ? (K & 3) : 0);
            } else {
                if (((uintptr_t)w & 3u) == 0) w = tt_blocks_scatter(s, full, acc, w, en, 1);
                else w = tt_blocks_scatter(s, full, acc, w, en, 0);
                if (full != end)
                    for (k = 0; k < (K & 3); k++) acc[(K & ~3) + k] += en * *w++;
            }
            s = end;
        }
    }
    {
        const int32_t *r = acc, *const r4 = acc + (K & ~3);
        for (; r != r4;) { /* two LDRDs and one loop test per four sums */
            int32_t a0, a1, a2, a3;
            tt_ld_s32x2_next(&r, &a0, &a1);
            tt_ld_s32x2_next(&r, &a2, &a3);
            m |= (uint32_t)(a0 ^ (a0 >> 31)) | (uint32_t)(a1 ^ (a1 >> 31)) | (uint32_t)(a2 ^ (a2 >> 31))
                 | (uint32_t)(a3 ^ (a3 >> 31));
        }
    }
    for (k = K & ~3; k < K; k++) m |= (uint32_t)(acc[k] ^ (acc[k] >> 31));
    return ee + p->ew + tt_requant_s8_from_s32_or(acc, K, m, dx, ctx->stats);
#else
    for (k = 0; k < K; k++) acc[k] = 0;
    for (n = 0; n < N; n++) {
        const uint8_t *end = s + p->code[n];
        const int32_t en = e[n];
        if (en == 0) { /* adds nothing: pass the row */
            w += tt_blocks_weights(s, end, K);
            s = end;
            continue;
        }
        for (; s < end; s++) {
            const int32_t c = 4 * *s, m = tt_blocks_size(K, *s);
            int32_t *a = acc + c;
            if (m == 4) {
                a[0] += en * w[0];
                a[1] += en * w[1];
                a[2] += en * w[2];
                a[3] += en * w[3];
            } else {
                for (k = 0; k < m; k++) a[k] += en * w[k];
            }
            w += m;
        }
    }
    return ee + p->ew + tt_requant_s8_from_s32(acc, K, dx, ctx->stats);
#endif
}

void tt_sparse_blocks_grad_s32(const tt_sparse_rows_params *p, const int8_t *e, const int8_t *x,
                               int32_t *gw, int32_t *gb)
{
    const int32_t K = p->K, N = p->N;
    const uint8_t *s = p->code + N;
    int32_t n, k;
    for (n = 0; n < N; n++) {
        const uint8_t *end = s + p->code[n];
        const int32_t en = e[n];
        for (; s < end; s++) {
            const int32_t c = 4 * *s, m = tt_blocks_size(K, *s);
            for (k = 0; k < m; k++) *gw++ = en * (int32_t)x[c + k];
        }
    }
    for (n = 0; n < N; n++) gb[n] = e[n];
}

/* The largest |e| whose steps all round to 0 for any int8 x: m_t |e| 128 < 2^(s - 1) gives
 * -2^(s - 1) <= a x < 2^(s - 1) (a = m_t e), so round(a x / 2^s) = floor((a x + 2^(s - 1)) / 2^s)
 * = 0; s in [1, 31], m_t > 0. Such a row changes no weight but an old -32768 over an input not 0,
 * which the contract keeps out of every state (graph/state.py outside_symmetric: refused wherever
 * a state enters), so both builds pass it as they pass a row of error 0. */
static inline uint32_t tt_blocks_ezero(int32_t s, int32_t m_t)
{
    return ((((uint32_t)1 << (s - 1)) - 1u) >> 7) / (uint32_t)m_t;
}

/* w -= round(a x[k] / 2^s), a = m_t e[n], on the blocks [st, end) of a row (s in [1, 31],
 * |a x| < 2^29: the rounding shift of an int32), saturating to [-32767, 32767] and counted; a
 * weight whose input is 0 keeps its value (as tt_sparse_rows.c). Returns the saturations. */
static uint32_t tt_blocks_row_s16(int16_t *w, const uint8_t *st, const uint8_t *end, int32_t K, const int8_t *x,
                                  int32_t a, int32_t s)
{
    uint32_t nsat = 0;
    int32_t k;
    for (; st < end; st++) {
        const int32_t c = 4 * *st, m = tt_blocks_size(K, *st);
        for (k = 0; k < m; k++) {
            const int32_t q = a * (int32_t)x[c + k];
            if (q != 0) { /* a != 0 here: q == 0 is an input 0, and the weight keeps its value */
                int32_t v = (int32_t)w[k] - ((q >> s) + ((q >> (s - 1)) & 1));
                if (v > TT_S16_MAX || v < -TT_S16_MAX) {
                    nsat++;
                    v = v > 0 ? TT_S16_MAX : -TT_S16_MAX;
                }
                w[k] = (int16_t)v;
            }
        }
        w += m;
    }
    return nsat;
}

#if TT_HAVE_DSP
/* tt_widen_s8(x, n, c, xx), n a multiple of 4: c = 0 (s >= 23) folds its shift and mask away;
 * c = 8 in four instructions per four inputs instead of eight: a lane x 2^8 is the byte x above a
 * zero byte, so the pairs are the bytes masked in place (v << 8 and v under 0xFF00FF00) and
 * packed (PKHBT, PKHTB); no sign extension, no spill to mask. */
static void tt_blocks_widen(const int8_t *x, int32_t n, int32_t c, uint32_t *xx)
{
    const int8_t *end = x + n;
    if (c == 0) {
        tt_blocks_widen0(x, n, xx);
    } else if (c == 8) {
        for (; x != end; x += 4, xx += 2) {
            const uint32_t v = tt_ld_s8x4(x), t = (v << 8) & 0xFF00FF00u, u = v & 0xFF00FF00u;
            xx[0] = tt_pack_lo(t, u);
            xx[1] = tt_pack_hi(t, u);
        }
    } else {
        tt_widen_s8(x, n, c, xx);
    }
}

/* The full blocks [st, end) of a row by pairs (the fused Dense update's step, tt_sgd.c): per block
 * its index byte, the widened input pairs (one LDRD), the weights (LDRD and STRD when AL, a
 * constant after inlining), the steps D = (d_lo, d_hi) (tt_step_s16x2) and S = W - D lane-wise
 * with SSUB16 (|d| <= 16383), the Q flag raised exactly when a lane's v = w - d is outside
 * [-32767, 32767] (a saturation, or an old -32768: tt_sgd.c's tt_sgd_s16x2 guard, SSAT16 #15 on
 * SHSUB16(W, D) and on SHSUB16(S, 1)); a lane whose input is 0 steps by 0, as the rule. The Q
 * flag, clear on entry, is read by the caller (tt_blocks_row_undo_s16 on a hit). The cheaper
 * guard of tt_sgd.c's row pass (SSAT16 on the old weights, exact for |w| < 2^14) would send most
 * rows to the redo here: a pruned layer keeps its large weights (W1 80 %: a third of the kept
 * weights above 2^14, nine blocks in ten with one). */
TT_BLOCKS_INLINE void tt_blocks_row_fast_s16(int16_t *w, const uint8_t *st, const uint8_t *end, const uint32_t *xx,
                                             int32_t A, int32_t AL)
{
    for (; st != end; st++) {
        int32_t X0, X1;
        uint32_t W0, W1, D0, D1, S0, S1;
        tt_ld_s32x2((const int32_t *)(const void *)(xx + 2u * *st), &X0, &X1);
        if (AL) tt_ld_s16x4(w, &W0, &W1);
        else { W0 = tt_ld_s16x2(w); W1 = tt_ld_s16x2(w + 2); }
        D0 = tt_step_s16x2(A, (uint32_t)X0);
        D1 = tt_step_s16x2(A, (uint32_t)X1);
        S0 = (uint32_t)__ssub16((int32_t)W0, (int32_t)D0);
        S1 = (uint32_t)__ssub16((int32_t)W1, (int32_t)D1);
        tt_guard_s16x2_15((uint32_t)__shsub16((int32_t)W0, (int32_t)D0));
        tt_guard_s16x2_15((uint32_t)__shsub16((int32_t)W1, (int32_t)D1));
        tt_guard_s16x2_15((uint32_t)__shsub16((int32_t)S0, 0x00010001));
        tt_guard_s16x2_15((uint32_t)__shsub16((int32_t)S1, 0x00010001));
        if (AL) tt_st_s16x4_next(&w, S0, S1);
        else { tt_st_s16x2(w, S0); tt_st_s16x2(w + 2, S1); w += 4; }
    }
}

/* Undo tt_blocks_row_fast_s16 on the blocks [st, end) of a row exactly: SADD16 of the stored
 * w - d (mod 2^16) and the same steps. Leaves the Q flag clear. */
static void tt_blocks_row_undo_s16(int16_t *w, const uint8_t *st, const uint8_t *end, const uint32_t *xx, int32_t A)
{
    for (; st < end; st++, w += 4) {
        const uint32_t *q = xx + 2u * *st;
        tt_st_s16x2(w, (uint32_t)__sadd16((int32_t)tt_ld_s16x2(w), (int32_t)tt_step_s16x2(A, q[0])));
        tt_st_s16x2(w + 2, (uint32_t)__sadd16((int32_t)tt_ld_s16x2(w + 2), (int32_t)tt_step_s16x2(A, q[1])));
    }
    tt_guard_clear();
}
#endif

#if TT_HAVE_DSP
/* One row with a = m_t e[n] != 0 (its blocks [st, end), the full ones [st, full)): the full blocks
 * by tt_blocks_row_fast_s16 when |a| <= amax (A = a 2^sh), the short one, and every block of a row
 * whose pass hit the guard (undone first) or with a larger |a|, by the exact rule. Returns the
 * saturations. */
TT_BLOCKS_INLINE uint32_t tt_blocks_row_update_s16(int16_t *w, const uint8_t *st, const uint8_t *full,
                                                   const uint8_t *end, int32_t K, const int8_t *x, const uint32_t *xx,
                                                   int32_t a, int32_t s, int32_t sh, int32_t amax, int32_t AL)
{
    if ((a < 0 ? -a : a) <= amax) {
        const int32_t A = a * ((int32_t)1 << sh);
        tt_guard_clear();
        tt_blocks_row_fast_s16(w, st, full, xx, A, AL);
        if (!tt_guard_hit()) return full != end ? tt_blocks_row_s16(w + 4 * (full - st), full, end, K, x, a, s) : 0;
        tt_blocks_row_undo_s16(w, st, full, xx, A);
    }
    return tt_blocks_row_s16(w, st, end, K, x, a, s);
}
#endif

#if TT_HAVE_DSP
/* The four steps of block j of a row from its inputs x[4j .. 4j + 3], read as one word v (no
 * widened copy of x): the lanes X02 = (x0, x2), X13 = (x1, x3) times 2^c (C8: c = 8, the bytes
 * masked in place, a byte above a zero byte being x 2^8; else c = 0, SXTB16 of v and of v
 * rotated by 8), then D01 = (d0, d1), D23 = (d2, d3) from SMLAWB / SMLAWT as tt_step_s16x2:
 * d = round(a x / 2^s) exactly for A = a 2^(32 - s - c) within tt_sparse_blocks_fast_s16's amax. */
TT_BLOCKS_INLINE void tt_blocks_steps_x(uint32_t v, int32_t A, int32_t C8, uint32_t *d01, uint32_t *d23)
{
    const int32_t x02 = C8 ? (int32_t)((v << 8) & 0xFF00FF00u) : __sxtb16((int32_t)v);
    const int32_t x13 = C8 ? (int32_t)(v & 0xFF00FF00u) : (int32_t)tt_blocks_sxtb16_ror8(v);
    *d01 = tt_pack_hi((uint32_t)__smlawb(A, x02, 32768), (uint32_t)__smlawb(A, x13, 32768));
    *d23 = tt_pack_hi((uint32_t)__smlawt(A, x02, 32768), (uint32_t)__smlawt(A, x13, 32768));
}

/* tt_blocks_row_fast_s16 with the steps from x itself (tt_blocks_steps_x; rows 4-byte aligned):
 * per block its index byte, one LDR of x, the two step pairs, one LDRD and one STRD of the
 * weights, SSUB16 and the exact guard. */
TT_BLOCKS_INLINE void tt_blocks_row_fast_x(int16_t *w, const uint8_t *st, const uint8_t *end, const int8_t *x,
                                           int32_t A, int32_t C8)
{
    for (; st != end; st++) {
        uint32_t W0, W1, D0, D1, S0, S1;
        tt_blocks_steps_x(tt_ld_s8x4(x + 4u * *st), A, C8, &D0, &D1);
        tt_ld_s16x4(w, &W0, &W1);
        S0 = (uint32_t)__ssub16((int32_t)W0, (int32_t)D0);
        S1 = (uint32_t)__ssub16((int32_t)W1, (int32_t)D1);
        tt_guard_s16x2_15((uint32_t)__shsub16((int32_t)W0, (int32_t)D0));
        tt_guard_s16x2_15((uint32_t)__shsub16((int32_t)W1, (int32_t)D1));
        tt_guard_s16x2_15((uint32_t)__shsub16((int32_t)S0, 0x00010001));
        tt_guard_s16x2_15((uint32_t)__shsub16((int32_t)S1, 0x00010001));
        tt_st_s16x4_next(&w, S0, S1);
    }
}

/* The update's constants for tt_blocks_update_rows. */
typedef struct tt_blocks_upd {
    const int8_t *x;
    int32_t *b;         /* the biases, updated in the row loop by their fast rule; NULL: not here */
    int32_t K, s, sh, m_t;
    int32_t M;          /* m_t 2^sh: a row's A = e[n] M */
    uint32_t emax;      /* |e[n]| <= emax <=> |m_t e[n]| <= amax: the fast pass applies */
    int32_t sb, half_b; /* the biases' shift eb + k - ee in [1, 31], and 2^(sb - 1) */
    uint32_t ez;        /* |e[n]| <= ez => every step of the row rounds to 0 (tt_blocks_ezero) */
} tt_blocks_upd;

/* A row of tt_blocks_update_rows whose fast pass hit the guard: undone exactly (SADD16 of the
 * stored w - d mod 2^16 and the same steps), then the exact rule. */
TT_BLOCKS_NOINLINE uint32_t tt_blocks_row_redo_x(const tt_blocks_upd *c, int16_t *w, const uint8_t *st,
                                                 const uint8_t *end, int32_t a, int32_t C8)
{
    const int32_t A = a * ((int32_t)1 << c->sh);
    int16_t *q = w;
    const uint8_t *j;
    for (j = st; j != end; j++, q += 4) {
        uint32_t D0, D1;
        tt_blocks_steps_x(tt_ld_s8x4(c->x + 4u * *j), A, C8, &D0, &D1);
        tt_st_s16x2(q, (uint32_t)__sadd16((int32_t)tt_ld_s16x2(q), (int32_t)D0));
        tt_st_s16x2(q + 2, (uint32_t)__sadd16((int32_t)tt_ld_s16x2(q + 2), (int32_t)D1));
    }
    tt_guard_clear();
    return tt_blocks_row_s16(w, st, end, c->K, c->x, a, c->s);
}

/* A row whose |e[n]| is past emax, by the exact rule (out of line: rare). */
TT_BLOCKS_NOINLINE uint32_t tt_blocks_row_slow(const tt_blocks_upd *c, int16_t *w, const uint8_t *st,
                                               const uint8_t *end, int32_t a)
{
    return tt_blocks_row_s16(w, st, end, c->K, c->x, a, c->s);
}

/* The update's rows (counts cnt[0 .. N), the block indices from cnt + N on) when every block is
 * full, every row 4-byte aligned and m_t > 0, in one loop: a row with e[n] = 0 costs its two byte
 * loads, the test and the pointer steps; one with e[n] != 0 only its bias when |e[n]| <= ez (every
 * step rounds to 0: tt_blocks_ezero), else the fast pass (tt_blocks_row_fast_x, x read in place, C8: c = 8, else 0; on a guard hit undone
 * and redone out of line) when |e[n]| <= emax, else the exact rule; then its bias when BIAS (a
 * constant after inlining) by the fast rule. Returns the saturations. */
TT_BLOCKS_INLINE uint32_t tt_blocks_update_rows(const tt_blocks_upd *c, const uint8_t *cnt, int32_t N,
                                                const int8_t *e, int16_t *w, int32_t C8, int32_t BIAS)
{
    const uint8_t *st = cnt + N;
    const int8_t *const eend = e + N;
    const int8_t *const x = c->x;
    const int32_t M = c->M, m_t = c->m_t, sb = c->sb, half_b = c->half_b;
    const uint32_t emax = c->emax, ez = c->ez;
    int32_t *q = c->b; /* the row's bias (BIAS) */
    uint32_t nsat = 0;
    for (; e != eend; e++) {
        const uint32_t k = *cnt++;
        const int32_t en = *e;
        if (TT_BLOCKS_UNLIKELY(en != 0)) { /* most rows of a trained layer have e[n] = 0 */
            const uint8_t *const end = st + k;
            const int32_t a = m_t * en;
            if ((uint32_t)(en + (int32_t)ez) > 2u * ez) { /* else every step is 0: no weight changes */
                if ((uint32_t)(en + (int32_t)emax) <= 2u * emax) {
                    tt_guard_clear();
                    tt_blocks_row_fast_x(w, st, end, x, en * M, C8);
                    if (TT_BLOCKS_UNLIKELY(tt_guard_hit())) nsat += tt_blocks_row_redo_x(c, w, st, end, a, C8);
                } else {
                    nsat += tt_blocks_row_slow(c, w, st, end, a);
                }
            }
            if (BIAS) { /* tt_sgd.c's fast bias rule: b -= (a + 2^(sb - 1)) >> sb, saturating on overflow */
                const int32_t d = (a + half_b) >> sb;
#if defined(__GNUC__)
                int32_t r;
                if (TT_BLOCKS_UNLIKELY(__builtin_sub_overflow(*q, d, &r))) {
                    r = d > 0 ? INT32_MIN : INT32_MAX;
                    nsat++;
                }
                *q = r;
#else
                const uint32_t v = (uint32_t)*q - (uint32_t)d;
                if ((((uint32_t)*q ^ (uint32_t)d) & ((uint32_t)*q ^ v)) >> 31) {
                    *q = d > 0 ? INT32_MIN : INT32_MAX;
                    nsat++;
                } else {
                    *q = (int32_t)v;
                }
#endif
            }
        }
        st += k;
        w += 4 * k;
        if (BIAS) q++;
    }
    return nsat;
}

TT_BLOCKS_NOINLINE uint32_t tt_blocks_update_c0b(const tt_blocks_upd *c, const uint8_t *cnt, int32_t N,
                                                 const int8_t *e, int16_t *w)
{
    return tt_blocks_update_rows(c, cnt, N, e, w, 0, 1);
}

TT_BLOCKS_NOINLINE uint32_t tt_blocks_update_c8b(const tt_blocks_upd *c, const uint8_t *cnt, int32_t N,
                                                 const int8_t *e, int16_t *w)
{
    return tt_blocks_update_rows(c, cnt, N, e, w, 1, 1);
}

TT_BLOCKS_NOINLINE uint32_t tt_blocks_update_c0(const tt_blocks_upd *c, const uint8_t *cnt, int32_t N,
                                                const int8_t *e, int16_t *w)
{
    return tt_blocks_update_rows(c, cnt, N, e, w, 0, 0);
}

TT_BLOCKS_NOINLINE uint32_t tt_blocks_update_c8(const tt_blocks_upd *c, const uint8_t *cnt, int32_t N,
                                                const int8_t *e, int16_t *w)
{
    return tt_blocks_update_rows(c, cnt, N, e, w, 1, 0);
}
#endif

#if TT_HAVE_DSP
/* The largest |a| = |m_t e[n]| the fast pass takes at the shift s (c = 8 for s <= 22, else 0;
 * sh = 32 - s - c): A = a 2^sh fits int32 and |d| <= 16383 for any int8 x, i.e.
 * min(INT32_MAX >> sh, floor((16383 2^s - 1) / 128)), the second in 32 bits (past s = 23 it
 * exceeds the first). */
static inline int32_t tt_blocks_amax(int32_t s, int32_t sh)
{
    const uint32_t lim1 = 0x7FFFFFFFu >> sh;
    const uint32_t lim2 = s >= 24 ? lim1 : s <= 17 ? ((16383u << s) - 1u) >> 7 : (16383u << (s - 7)) - 1u;
    return (int32_t)(lim1 < lim2 ? lim1 : lim2);
}

/* tt_sparse_blocks_fast_s16 when every block is full and every row 4-byte aligned: the row loop
 * of c = 8 (s <= 22) or c = 0, the biases in it when their fast rule applies (sb = eb + k - ee in
 * [1, 31]: returns 2, else 1). */
TT_BLOCKS_INLINE int32_t tt_blocks_fast_full(const tt_sgd_step *u, const tt_sparse_rows_sgd_s16_params *p,
                                               int32_t s, const int8_t *e, const int8_t *x, int32_t ee)
{
    const int32_t c = s >= 23 ? 0 : 8, sh = 32 - s - c, m_t = u->m_t, N = p->N;
    const int32_t sb = p->eb + u->cfg->k - ee, bias = p->b != 0 && sb >= 1 && sb <= 31;
    if (m_t > 0) { /* m_t = 0: every step and bias step is 0, nothing changes */
        /* |e[n]| <= emax <=> |m_t e[n]| <= amax; then m_t <= amax and M = m_t 2^sh fits */
        const uint32_t emax = (uint32_t)tt_blocks_amax(s, sh) / (uint32_t)m_t, em = emax < 128u ? emax : 128u;
        tt_blocks_upd cfg = {x, bias ? p->b : 0, p->K, s, sh, m_t,
                             em ? (int32_t)((uint32_t)m_t << sh) : 0, em, sb, bias ? (int32_t)1 << (sb - 1) : 0, tt_blocks_ezero(s, m_t)};
        uint32_t nsat;
        if (bias) nsat = c ? tt_blocks_update_c8b(&cfg, p->code, N, e, p->w) : tt_blocks_update_c0b(&cfg, p->code, N, e, p->w);
        else nsat = c ? tt_blocks_update_c8(&cfg, p->code, N, e, p->w) : tt_blocks_update_c0(&cfg, p->code, N, e, p->w);
        u->stats->saturated += nsat;
    }
    return bias ? 2 : 1;
}
#endif

#if TT_HAVE_DSP
/* tt_sparse_blocks_fast_s16 on other shapes (a short last block, rows not 4-byte aligned): x
 * widened once (x 2^c pairs in p->work), the full blocks by tt_blocks_row_update_s16, the short
 * ones by the exact rule. Returns the saturations. */
static uint32_t tt_blocks_fast_general(const tt_sgd_step *u, const tt_sparse_rows_sgd_s16_params *p, int32_t s,
                                       const int8_t *e, const int8_t *x)
{
    const int32_t N = p->N, K = p->K, tail = K & 3, m_t = u->m_t;
    const int32_t c = s >= 23 ? 0 : 8, sh = 32 - s - c, amax = tt_blocks_amax(s, sh);
    const uint32_t last = tail ? (uint32_t)K / 4u : 256u, ez = m_t > 0 ? tt_blocks_ezero(s, m_t) : 0;
    const uint8_t *st = p->code + N;
    int16_t *w = p->w;
    uint32_t *xx = (uint32_t *)(void *)p->work; /* K / 2 words */
    uint32_t nsat = 0;
    int32_t n;
    tt_blocks_widen(x, K & ~3, c, xx);
    for (n = 0; n < N; n++) {
        const uint8_t *end = st + p->code[n], *full = end;
        const int32_t a = m_t * (int32_t)e[n];
        if (end != st && end[-1] == last) full--;
        if (a != 0 && (uint32_t)(e[n] + (int32_t)ez) > 2u * ez) { /* else no weight changes (tt_blocks_ezero) */
            if (((uintptr_t)w & 3u) == 0) nsat += tt_blocks_row_update_s16(w, st, full, end, K, x, xx, a, s, sh, amax, 1);
            else nsat += tt_blocks_row_update_s16(w, st, full, end, K, x, xx, a, s, sh, amax, 0);
        }
        w += 4 * (full - st) + (full != end ? tail : 0);
        st = end;
    }
    return nsat;
}
#endif

int32_t tt_sparse_blocks_direct_full(const tt_sgd_step *u, const tt_sparse_rows_sgd_s16_params *p,
                                     const int8_t *e, int32_t ee, const int8_t *x, int32_t ex)
{
#if TT_HAVE_DSP
    const tt_sgd *o = u->cfg;
    const int32_t s = p->ew + o->k - (ee + ex), sb = p->eb + o->k - ee;
    if (p->w == 0 || (p->K & 3) != 0 || ((uintptr_t)p->w & 3u) != 0 || o->sr || o->wd_m || (uint32_t)u->m_t >= 32768u
        || (uint32_t)(s - 1) >= 31u || (p->b != 0 && (uint32_t)(sb - 1) >= 31u))
        return 0;
    return tt_blocks_fast_full(u, p, s, e, x, ee) == 2 || p->b == 0;
#else
    (void)u, (void)p, (void)e, (void)ee, (void)x, (void)ex;
    return 0;
#endif
}

/* w -= round(m_t e[n] x[k] / 2^s) on the kept weights, row by row: rows whose error is 0 or whose
 * steps all round to 0 (tt_blocks_ezero) passed whole; DSP: a row's full blocks two pairs each (with c = 8 for s <= 22 and 0 above, x times
 * 2^c, A = a 2^(32 - s - c), when |A| < 2^31 and |d| <= 16383 as in tt_sgd_dense_rows_s16; x read
 * in place by tt_blocks_fast_full when every block is full and every row aligned, else widened
 * once), the rest by the exact rule (tt_blocks_row_s16). Every block full and every row aligned,
 * DSP, the biases' fast rule applying (sb = eb + k - ee in [1, 31]): the biases too, in the row
 * loop (returns 2; else 1, the biases left to the caller). */
int32_t tt_sparse_blocks_fast_s16(const tt_sgd_step *u, const tt_sparse_rows_sgd_s16_params *p, int32_t s,
                                  const int8_t *e, const int8_t *x, int32_t ee)
{
#if TT_HAVE_DSP
    if ((p->K & 3) == 0 && ((uintptr_t)p->w & 3u) == 0) return tt_blocks_fast_full(u, p, s, e, x, ee);
    u->stats->saturated += tt_blocks_fast_general(u, p, s, e, x);
#else
    const int32_t N = p->N, K = p->K;
    const uint32_t ez = u->m_t > 0 ? tt_blocks_ezero(s, u->m_t) : 0;
    const uint8_t *st = p->code + N;
    int16_t *w = p->w;
    uint32_t nsat = 0;
    int32_t n;
    (void)ee;
    for (n = 0; n < N; n++) {
        const uint8_t *end = st + p->code[n];
        const int32_t a = u->m_t * (int32_t)e[n], m = tt_blocks_weights(st, end, K);
        if (a != 0 && (uint32_t)(e[n] + (int32_t)ez) > 2u * ez) nsat += tt_blocks_row_s16(w, st, end, K, x, a, s);
        w += m;
        st = end;
    }
    u->stats->saturated += nsat;
#endif
    return 1;
}
