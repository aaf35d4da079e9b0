/** Dense layer kernels: portable scalar path and Cortex-M DSP path (TT_HAVE_DSP), same bits. */
#include "tt_dense.h"
#include "tt_dsp.h"

/* The int32 paths below hold only when the bounds of tt_dense.h hold (inputs and errors in the
 * symmetric int8 range, weights int16, aligned bias clamped to 2^30):
 *   forward  |acc| <= 2^30 + K * 127 * 32767 < 2^31 for K <= TT_DENSE_S32_MAX_K;
 *   backward |acc| <= N * 127 * 32767 < 2^31 for N <= TT_DENSE_S32_MAX_N.
 * Both paths compute every partial sum exactly, so the order of summation does not matter. */

#if TT_HAVE_DSP
/* The row and block bodies below are specialised by constant arguments (rows per pass, aligned
 * loads): always inlined under GCC, where a plain inline hint is not always taken. */
#if defined(__GNUC__)
#define TT_DENSE_INLINE static inline __attribute__((always_inline))
#else
#define TT_DENSE_INLINE static inline
#endif
#if defined(__GNUC__)
#define TT_DENSE_NOINLINE __attribute__((noinline))
#else
#define TT_DENSE_NOINLINE
#endif

/* x widened to int16 pairs in chunks of this many inputs (stack: TT_DENSE_CHUNK * 2 bytes) */
#define TT_DENSE_CHUNK 64

/* Store v into acc and OR v ^ (v >> 31) (|v|, or |v| - 1 for v < 0) into *m: what
 * tt_requant_s8_from_s32_or takes instead of the maximum (two instructions, no compare). */
static inline void tt_dense_put(int32_t *acc, int32_t v, uint32_t *m)
{
    *acc = v;
    *m |= (uint32_t)(v ^ (v >> 31));
}

/* Two weight pairs of a row at *p, then *p += 4: one LDRD when the rows are 4-byte aligned (AL,
 * a constant after inlining), else two LDRs. */
TT_DENSE_INLINE void tt_dense_ld2(const int16_t **p, uint32_t *lo, uint32_t *hi, int32_t AL)
{
    if (AL) {
        tt_ld_s16x4_next(p, lo, hi);
    } else {
        *lo = tt_ld_s16x2(*p);
        *hi = tt_ld_s16x2(*p + 2);
        *p += 4;
    }
}

/* acc[i] (= b[i] rounded right by d in [1, 31] when b != NULL, the first chunk, else the running
 * sum) + sum_j row_i[2j..2j+1] . xx[j] + xo row_i[2 np] (the last term when xo_on) for the rows
 * i < R (R = 4, 2 or 1, AL aligned rows: constants after inlining) at r, r + K, r + 2K, r + 3K,
 * two input pairs per loop turn; ORs each new acc[i] into *m (tt_dense_put). */
TT_DENSE_INLINE void tt_dense_rows(const int16_t *r, int32_t K, const uint32_t *xx, int32_t np,
                                 int32_t xo_on, int32_t xo, int32_t R, int32_t AL, const int32_t *b,
                                 int32_t d, int32_t *acc, uint32_t *m)
{
    const int16_t *r0 = r, *r1 = R > 1 ? r + K : r, *r2 = R > 2 ? r + 2 * K : r, *r3 = R > 2 ? r + 3 * K : r;
    const uint32_t *end = xx + (np & ~1);
    int32_t s0, s1 = 0, s2 = 0, s3 = 0;
    uint32_t o;
    if (b) {
        s0 = tt_rshift_round_s32(b[0], d);
        if (R > 1) s1 = tt_rshift_round_s32(b[1], d);
        if (R > 2) { s2 = tt_rshift_round_s32(b[2], d); s3 = tt_rshift_round_s32(b[3], d); }
    } else {
        s0 = acc[0];
        if (R > 1) s1 = acc[1];
        if (R > 2) { s2 = acc[2]; s3 = acc[3]; }
    }
    while (xx != end) {
        uint32_t lo, hi, u0, u1;
        int32_t X0, X1;
        tt_ld_u32x2_next(&xx, &u0, &u1); /* LDRD with writeback: no pointer step in the turn */
        X0 = (int32_t)u0;
        X1 = (int32_t)u1;
        tt_dense_ld2(&r0, &lo, &hi, AL);
        s0 = __smlad((int32_t)lo, X0, s0);
        s0 = __smlad((int32_t)hi, X1, s0);
        if (R > 1) {
            tt_dense_ld2(&r1, &lo, &hi, AL);
            s1 = __smlad((int32_t)lo, X0, s1);
            s1 = __smlad((int32_t)hi, X1, s1);
        }
        if (R > 2) {
            tt_dense_ld2(&r2, &lo, &hi, AL);
            s2 = __smlad((int32_t)lo, X0, s2);
            s2 = __smlad((int32_t)hi, X1, s2);
            tt_dense_ld2(&r3, &lo, &hi, AL);
            s3 = __smlad((int32_t)lo, X0, s3);
            s3 = __smlad((int32_t)hi, X1, s3);
        }
    }
    if (np & 1) {
        const int32_t X0 = (int32_t)xx[0];
        s0 = __smlad((int32_t)tt_ld_s16x2(r0), X0, s0);
        if (R > 1) s1 = __smlad((int32_t)tt_ld_s16x2(r1), X0, s1);
        if (R > 2) {
            s2 = __smlad((int32_t)tt_ld_s16x2(r2), X0, s2);
            s3 = __smlad((int32_t)tt_ld_s16x2(r3), X0, s3);
        }
        r0 += 2; r1 += 2; r2 += 2; r3 += 2;
    }
    if (xo_on) {
        s0 += xo * (int32_t)r0[0];
        if (R > 1) s1 += xo * (int32_t)r1[0];
        if (R > 2) { s2 += xo * (int32_t)r2[0]; s3 += xo * (int32_t)r3[0]; }
    }
    o = *m;
    tt_dense_put(acc, s0, &o);
    if (R > 1) tt_dense_put(acc + 1, s1, &o);
    if (R > 2) { tt_dense_put(acc + 2, s2, &o); tt_dense_put(acc + 3, s3, &o); }
    *m = o;
}

/* One pass of tt_dense_rows per (R, AL) as a function of its own (not inlined: in one body with
 * the chunk loop, GCC kept the loop's row pointers on the stack and reloaded them every pass);
 * the aligned four-row passes loop in a function of their own (tt_dense_rows4_all_al), where the
 * inner loop keeps its registers. */
#define TT_DENSE_ROWS_FN(name, R, AL)                                                               \
    static TT_DENSE_NOINLINE void name(const int16_t *r, int32_t K, const uint32_t *xx, int32_t np,   \
                                       int32_t xo_on, int32_t xo, const int32_t *b, int32_t d,        \
                                       int32_t *acc, uint32_t *m)                                     \
    {                                                                                                 \
        tt_dense_rows(r, K, xx, np, xo_on, xo, R, AL, b, d, acc, m);                                  \
    }
/* Every four-row pass of aligned rows (n < N4, a multiple of 4) in one function: no call and
 * argument passing per pass. */
static TT_DENSE_NOINLINE void tt_dense_rows4_all_al(const int16_t *r, int32_t K, int32_t N4, const uint32_t *xx,
                                                    int32_t np, int32_t xo_on, int32_t xo, const int32_t *b,
                                                    int32_t d, int32_t *acc, uint32_t *m)
{
    int32_t *const end = acc + N4;
    for (; acc != end; acc += 4, r += 4 * K) {
        tt_dense_rows(r, K, xx, np, xo_on, xo, 4, 1, b, d, acc, m);
        if (b) b += 4;
    }
}
TT_DENSE_ROWS_FN(tt_dense_rows2_al, 2, 1)
TT_DENSE_ROWS_FN(tt_dense_rows1_al, 1, 1)
TT_DENSE_ROWS_FN(tt_dense_rows4_un, 4, 0)
TT_DENSE_ROWS_FN(tt_dense_rows2_un, 2, 0)
TT_DENSE_ROWS_FN(tt_dense_rows1_un, 1, 0)

/* The usual forward's four-row passes: every row 4-byte aligned, K = 2 np a multiple of 4 within
 * one chunk (so a pass's last row pointer ends on the next pass's first row), the biases by a
 * plain rounding shift d in [1, 31] (t = b >> (d - 1), (t >> 1) + (t & 1): tt_rshift_round_s32's
 * bits, no overflow at d = 1): acc[n] = round(b[n] / 2^d) + row_n . x for n < N4 (a multiple of
 * 4); returns the OR of every acc[n] ^ (acc[n] >> 31), kept in a register across the passes and
 * the sums stored by STRD (tt_dense_rows4_all_al's general passes reload and store them each). */
static TT_DENSE_NOINLINE uint32_t tt_dense_rows4_1c(const int16_t *r, int32_t K, int32_t N4, const uint32_t *xx,
                                                   int32_t np, const int32_t *b, int32_t d, int32_t *acc)
{
    int32_t *const end = acc + N4;
    const uint32_t *const xend = xx + np;
    const int32_t d1 = d - 1;
    uint32_t m = 0;
    while (acc != end) {
        const int16_t *r1 = r + K, *r2 = r1 + K, *r3 = r2 + K;
        const uint32_t *x = xx;
        int32_t s0, s1, s2, s3, t0, t1, t2, t3;
        tt_ld_s32x2_next(&b, &t0, &t1);
        tt_ld_s32x2_next(&b, &t2, &t3);
        t0 >>= d1; t1 >>= d1; t2 >>= d1; t3 >>= d1;
        s0 = (t0 >> 1) + (t0 & 1);
        s1 = (t1 >> 1) + (t1 & 1);
        s2 = (t2 >> 1) + (t2 & 1);
        s3 = (t3 >> 1) + (t3 & 1);
        do {
            uint32_t lo, hi, u0, u1;
            int32_t X0, X1;
            tt_ld_u32x2_next(&x, &u0, &u1);
            X0 = (int32_t)u0;
            X1 = (int32_t)u1;
            tt_ld_s16x4_next(&r, &lo, &hi);
            s0 = __smlad((int32_t)lo, X0, s0);
            s0 = __smlad((int32_t)hi, X1, s0);
            tt_ld_s16x4_next(&r1, &lo, &hi);
            s1 = __smlad((int32_t)lo, X0, s1);
            s1 = __smlad((int32_t)hi, X1, s1);
            tt_ld_s16x4_next(&r2, &lo, &hi);
            s2 = __smlad((int32_t)lo, X0, s2);
            s2 = __smlad((int32_t)hi, X1, s2);
            tt_ld_s16x4_next(&r3, &lo, &hi);
            s3 = __smlad((int32_t)lo, X0, s3);
            s3 = __smlad((int32_t)hi, X1, s3);
        } while (x != xend);
        r = r3; /* the next pass's first row */
        tt_st_s32x2_next(&acc, s0, s1);
        tt_st_s32x2_next(&acc, s2, s3);
        m |= (uint32_t)(s0 ^ (s0 >> 31)) | (uint32_t)(s1 ^ (s1 >> 31));
        m |= (uint32_t)(s2 ^ (s2 >> 31)) | (uint32_t)(s3 ^ (s3 >> 31));
    }
    return m;
}

/* One chunk of inputs (xx, np pairs, the odd last input xo when xo_on) over all N rows at r,
 * four rows per pass sharing the widened inputs, then two, then one; biases folded in when b. */
static void tt_dense_chunk(const int16_t *r, int32_t K, int32_t N, const uint32_t *xx, int32_t np,
                           int32_t xo_on, int32_t xo, int32_t AL, const int32_t *b, int32_t d,
                           int32_t *acc, uint32_t *m)
{
    const int32_t *bn = b;
    int32_t n;
    if (AL) {
        n = N & ~3;
        tt_dense_rows4_all_al(r, K, n, xx, np, xo_on, xo, bn, d, acc, m);
        r += n * K;
        if (bn) bn += n;
    } else {
        for (n = 0; n + 4 <= N; n += 4, r += 4 * K) {
            tt_dense_rows4_un(r, K, xx, np, xo_on, xo, bn, d, acc + n, m);
            if (bn) bn += 4;
        }
    }
    if (N - n >= 2) {
        if (AL) tt_dense_rows2_al(r, K, xx, np, xo_on, xo, bn, d, acc + n, m);
        else tt_dense_rows2_un(r, K, xx, np, xo_on, xo, bn, d, acc + n, m);
        if (bn) bn += 2;
        n += 2; r += 2 * K;
    }
    if (n < N) {
        if (AL) tt_dense_rows1_al(r, K, xx, np, xo_on, xo, bn, d, acc + n, m);
        else tt_dense_rows1_un(r, K, xx, np, xo_on, xo, bn, d, acc + n, m);
    }
}

/* acc[n] = align(b[n]) + sum_k x[k] w[n][k] in int32 (SMLAD: two products per instruction, four
 * rows per pass sharing the widened inputs, then two, then one; weights by LDRD when every row
 * starts 4-byte aligned); returns the OR of every acc[n] ^ (acc[n] >> 31). The bias shift d =
 * ea - eb in [1, 31] (the usual case) is done in the rows' first chunk; any other is done first. */
static uint32_t tt_dense_fwd_rows_s32(const int8_t *x, const int16_t *w, const int32_t *b,
                                      int32_t eb, int32_t ea, int32_t K, int32_t N, int32_t *acc)
{
    const int32_t aligned = ((uintptr_t)w & 3u) == 0 && (K & 1) == 0, d = ea - eb, plain = d >= 1 && d <= 31;
    uint32_t xx[TT_DENSE_CHUNK / 2], m = 0;
    int32_t k0, n;
    if (aligned && plain && K <= TT_DENSE_CHUNK && (K & 3) == 0 && K > 0 && N >= 4) {
        /* the usual case: one chunk, four-row passes by tt_dense_rows4_1c, the other rows after */
        const int32_t N4 = N & ~3;
        tt_widen0_s8(x, K, xx);
        m = tt_dense_rows4_1c(w, K, N4, xx, K / 2, b, d, acc);
        if (N - N4 >= 2) /* the last rows straight to their passes (tt_dense_chunk's tail) */
            tt_dense_rows2_al(w + N4 * K, K, xx, K / 2, 0, 0, b + N4, d, acc + N4, &m);
        if (N & 1) tt_dense_rows1_al(w + (N - 1) * K, K, xx, K / 2, 0, 0, b + N - 1, d, acc + N - 1, &m);
        return m;
    }
    if (!plain)
        for (n = 0; n < N; n++) acc[n] = tt_align_s32(b[n], eb, ea);
    for (k0 = 0; k0 < K; k0 += TT_DENSE_CHUNK) {
        const int32_t len = K - k0 < TT_DENSE_CHUNK ? K - k0 : TT_DENSE_CHUNK, np = len / 2;
        const int32_t xo_on = len & 1, xo = xo_on ? (int32_t)x[k0 + len - 1] : 0;
        const int32_t *bb = k0 == 0 && plain ? b : 0;
        tt_widen0_s8(x + k0, 2 * np, xx);
        m = 0; /* the last chunk rewrites every acc[n]: its OR is the one returned */
        tt_dense_chunk(w + k0, K, N, xx, np, xo_on, xo, aligned, bb, d, acc, &m);
    }
    return m;
}

/* acc[k] (+)= e0 w0[k] + e1 w1[k] for k < K4 (a multiple of 4) and two aligned rows w0, w1, E =
 * (e0, e1) as int16 lanes (a single row: w1 = w0 and e1 = 0): four columns a turn, the rows' weight
 * pairs turned into column pairs (w0[k], w1[k]) by PKHBT/PKHTB for one SMLAD per column (two
 * products). FIRST (a constant after inlining): acc is not read, the sums start at 0; LAST: each
 * final acc[k] is ORed into *m (tt_dense_put). */
TT_DENSE_INLINE void tt_dense_bwd_pair(const int16_t *w0, const int16_t *w1, int32_t E, int32_t *acc,
                                       int32_t K4, int32_t FIRST, int32_t LAST, uint32_t *m)
{
    int32_t *const end = acc + K4;
    uint32_t o = LAST ? *m : 0;
    while (acc != end) {
        uint32_t a0, a1, b0, b1;
        int32_t s0, s1, s2, s3;
        tt_ld_s16x4_next(&w0, &a0, &a1);
        tt_ld_s16x4_next(&w1, &b0, &b1);
        if (FIRST) {
            s0 = __smuad((int32_t)tt_pack_lo(a0, b0), E);
            s1 = __smuad((int32_t)tt_pack_hi(a0, b0), E);
            s2 = __smuad((int32_t)tt_pack_lo(a1, b1), E);
            s3 = __smuad((int32_t)tt_pack_hi(a1, b1), E);
        } else {
            tt_ld_s32x2(acc, &s0, &s1);
            tt_ld_s32x2(acc + 2, &s2, &s3);
            s0 = __smlad((int32_t)tt_pack_lo(a0, b0), E, s0);
            s1 = __smlad((int32_t)tt_pack_hi(a0, b0), E, s1);
            s2 = __smlad((int32_t)tt_pack_lo(a1, b1), E, s2);
            s3 = __smlad((int32_t)tt_pack_hi(a1, b1), E, s3);
        }
        if (LAST) {
            o |= (uint32_t)(s0 ^ (s0 >> 31)) | (uint32_t)(s1 ^ (s1 >> 31));
            o |= (uint32_t)(s2 ^ (s2 >> 31)) | (uint32_t)(s3 ^ (s3 >> 31));
        }
        tt_st_s32x2_next(&acc, s0, s1);
        tt_st_s32x2_next(&acc, s2, s3);
    }
    if (LAST) *m = o;
}

/* tt_dense_bwd_pair per (FIRST, LAST), each a function of its own (a small register set). */
#define TT_DENSE_PAIR_FN(name, FIRST, LAST)                                                          \
    static TT_DENSE_NOINLINE void name(const int16_t *w0, const int16_t *w1, int32_t E, int32_t *acc, \
                                       int32_t K4, uint32_t *m)                                      \
    {                                                                                                \
        tt_dense_bwd_pair(w0, w1, E, acc, K4, FIRST, LAST, m);                                       \
    }
TT_DENSE_PAIR_FN(tt_dense_bwd_pair_first, 1, 0)
TT_DENSE_PAIR_FN(tt_dense_bwd_pair_mid, 0, 0)
TT_DENSE_PAIR_FN(tt_dense_bwd_pair_last, 0, 1)
TT_DENSE_PAIR_FN(tt_dense_bwd_pair_only, 1, 1)

/* acc[k] (+)= e0 w0[k] + e1 w1[k] + e2 w2[k] + e3 w3[k] for k < K4 (a multiple of 4) and four
 * aligned rows, E01 = (e0, e1) and E23 = (e2, e3) as int16 lanes: four columns a turn, each
 * weight (a lane of an LDRD'd pair) times its row's error lane by one SMLAxy, no repacking (one
 * instruction per product, the sums in registers across the four rows). FIRST, LAST as in
 * tt_dense_bwd_pair. */
TT_DENSE_INLINE void tt_dense_bwd_quad(const int16_t *w0, const int16_t *w1, const int16_t *w2,
                                       const int16_t *w3, int32_t E01, int32_t E23, int32_t *acc,
                                       int32_t K4, int32_t FIRST, int32_t LAST, uint32_t *m)
{
    int32_t *const end = acc + K4;
    uint32_t o = LAST ? *m : 0;
    while (acc != end) {
        uint32_t a0, a1;
        int32_t s0, s1, s2, s3;
        tt_ld_s16x4_next(&w0, &a0, &a1);
        if (FIRST) {
            s0 = tt_smulbb((int32_t)a0, E01);
            s1 = tt_smultb((int32_t)a0, E01);
            s2 = tt_smulbb((int32_t)a1, E01);
            s3 = tt_smultb((int32_t)a1, E01);
        } else {
            tt_ld_s32x2(acc, &s0, &s1);
            tt_ld_s32x2(acc + 2, &s2, &s3);
            s0 = __smlabb((int32_t)a0, E01, s0);
            s1 = __smlatb((int32_t)a0, E01, s1);
            s2 = __smlabb((int32_t)a1, E01, s2);
            s3 = __smlatb((int32_t)a1, E01, s3);
        }
        tt_ld_s16x4_next(&w1, &a0, &a1);
        s0 = __smlabt((int32_t)a0, E01, s0);
        s1 = __smlatt((int32_t)a0, E01, s1);
        s2 = __smlabt((int32_t)a1, E01, s2);
        s3 = __smlatt((int32_t)a1, E01, s3);
        tt_ld_s16x4_next(&w2, &a0, &a1);
        s0 = __smlabb((int32_t)a0, E23, s0);
        s1 = __smlatb((int32_t)a0, E23, s1);
        s2 = __smlabb((int32_t)a1, E23, s2);
        s3 = __smlatb((int32_t)a1, E23, s3);
        tt_ld_s16x4_next(&w3, &a0, &a1);
        s0 = __smlabt((int32_t)a0, E23, s0);
        s1 = __smlatt((int32_t)a0, E23, s1);
        s2 = __smlabt((int32_t)a1, E23, s2);
        s3 = __smlatt((int32_t)a1, E23, s3);
        if (LAST) {
            o |= (uint32_t)(s0 ^ (s0 >> 31)) | (uint32_t)(s1 ^ (s1 >> 31));
            o |= (uint32_t)(s2 ^ (s2 >> 31)) | (uint32_t)(s3 ^ (s3 >> 31));
        }
        tt_st_s32x2_next(&acc, s0, s1);
        tt_st_s32x2_next(&acc, s2, s3);
    }
    if (LAST) *m = o;
}

/* tt_dense_bwd_quad per (FIRST, LAST), each a function of its own. */
#define TT_DENSE_QUAD_FN(name, FIRST, LAST)                                                          \
    static TT_DENSE_NOINLINE void name(const int16_t *w0, int32_t K, int32_t E01, int32_t E23,      \
                                       int32_t *acc, int32_t K4, uint32_t *m)                        \
    {                                                                                                \
        tt_dense_bwd_quad(w0, w0 + K, w0 + 2 * K, w0 + 3 * K, E01, E23, acc, K4, FIRST, LAST, m);    \
    }
TT_DENSE_QUAD_FN(tt_dense_bwd_quad_first, 1, 0)
TT_DENSE_QUAD_FN(tt_dense_bwd_quad_mid, 0, 0)
TT_DENSE_QUAD_FN(tt_dense_bwd_quad_last, 0, 1)
TT_DENSE_QUAD_FN(tt_dense_bwd_quad_only, 1, 1)

/* (e[n], e[n + 1]) as int16 lanes (e[n + 1] = 0 past the last row). */
static inline int32_t tt_dense_e_pair(const int8_t *e, int32_t n, int32_t N)
{
    return (int32_t)(((uint32_t)(int32_t)e[n] & 0xFFFFu) | (n + 1 < N ? (uint32_t)(int32_t)e[n + 1] << 16 : 0u));
}

/* acc[k] = sum_n e[n] w[n][k] in int32: when every row starts 4-byte aligned, the columns below
 * K4 = K & ~3 by tt_dense_bwd_quad over the rows four at a time where all four exist and
 * neither pair's errors are both 0, else by tt_dense_bwd_pair two at a time (the odd last one
 * alone; a pair whose errors are both 0 adds nothing and is skipped, as is every row after the
 * last nonzero error: a trained classifier's error is mostly zeros), the other columns (and every column of
 * unaligned rows) one at a time; returns the OR of every acc[k] ^ (acc[k] >> 31). */
static uint32_t tt_dense_bwd_cols_s32(const int8_t *e, const int16_t *w, int32_t K, int32_t N,
                                      int32_t *acc)
{
    const int32_t K4 = ((uintptr_t)w & 3u) == 0 && (K & 1) == 0 ? K & ~3 : 0;
    uint32_t m = 0;
    int32_t k, n;
    if (N <= 0) { /* no rows: all sums 0 (said apart, else GCC may store the constant 0s with
                   * VFP registers in hard-float builds, which must stay VFP-free) */
        memset(acc, 0, (size_t)K * sizeof *acc);
        return 0;
    }
    if (K4) {
        int32_t first = 1, last = N - 1;
        while (last >= 0 && e[last] == 0) last--;
        if (last < 0) /* every error 0: the sums are 0 (m stays 0) */
            memset(acc, 0, (size_t)K4 * sizeof *acc);
        for (n = 0; n <= last; n += 2) {
            const int16_t *w0 = w + n * K, *w1 = n + 1 < N ? w0 + K : w0;
            int32_t E = tt_dense_e_pair(e, n, N);
            if (E == 0) continue; /* both errors 0: nothing to add */
            if (n + 3 <= last) { /* four rows, unless one pair's errors are both 0 */
                const int32_t E23 = tt_dense_e_pair(e, n + 2, N);
                if (E23 != 0) {
                    if (n + 4 > last) {
                        if (first) tt_dense_bwd_quad_only(w0, K, E, E23, acc, K4, &m);
                        else tt_dense_bwd_quad_last(w0, K, E, E23, acc, K4, &m);
                    } else if (first) {
                        tt_dense_bwd_quad_first(w0, K, E, E23, acc, K4, &m);
                    } else {
                        tt_dense_bwd_quad_mid(w0, K, E, E23, acc, K4, &m);
                    }
                    first = 0;
                    n += 2;
                    continue;
                }
            }
            if (n + 2 > last) {
                if (first) tt_dense_bwd_pair_only(w0, w1, E, acc, K4, &m);
                else tt_dense_bwd_pair_last(w0, w1, E, acc, K4, &m);
            } else if (first) {
                tt_dense_bwd_pair_first(w0, w1, E, acc, K4, &m);
            } else {
                tt_dense_bwd_pair_mid(w0, w1, E, acc, K4, &m);
            }
            first = 0;
        }
    }
    for (k = K4; k < K; k++) {
        const int16_t *col = w + k;
        int32_t s0 = 0;
        for (n = 0; n < N; n++, col += K) s0 += (int32_t)e[n] * (int32_t)col[0];
        tt_dense_put(acc + k, s0, &m);
    }
    return m;
}

/* The int32 sums' requantization from the OR the kernels above return. */
#define TT_DENSE_REQUANT tt_requant_s8_from_s32_or
#else
/* acc[n] = align(b[n]) + sum_k x[k] w[n][k] in int32, four products per loop turn;
 * returns max |acc[n]|. */
static uint32_t tt_dense_fwd_rows_s32(const int8_t *x, const int16_t *w, const int32_t *b,
                                      int32_t eb, int32_t ea, int32_t K, int32_t N, int32_t *acc)
{
    uint32_t m = 0;
    int32_t n, k;
    for (n = 0; n < N; n++) {
        const int16_t *row = w + n * K;
        int32_t s = tt_align_s32(b[n], eb, ea), a;
        for (k = 0; k + 4 <= K; k += 4) {
            s += (int32_t)x[k] * (int32_t)row[k];
            s += (int32_t)x[k + 1] * (int32_t)row[k + 1];
            s += (int32_t)x[k + 2] * (int32_t)row[k + 2];
            s += (int32_t)x[k + 3] * (int32_t)row[k + 3];
        }
        for (; k < K; k++) s += (int32_t)x[k] * (int32_t)row[k];
        acc[n] = s;
        a = s < 0 ? -s : s; /* |s| < 2^31 by the bound */
        if ((uint32_t)a > m) m = (uint32_t)a;
    }
    return m;
}

/* acc[k] = sum_n e[n] w[n][k] in int32, column by column; returns max |acc[k]|. */
static uint32_t tt_dense_bwd_cols_s32(const int8_t *e, const int16_t *w, int32_t K, int32_t N,
                                      int32_t *acc)
{
    uint32_t m = 0;
    int32_t n, k;
    for (k = 0; k < K; k++) {
        const int16_t *col = w + k;
        int32_t s = 0;
        uint32_t a;
        for (n = 0; n < N; n++, col += K) s += (int32_t)e[n] * (int32_t)col[0];
        acc[k] = s;
        a = s < 0 ? 0u - (uint32_t)s : (uint32_t)s;
        if (a > m) m = a;
    }
    return m;
}

/* The int32 sums' requantization from the maximum the kernels above return. */
#define TT_DENSE_REQUANT tt_requant_s8_from_s32_max
#endif

int32_t tt_dense_fwd_s8(const tt_ctx *ctx, const tt_dense_params *p, const int8_t *x,
                        int32_t ex, int8_t *y)
{
    const int32_t K = p->K, N = p->N, eb = p->eb, ea = ex + p->ew;
    const int16_t *w = p->w;
    const int32_t *b = p->b;
    int64_t *scratch = ctx->scratch;
    int32_t n, k;
    if (K <= TT_DENSE_S32_MAX_K) {
        int32_t *acc = (int32_t *)(void *)scratch; /* int32 sums: the bound of tt_dense.h */
        const uint32_t m = tt_dense_fwd_rows_s32(x, w, b, eb, ea, K, N, acc);
        return ea + TT_DENSE_REQUANT(acc, N, m, y, ctx->stats);
    }
    for (n = 0; n < N; n++) {
        const int16_t *row = w + (int64_t)n * K;
        int64_t acc = tt_align(b[n], eb, ea);
        for (k = 0; k < K; k++) acc += (int32_t)x[k] * (int32_t)row[k];
        scratch[n] = acc;
    }
    return ea + tt_requant_s8_from_s64(scratch, N, y, ctx->stats);
}

int32_t tt_dense_bwd_s8(const tt_ctx *ctx, const tt_dense_params *p, const int8_t *e,
                        int32_t ee, int8_t *dx)
{
    const int32_t K = p->K, N = p->N, ew = p->ew;
    const int16_t *w = p->w;
    int64_t *scratch = ctx->scratch;
    int32_t n, k;
    if (N <= TT_DENSE_S32_MAX_N) {
        int32_t *acc = (int32_t *)(void *)scratch;
        const uint32_t m = tt_dense_bwd_cols_s32(e, w, K, N, acc);
        return ee + ew + TT_DENSE_REQUANT(acc, K, m, dx, ctx->stats);
    }
    for (k = 0; k < K; k++) { /* column sums in int64 (also keeps 64-bit zero fills, which
                                 * GCC may do with VFP registers, out of hard-float builds) */
        const int16_t *col = w + k;
        int64_t acc = 0;
        for (n = 0; n < N; n++, col += K) acc += (int32_t)e[n] * (int32_t)col[0];
        scratch[k] = acc;
    }
    return ee + ew + tt_requant_s8_from_s64(scratch, K, dx, ctx->stats);
}

void tt_dense_grad_s32(const tt_dense_params *p, const int8_t *e, const int8_t *x, int32_t *gw,
                       int32_t *gb)
{
    const int32_t K = p->K, N = p->N;
    int32_t n, k;
    for (n = 0; n < N; n++) {
        const int32_t en = e[n];
        int32_t *row = gw + (int64_t)n * K;
        for (k = 0; k < K; k++) row[k] = en * (int32_t)x[k];
        gb[n] = en;
    }
}

/* ---- int8 weights: the products are int8 x int8 (|p| <= 127 * 127), so int32 sums hold up to
 * the TT_DENSE_W8_S32_MAX_* bounds of tt_dense.h; beyond them int64. Portable loops, four
 * products per turn; both widths compute every partial sum exactly. */

#if TT_HAVE_DSP
/* The int32 sums s0, s1 of two rows of int8 weights against x, four inputs a turn: each word of
 * x and of a row split into its even and odd bytes as int16 pairs (SXTB16, SXTB16 ROR #8), one
 * SMLAD per pair (~2 instructions per product instead of ~4.7; exact: every partial sum is
 * within the int32 bound of the caller). Any alignment. */
static inline void tt_dense_w8_rows2(const int8_t *x, const int8_t *r0, const int8_t *r1, int32_t K,
                                     int32_t *s0, int32_t *s1)
{
    int32_t a0 = *s0, a1 = *s1, k;
    for (k = 0; k + 4 <= K; k += 4) {
        const uint32_t X = tt_ld_s8x4(x + k), W0 = tt_ld_s8x4(r0 + k), W1 = tt_ld_s8x4(r1 + k);
        const int32_t xe = __sxtb16((int32_t)X), xo = __sxtb16((int32_t)((X >> 8) | (X << 24)));
        a0 = __smlad(__sxtb16((int32_t)W0), xe, a0);
        a0 = __smlad(__sxtb16((int32_t)((W0 >> 8) | (W0 << 24))), xo, a0);
        a1 = __smlad(__sxtb16((int32_t)W1), xe, a1);
        a1 = __smlad(__sxtb16((int32_t)((W1 >> 8) | (W1 << 24))), xo, a1);
    }
    for (; k < K; k++) {
        a0 += (int32_t)x[k] * (int32_t)r0[k];
        a1 += (int32_t)x[k] * (int32_t)r1[k];
    }
    *s0 = a0;
    *s1 = a1;
}
#endif
int32_t tt_dense_fwd_s8_w8(const tt_ctx *ctx, const tt_dense_w8_params *p, const int8_t *x,
                           int32_t ex, int8_t *y)
{
    const int32_t K = p->K, N = p->N, eb = p->eb, ea = ex + p->ew;
    int64_t *scratch = ctx->scratch;
    uint32_t m = 0;
    int32_t n, k;
    if (K > TT_DENSE_W8_S32_MAX_K) {
        for (n = 0; n < N; n++) {
            const int8_t *row = p->w + (int64_t)n * K;
            int64_t acc = tt_align(p->b[n], eb, ea);
            for (k = 0; k < K; k++) acc += (int32_t)x[k] * (int32_t)row[k];
            scratch[n] = acc;
        }
        return ea + tt_requant_s8_from_s64(scratch, N, y, ctx->stats);
    }
#if TT_HAVE_DSP
    for (n = 0; n + 2 <= N; n += 2) { /* two rows a pass: x widened once for both */
        const int8_t *row = p->w + n * K;
        int32_t s0 = tt_align_s32(p->b[n], eb, ea), s1 = tt_align_s32(p->b[n + 1], eb, ea);
        uint32_t a0, a1;
        tt_dense_w8_rows2(x, row, row + K, K, &s0, &s1);
        scratch[n] = s0;
        scratch[n + 1] = s1;
        a0 = s0 < 0 ? 0u - (uint32_t)s0 : (uint32_t)s0;
        a1 = s1 < 0 ? 0u - (uint32_t)s1 : (uint32_t)s1;
        if (a0 > m) m = a0;
        if (a1 > m) m = a1;
    }
#else
    n = 0;
#endif
    for (; n < N; n++) {
        const int8_t *row = p->w + n * K;
        int32_t s = tt_align_s32(p->b[n], eb, ea);
        uint32_t a;
        for (k = 0; k + 4 <= K; k += 4) {
            s += (int32_t)x[k] * (int32_t)row[k];
            s += (int32_t)x[k + 1] * (int32_t)row[k + 1];
            s += (int32_t)x[k + 2] * (int32_t)row[k + 2];
            s += (int32_t)x[k + 3] * (int32_t)row[k + 3];
        }
        for (; k < K; k++) s += (int32_t)x[k] * (int32_t)row[k];
        scratch[n] = s;
        a = s < 0 ? 0u - (uint32_t)s : (uint32_t)s;
        if (a > m) m = a;
    }
    return ea + tt_requant_s8_from_s64_max(scratch, N, m, y, ctx->stats);
}

int32_t tt_dense_bwd_s8_w8(const tt_ctx *ctx, const tt_dense_w8_params *p, const int8_t *e,
                           int32_t ee, int8_t *dx)
{
    const int32_t K = p->K, N = p->N;
    int64_t *scratch = ctx->scratch;
    uint32_t m = 0;
    int32_t n, k;
    if (N > TT_DENSE_W8_S32_MAX_N) {
        for (k = 0; k < K; k++) { /* int64 sums started from the first product (N >= 1 here): a
                                   * constant 0 start is one GCC may load with VFP registers */
            const int8_t *col = p->w + k;
            int64_t acc = (int32_t)e[0] * (int32_t)col[0];
            for (n = 1, col += K; n < N; n++, col += K) acc += (int32_t)e[n] * (int32_t)col[0];
            scratch[k] = acc;
        }
        return ee + p->ew + tt_requant_s8_from_s64(scratch, K, dx, ctx->stats);
    }
    if (N <= 0) /* no rows: all sums 0 (said apart, as in tt_dense_bwd_cols_s32: no VFP zero stores) */
        memset(scratch, 0, (size_t)K * sizeof *scratch);
    else for (k = 0; k < K; k++) {
        const int8_t *col = p->w + k;
        int32_t s = 0;
        uint32_t a;
        for (n = 0; n < N; n++, col += K) s += (int32_t)e[n] * (int32_t)col[0];
        scratch[k] = s;
        a = s < 0 ? 0u - (uint32_t)s : (uint32_t)s;
        if (a > m) m = a;
    }
    return ee + p->ew + tt_requant_s8_from_s64_max(scratch, K, m, dx, ctx->stats);
}

void tt_dense_grad_s32_w8(const tt_dense_w8_params *p, const int8_t *e, const int8_t *x,
                          int32_t *gw, int32_t *gb)
{
    const tt_dense_params q = {p->K, p->N, 0, p->ew, p->b, p->eb};
    tt_dense_grad_s32(&q, e, x, gw, gb);
}
