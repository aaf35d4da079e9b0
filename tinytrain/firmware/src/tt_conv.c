/** Convolution kernels: portable scalar paths and Cortex-M DSP paths (TT_HAVE_DSP), same bits.
 *
 * Conv2d / Conv1d take int32 paths where the sums provably fit int32 (bounds at the defines
 * below): the forward through an im2col column per output position (SMLAD rows), the input
 * gradient gathered per input element, the weight gradient gathered per tap, accumulators in
 * registers. The int64 loops below them remain for the shapes outside those bounds.
 *
 * For an output row oh the input rows are ih = oh*sh - pt + kh; only kh in [kh0, kh1) hit
 * the input (the rest read zero padding and contribute nothing), likewise kw in [kw0, kw1).
 * In channels-last layout the valid (kw, ci) run of one kernel row is contiguous in both x
 * and w, so every inner loop is a plain dot product or axpy over (kw1 - kw0) * Cin values. */
#include "tt_conv.h"
#include "tt_dsp.h"

#include <string.h>

/* Longest im2col column KH*KW*Cin the int32 forward takes (the column sits on the stack):
 * |acc| <= 2^30 + L * 2^7 * 2^15 < 2^31 for L <= 255, even with an int8 -128 or an int16 -32768. */
#define TT_CONV_COL_MAX 255
/* Most terms KH*KW*Cout of one input gradient the int32 backward takes: 511 * 2^22 < 2^31. */
#define TT_CONV_BWD_MAX_TERMS 511

/* Clip the kernel taps [0, K) to those whose input index i0 + k lies in [0, n); the range
 * is empty (k1 == k0 <= K) when the whole window lies in the padding. */
static void tt_conv_taps(int32_t i0, int32_t K, int32_t n, int32_t *k0, int32_t *k1)
{
    *k0 = i0 < 0 ? (-i0 < K ? -i0 : K) : 0; /* <= K: conv_col fills [0, k0) of a row with zeros */
    *k1 = n - i0 < K ? n - i0 : K;
    if (*k1 < *k0) *k1 = *k0;
}

/* col[0..KH*KW*Cin) = the input patch of the output position with top-left input (ih0, iw0),
 * in the order of a weight row (kh, kw, ci), zeros where the window lies in the padding. */
static void conv_col(const int8_t *x, int32_t H, int32_t W, int32_t Cin, int32_t KH, int32_t KW,
                     int32_t ih0, int32_t iw0, int16_t *col)
{
    const int32_t R = KW * Cin;
    int32_t kh, kh0, kh1, kw0, kw1, j;
    tt_conv_taps(ih0, KH, H, &kh0, &kh1);
    tt_conv_taps(iw0, KW, W, &kw0, &kw1);
    for (kh = 0; kh < KH; kh++, col += R) {
        if (kh < kh0 || kh >= kh1) {
            for (j = 0; j < R; j++) col[j] = 0;
            continue;
        }
        {
            const int8_t *xp = x + ((ih0 + kh) * W + iw0 + kw0) * Cin;
            const int32_t a = kw0 * Cin, b = kw1 * Cin;
            for (j = 0; j < a; j++) col[j] = 0;
            for (; j < b; j++) col[j] = xp[j - a];
            for (; j < R; j++) col[j] = 0;
        }
    }
}

/* Store v into acc and raise *m to |v|. */
static inline void conv_put(int64_t *acc, int32_t v, uint32_t *m)
{
    const uint32_t a = v < 0 ? 0u - (uint32_t)v : (uint32_t)v;
    *acc = v;
    if (a > *m) *m = a;
}

/* acc[i] = bias[i] + w_i . col over L terms for the R rows i < R (4 or 1, a constant after
 * inlining) at r, r + L, .., in int32 (exact: L <= TT_CONV_COL_MAX), the rows sharing the column
 * loads (DSP: SMLAD on int16 pairs); raises *m to each |acc[i]|. bias and acc may be the same
 * slots (each is read before it is written). */
static inline void conv_rows(const int16_t *col, int32_t L, const int16_t *r, int32_t R,
                             const int64_t *bias, int64_t *acc, uint32_t *m)
{
    const int16_t *r0 = r, *r1 = r + (R > 1 ? L : 0), *r2 = r + (R > 1 ? 2 * L : 0);
    const int16_t *r3 = r + (R > 1 ? 3 * L : 0);
    int32_t s0 = (int32_t)bias[0], s1 = R > 1 ? (int32_t)bias[1] : 0;
    int32_t s2 = R > 1 ? (int32_t)bias[2] : 0, s3 = R > 1 ? (int32_t)bias[3] : 0, j;
#if TT_HAVE_DSP
    for (j = 0; j + 2 <= L; j += 2) {
        const int32_t X = (int32_t)tt_ld_s16x2(col + j);
        s0 = __smlad((int32_t)tt_ld_s16x2(r0 + j), X, s0);
        if (R > 1) {
            s1 = __smlad((int32_t)tt_ld_s16x2(r1 + j), X, s1);
            s2 = __smlad((int32_t)tt_ld_s16x2(r2 + j), X, s2);
            s3 = __smlad((int32_t)tt_ld_s16x2(r3 + j), X, s3);
        }
    }
#else
    for (j = 0; j + 2 <= L; j += 2) {
        const int32_t X0 = col[j], X1 = col[j + 1];
        s0 += X0 * r0[j] + X1 * r0[j + 1];
        if (R > 1) {
            s1 += X0 * r1[j] + X1 * r1[j + 1];
            s2 += X0 * r2[j] + X1 * r2[j + 1];
            s3 += X0 * r3[j] + X1 * r3[j + 1];
        }
    }
#endif
    if (j < L) {
        const int32_t X0 = col[j];
        s0 += X0 * r0[j];
        if (R > 1) { s1 += X0 * r1[j]; s2 += X0 * r2[j]; s3 += X0 * r3[j]; }
    }
    conv_put(acc, s0, m);
    if (R > 1) { conv_put(acc + 1, s1, m); conv_put(acc + 2, s2, m); conv_put(acc + 3, s3, m); }
}

/* Bytes of the zero-padded input copy the int32 forward reads its windows from (stack; W3: conv1
 * 100, conv2 288); larger inputs take conv_col's bound tests per position. */
#define TT_CONV_XQ_MAX 512

/* xq[Hp][Wp][Cin] = x with pt rows and pl columns of zeros before it (and zeros after, up to
 * Hp x Wp): every window of the forward then lies inside xq. */
static void conv_pad_s8(const int8_t *x, int32_t H, int32_t W, int32_t Cin, int32_t pt, int32_t pl,
                        int32_t Hp, int32_t Wp, int8_t *xq)
{
    const int32_t ih0 = pt > 0 ? 0 : -pt, ih1 = H < Hp - pt ? H : Hp - pt;
    const int32_t iw0 = pl > 0 ? 0 : -pl, iw1 = W < Wp - pl ? W : Wp - pl;
    int32_t ih;
    memset(xq, 0, (size_t)(Hp * Wp * Cin));
    for (ih = ih0; ih < ih1; ih++)
        memcpy(xq + ((ih + pt) * Wp + iw0 + pl) * Cin, x + (ih * W + iw0) * Cin, (size_t)((iw1 - iw0) * Cin));
}

/* col[0..KH*R) = the KH rows of R values at xr, xr + rs, .. (a window of xq), widened to int16. */
static inline void conv_col_q(const int8_t *xr, int32_t rs, int32_t KH, int32_t R, int16_t *col)
{
    int32_t kh, j;
    for (kh = 0; kh < KH; kh++, xr += rs, col += R)
        for (j = 0; j < R; j++) col[j] = xr[j];
}

#if TT_HAVE_DSP
#if defined(__GNUC__)
#define TT_CONV_INLINE static inline __attribute__((always_inline))
#define TT_CONV_NOINLINE static __attribute__((noinline))
#else
#define TT_CONV_INLINE static inline
#define TT_CONV_NOINLINE static
#endif
/* Short columns (KH*KW*Cin <= 2 * TT_CONV_SHORT_PAIRS, e.g. conv1 with one input channel: 9)
 * take the forward with the whole column in registers, as NP int16 pairs, against weights
 * repacked once per call into NP aligned pairs per output channel (the odd last weight paired
 * with 0), at most TT_CONV_SHORT_WORDS words on the stack: per output channel NP loads and NP
 * SMLAD, no tail and no column reload. The same int32 sums as conv_rows. */
#define TT_CONV_SHORT_PAIRS 6
#define TT_CONV_SHORT_WORDS 192 /* Cout * (NP + 1) */

/* acc[co] = bias_co + w_co . col for every co < Cout, the column's NP pairs (a constant after
 * inlining) at col (col[L] = 0 when L is odd); wk holds per channel its bias then its NP
 * repacked weight pairs. *m collects the OR of every |acc|: it has the bit width of the largest,
 * which is all tt_requant_s8_from_s64_max reads of it (below 2^31 here). */
TT_CONV_INLINE void conv_short_pos(const int16_t *col, int32_t NP, const uint32_t *wk, int32_t Cout,
                                   int64_t *acc, uint32_t *m)
{
    const int32_t X0 = (int32_t)tt_ld_s16x2(col), X1 = NP > 1 ? (int32_t)tt_ld_s16x2(col + 2) : 0;
    const int32_t X2 = NP > 2 ? (int32_t)tt_ld_s16x2(col + 4) : 0, X3 = NP > 3 ? (int32_t)tt_ld_s16x2(col + 6) : 0;
    const int32_t X4 = NP > 4 ? (int32_t)tt_ld_s16x2(col + 8) : 0, X5 = NP > 5 ? (int32_t)tt_ld_s16x2(col + 10) : 0;
    const uint32_t *end = wk + Cout * (NP + 1);
    uint32_t o = *m;
    do {
        int32_t s = __smlad((int32_t)wk[1], X0, (int32_t)wk[0]);
        if (NP > 1) s = __smlad((int32_t)wk[2], X1, s);
        if (NP > 2) s = __smlad((int32_t)wk[3], X2, s);
        if (NP > 3) s = __smlad((int32_t)wk[4], X3, s);
        if (NP > 4) s = __smlad((int32_t)wk[5], X4, s);
        if (NP > 5) s = __smlad((int32_t)wk[6], X5, s);
        *acc++ = s;
        o |= s < 0 ? 0u - (uint32_t)s : (uint32_t)s;
        wk += NP + 1;
    } while (wk != end);
    *m = o;
}

/* The short-column forward over all positions of the padded input xq (conv2d_fwd_s32's loop,
 * bias parked the same way). */
static void conv2d_fwd_short(const int8_t *xq, int32_t Wp, const int16_t *w, int32_t Cin,
                             int32_t Cout, int32_t KH, int32_t KW, int32_t sh, int32_t sw, int32_t OH,
                             int32_t OW, const int64_t *bias, int64_t *scratch, uint32_t *m)
{
    const int32_t L = KH * KW * Cin, NP = (L + 1) / 2;
    uint32_t wk[TT_CONV_SHORT_WORDS];
    int16_t col[2 * TT_CONV_SHORT_PAIRS];
    int32_t oh, ow, co, j;
    for (co = 0; co < Cout; co++) {
        wk[co * (NP + 1)] = (uint32_t)(int32_t)bias[co];
        for (j = 0; j < NP; j++) {
            const int16_t *r = w + co * L + 2 * j;
            wk[co * (NP + 1) + 1 + j] = (uint16_t)r[0] | (2 * j + 1 < L ? (uint32_t)(uint16_t)r[1] << 16 : 0u);
        }
    }
    if (L & 1) col[L] = 0; /* the odd column's pad: conv_col_q writes col[0..L) only */
    for (oh = 0; oh < OH; oh++)
        for (ow = 0; ow < OW; ow++) {
            int64_t *acc = scratch + (oh * OW + ow) * Cout;
            conv_col_q(xq + (oh * sh * Wp + ow * sw) * Cin, Wp * Cin, KH, KW * Cin, col);
            switch (NP) {
            case 1: conv_short_pos(col, 1, wk, Cout, acc, m); break;
            case 2: conv_short_pos(col, 2, wk, Cout, acc, m); break;
            case 3: conv_short_pos(col, 3, wk, Cout, acc, m); break;
            case 4: conv_short_pos(col, 4, wk, Cout, acc, m); break;
            case 5: conv_short_pos(col, 5, wk, Cout, acc, m); break;
            default: conv_short_pos(col, 6, wk, Cout, acc, m); break;
            }
        }
}

/* Rows of three values (KW * Cin == 3, e.g. conv1 with one input channel and a 3-wide kernel),
 * KH <= 3: one LDR of four bytes per window row, split by SXTB16 into the even pair (x0, x2) and
 * the odd (x1, x3); the column is those KH even pairs, then the odd pairs two rows to a word
 * (PKHBT: (x1 of row 0, x1 of row 1), (x1 of row 2, x3 of row 2)), weights in the same order with
 * 0 against every x3. TT_CONV_R3_WORDS(KH) words: 2, 3, 5. */
#define TT_CONV_R3_WORDS(KH) ((KH) + ((KH) + 1) / 2)

/* wk = bias, then the NW weight words of a KH-row R3 column (the order above) for the kernel
 * block r (KH * 3 values, kh-major). */
static uint32_t *conv_r3_weights(const int16_t *r, int32_t KH, int32_t bias, uint32_t *wk)
{
    int32_t kh;
    *wk++ = (uint32_t)bias;
    for (kh = 0; kh < KH; kh++) *wk++ = (uint16_t)r[3 * kh] | (uint32_t)(uint16_t)r[3 * kh + 2] << 16;
    for (kh = 0; kh < KH; kh += 2)
        *wk++ = (uint16_t)r[3 * kh + 1] | (kh + 1 < KH ? (uint32_t)(uint16_t)r[3 * kh + 4] << 16 : 0u);
    return wk;
}

/* acc[p * Cout] = bias + w . column p for the P columns at col (NW words each, a constant after
 * inlining): one output channel over all positions, its weights in registers; *m ORs every
 * acc ^ (acc >> 31) (one instruction: |acc| - 1 for a negative acc). */
TT_CONV_INLINE void conv_r3_chan(const uint32_t *col, int32_t NW, int32_t P, const uint32_t *wk,
                                 int32_t Cout, int32_t *acc, uint32_t *m)
{
    const int32_t bias = (int32_t)wk[0], W0 = (int32_t)wk[1], W1 = (int32_t)wk[2];
    const int32_t W2 = NW > 2 ? (int32_t)wk[3] : 0, W3 = NW > 3 ? (int32_t)wk[4] : 0;
    const int32_t W4 = NW > 4 ? (int32_t)wk[5] : 0;
    const uint32_t *end = col + P * NW;
    uint32_t o = *m;
    do {
        uint32_t c0, c1, c2 = 0, c3 = 0;
        int32_t s;
        tt_ld_u32x2_next(&col, &c0, &c1);
        if (NW > 3) tt_ld_u32x2_next(&col, &c2, &c3);
        else if (NW > 2) c2 = *col++;
        s = __smlad(W0, (int32_t)c0, bias);
        s = __smlad(W1, (int32_t)c1, s);
        if (NW > 2) s = __smlad(W2, (int32_t)c2, s);
        if (NW > 3) s = __smlad(W3, (int32_t)c3, s);
        if (NW > 4) s = __smlad(W4, (int32_t)*col++, s);
        *acc = s;
        acc += Cout;
        o |= (uint32_t)(s ^ (s >> 31)); /* |s|, or |s| - 1 for s < 0: see tt_requant_s8_from_s32_or */
    } while (col != end);
    *m = o;
}

/* The P columns of the R3 forward into col (NW words each), from the padded input xq (read up to
 * one byte past the last window row, which xq holds); KH a constant after inlining. */
TT_CONV_INLINE void conv_r3_cols(const int8_t *xq, int32_t rs, int32_t KH, int32_t xs, int32_t ys,
                                 int32_t OH, int32_t OW, uint32_t *cp)
{
    int32_t oh, ow;
    for (oh = 0; oh < OH; oh++) {
        const int8_t *xr = xq + oh * ys;
        for (ow = 0; ow < OW; ow++, xr += xs) {
            const uint32_t r0 = tt_ld_s8x4(xr), o0 = (uint32_t)__sxtb16((int32_t)(r0 >> 8));
            cp[0] = (uint32_t)__sxtb16((int32_t)r0);
            if (KH == 1) {
                cp[1] = o0;
                cp += 2;
            } else {
                const uint32_t r1 = tt_ld_s8x4(xr + rs), o1 = (uint32_t)__sxtb16((int32_t)(r1 >> 8));
                cp[1] = (uint32_t)__sxtb16((int32_t)r1);
                if (KH == 2) {
                    cp[2] = tt_pack_lo(o0, o1);
                    cp += 3;
                } else {
                    const uint32_t r2 = tt_ld_s8x4(xr + 2 * rs);
                    cp[2] = (uint32_t)__sxtb16((int32_t)r2);
                    cp[3] = tt_pack_lo(o0, o1);
                    cp[4] = (uint32_t)__sxtb16((int32_t)(r2 >> 8));
                    cp += 5;
                }
            }
        }
    }
}

/* One variant per KH (and so per column length NW), each small enough for its loop's values to
 * stay in registers. */
#define TT_CONV_R3_VARIANT(KH)                                                                     \
    TT_CONV_NOINLINE void conv_r3_cols_##KH(const int8_t *xq, int32_t rs, int32_t xs, int32_t ys,  \
                                            int32_t OH, int32_t OW, uint32_t *cp)                  \
    {                                                                                              \
        conv_r3_cols(xq, rs, KH, xs, ys, OH, OW, cp);                                              \
    }                                                                                              \
    TT_CONV_NOINLINE void conv_r3_chan_##KH(const uint32_t *col, int32_t P, const uint32_t *wk,   \
                                            int32_t Cout, int32_t *acc, uint32_t *m)               \
    {                                                                                              \
        conv_r3_chan(col, TT_CONV_R3_WORDS(KH), P, wk, Cout, acc, m);                              \
    }
TT_CONV_R3_VARIANT(1)
TT_CONV_R3_VARIANT(2)
TT_CONV_R3_VARIANT(3)

/* The R3 forward: int32 sums into acc32[P][Cout], the P columns built once into col. bias holds
 * the aligned biases; it may lie in the scratch that col and acc32 overwrite: it is read (into
 * wk) before either is written. */
static void conv2d_fwd_r3(const int8_t *xq, int32_t Wp, int32_t Cin, const int16_t *w, int32_t Cout,
                          int32_t KH, int32_t sh, int32_t sw, int32_t OH, int32_t OW,
                          const int64_t *bias, int32_t *acc32, uint32_t *col, uint32_t *m)
{
    const int32_t NW = TT_CONV_R3_WORDS(KH), rs = Wp * Cin, P = OH * OW;
    uint32_t wk[TT_CONV_SHORT_WORDS], *wp = wk;
    int32_t co;
    for (co = 0; co < Cout; co++) wp = conv_r3_weights(w + co * 3 * KH, KH, (int32_t)bias[co], wp);
    if (KH == 1) conv_r3_cols_1(xq, rs, sw * Cin, sh * rs, OH, OW, col);
    else if (KH == 2) conv_r3_cols_2(xq, rs, sw * Cin, sh * rs, OH, OW, col);
    else conv_r3_cols_3(xq, rs, sw * Cin, sh * rs, OH, OW, col);
    for (co = 0; co < Cout; co++) {
        const uint32_t *wc = wk + co * (NW + 1);
        if (KH == 1) conv_r3_chan_1(col, P, wc, Cout, acc32 + co, m);
        else if (KH == 2) conv_r3_chan_2(col, P, wc, Cout, acc32 + co, m);
        else conv_r3_chan_3(col, P, wc, Cout, acc32 + co, m);
    }
}

#endif

/* The forward in int32 through an im2col column per output position (KH*KW*Cin <=
 * TT_CONV_COL_MAX); the same sums as conv2d_fwd's int64 loops, every partial sum exact. The
 * aligned biases are parked in the last position's slots, which are written last. */
static int32_t conv2d_fwd_s32(const int8_t *x, int32_t ex, const int16_t *w, int32_t ew,
                              const int32_t *b, int32_t eb, int32_t H, int32_t W, int32_t Cin,
                              int32_t Cout, int32_t KH, int32_t KW, int32_t sh, int32_t sw,
                              int32_t pt, int32_t pl, int32_t OH, int32_t OW,
                              int64_t *scratch, int8_t *y, tt_stats *st)
{
    const int32_t ea = ex + ew, L = KH * KW * Cin;
    const int32_t Hp = (OH - 1) * sh + KH, Wp = (OW - 1) * sw + KW, padded = Hp * Wp * Cin <= TT_CONV_XQ_MAX;
    int64_t *bias = scratch + (OH * OW - 1) * Cout;
    int16_t col[TT_CONV_COL_MAX + 1];
    int8_t xq[TT_CONV_XQ_MAX];
    uint32_t m = 0;
    int32_t oh, ow, co;
    for (co = 0; co < Cout; co++) bias[co] = tt_align_s32(b[co], eb, ea);
    /* the windows read from a zero-padded copy when it fits: no bound tests per position */
    if (padded) conv_pad_s8(x, H, W, Cin, pt, pl, Hp, Wp, xq);
#if TT_HAVE_DSP
    /* R3 rows: the int32 sums and then the columns in the scratch (4 (Cout + NW) <= 8 Cout bytes
     * a position), the input copy one byte longer for the last row's four-byte load */
    if (padded && KW * Cin == 3 && KH <= 3 && TT_CONV_R3_WORDS(KH) <= Cout && Hp * Wp * Cin < TT_CONV_XQ_MAX &&
        Cout * (TT_CONV_R3_WORDS(KH) + 1) <= TT_CONV_SHORT_WORDS) {
        int32_t *acc32 = (int32_t *)(void *)scratch;
        uint32_t *cols = (uint32_t *)(void *)(acc32 + OH * OW * Cout);
        xq[Hp * Wp * Cin] = 0;
        conv2d_fwd_r3(xq, Wp, Cin, w, Cout, KH, sh, sw, OH, OW, bias, acc32, cols, &m);
        return ea + tt_requant_s8_from_s32_or(acc32, OH * OW * Cout, m, y, st);
    }
    if (padded && L <= 2 * TT_CONV_SHORT_PAIRS && Cout * ((L + 1) / 2 + 1) <= TT_CONV_SHORT_WORDS) {
        conv2d_fwd_short(xq, Wp, w, Cin, Cout, KH, KW, sh, sw, OH, OW, bias, scratch, &m);
        return ea + tt_requant_s8_from_s64_max(scratch, OH * OW * Cout, m, y, st);
    }
#endif
    for (oh = 0; oh < OH; oh++)
        for (ow = 0; ow < OW; ow++) {
            int64_t *acc = scratch + (oh * OW + ow) * Cout;
            if (padded) conv_col_q(xq + (oh * sh * Wp + ow * sw) * Cin, Wp * Cin, KH, KW * Cin, col);
            else conv_col(x, H, W, Cin, KH, KW, oh * sh - pt, ow * sw - pl, col);
            for (co = 0; co + 4 <= Cout; co += 4) conv_rows(col, L, w + co * L, 4, bias + co, acc + co, &m);
            for (; co < Cout; co++) conv_rows(col, L, w + co * L, 1, bias + co, acc + co, &m);
        }
    return ea + tt_requant_s8_from_s64_max(scratch, OH * OW * Cout, m, y, st);
}

/* The output rows (or columns) o in [*o0, *o1) whose input index o * st - pad + k lies in [0, n). */
static void conv_out_range(int32_t k, int32_t st, int32_t pad, int32_t n, int32_t O, int32_t *o0,
                           int32_t *o1)
{
    int32_t a = 0, b = O;
    while (a < b && a * st - pad + k < 0) a++;
    while (b > a && (b - 1) * st - pad + k >= n) b--;
    *o0 = a;
    *o1 = b;
}

/* One block of the gathered weight gradient: for the tap (kh, kw) with output rows [oh0, oh1),
 * columns [ow0, ow1), sums over those positions of e[p][co + i] * x[in(p)][ci + j] for i < NO,
 * j < NI (NO x NI accumulators, constants after inlining), written to g[i * L + j]. */
static inline void conv_grad_block(const int8_t *e, const int8_t *x, int32_t W, int32_t Cin,
                                   int32_t Cout, int32_t sh, int32_t sw, int32_t pt, int32_t pl,
                                   int32_t OW, int32_t kh, int32_t kw, int32_t oh0, int32_t oh1,
                                   int32_t ow0, int32_t ow1, int32_t co, int32_t ci, int32_t L,
                                   int32_t NO, int32_t NI, int32_t *g)
{
    int32_t a00 = 0, a01 = 0, a02 = 0, a03 = 0, a10 = 0, a11 = 0, a12 = 0, a13 = 0;
    int32_t a20 = 0, a30 = 0, oh, ow;
    const int32_t xs = sw * Cin;
    for (oh = oh0; oh < oh1; oh++) {
        const int8_t *ep = e + (oh * OW + ow0) * Cout + co;
        const int8_t *xp = x + ((oh * sh - pt + kh) * W + ow0 * sw - pl + kw) * Cin + ci;
        for (ow = ow0; ow < ow1; ow++, ep += Cout, xp += xs) {
            const int32_t e0 = ep[0], x0 = xp[0];
            a00 += e0 * x0;
            if (NI > 1) { a01 += e0 * xp[1]; a02 += e0 * xp[2]; a03 += e0 * xp[3]; }
            if (NO > 1) {
                const int32_t e1 = ep[1];
                a10 += e1 * x0;
                if (NI > 1) { a11 += e1 * xp[1]; a12 += e1 * xp[2]; a13 += e1 * xp[3]; }
                if (NO > 2) { a20 += ep[2] * x0; a30 += ep[3] * x0; }
            }
        }
    }
    g[0] = a00;
    if (NI > 1) { g[1] = a01; g[2] = a02; g[3] = a03; }
    if (NO > 1) {
        g[L] = a10;
        if (NI > 1) { g[L + 1] = a11; g[L + 2] = a12; g[L + 3] = a13; }
        if (NO > 2) { g[2 * L] = a20; g[3 * L] = a30; }
    }
}

#if TT_HAVE_DSP
/* The DSP weight gradient (stride_w 1): SMLAD over pairs of horizontally adjacent output
 * positions. Two stack copies, widened to int16, make every pair one word: the input
 * zero-padded and channels first, xt[ci][ih + pt][iw + pl] (Hp x Wp rows; the taps never test a
 * bound), and the errors of the nco channels, et[oh][k][c] = (e[oh][2k][c], e[oh][2k + 1][c])
 * (0 past an odd OW, whose pair partner in xt is a pad column). Register blocks of 2 output
 * channels x NK <= 3 horizontally adjacent taps: per position pair 2 error words, NK input words
 * (one pointer, constant offsets), 2 NK SMLAD. The sums are conv_grad_block's, in another order:
 * exact int32 (|sum| <= TT_CONV_GRAD_MAX_POSITIONS * 127^2 < 2^31; SMLAD wraps, the total fits). */
#define TT_CONV_WG_X_MAX 1024 /* int16 of the padded input (2 KB of stack) */
#define TT_CONV_WG_E_MAX 256  /* error pair words (1 KB) */

/* Sums for 2 (NO) output channels x NK horizontally adjacent taps of one kernel row, every
 * input channel: g0 / g1 point at the first tap's gradient of each channel (stride Cin between
 * taps). The position pairs run as one walk: et is contiguous, xp steps 2 per pair and jumps
 * sh * Wp - 2 * OWp at the end of an output row. */
TT_CONV_INLINE void conv_wg_row(const uint32_t *et, const int16_t *xt, int32_t nco, int32_t OH,
                                int32_t OWp, int32_t sh, int32_t Hp, int32_t Wp, int32_t Cin,
                                int32_t NO, int32_t NK, int32_t P2, int32_t *g0, int32_t *g1)
{
    const int32_t jump = sh * Wp - 2 * OWp;
    int32_t ci, oh;
    for (ci = 0; ci < Cin; ci++) {
        const uint32_t *ep = et;
        const int16_t *xp = xt + ci * Hp * Wp;
        int32_t a00 = 0, a01 = 0, a02 = 0, a10 = 0, a11 = 0, a12 = 0;
/* the sums of the position pair at ep + eo, xp + xo */
#define TT_WG_PAIR(eo, xo)                                                                         \
        do {                                                                                       \
            const int32_t E0 = (int32_t)ep[eo], X0 = (int32_t)tt_ld_s16x2(xp + (xo));              \
            const int32_t X1 = NK > 1 ? (int32_t)tt_ld_s16x2(xp + (xo) + 1) : 0;                   \
            const int32_t X2 = NK > 2 ? (int32_t)tt_ld_s16x2(xp + (xo) + 2) : 0;                   \
            a00 = __smlad(E0, X0, a00);                                                            \
            if (NK > 1) a01 = __smlad(E0, X1, a01);                                                \
            if (NK > 2) a02 = __smlad(E0, X2, a02);                                                \
            if (NO > 1) {                                                                          \
                const int32_t E1 = (int32_t)ep[(eo) + 1];                                          \
                a10 = __smlad(E1, X0, a10);                                                        \
                if (NK > 1) a11 = __smlad(E1, X1, a11);                                            \
                if (NK > 2) a12 = __smlad(E1, X2, a12);                                            \
            }                                                                                      \
        } while (0)
        if (P2) { /* OWp == 2 and nco == 2: the row's two pairs unrolled, constant offsets */
            const int16_t *xe = xp + OH * (jump + 4);
            do {
                TT_WG_PAIR(0, 0);
                TT_WG_PAIR(2, 2);
                ep += 4;
                xp += jump + 4;
            } while (xp != xe);
        } else {
            for (oh = 0; oh < OH; oh++, xp += jump) {
                const uint32_t *end = ep + OWp * nco;
                do {
                    TT_WG_PAIR(0, 0);
                    ep += nco;
                    xp += 2;
                } while (ep != end);
            }
        }
#undef TT_WG_PAIR
        g0[ci] = a00;
        if (NK > 1) g0[Cin + ci] = a01;
        if (NK > 2) g0[2 * Cin + ci] = a02;
        if (NO > 1) {
            g1[ci] = a10;
            if (NK > 1) g1[Cin + ci] = a11;
            if (NK > 2) g1[2 * Cin + ci] = a12;
        }
    }
}

/* gw of output channels [co0, co1) as conv2d_grad_gather (gb apart); returns 0, leaving gw
 * untouched, for a stride_w other than 1 or copies past the stack buffers. */
static int32_t conv2d_grad_dsp(const int8_t *e, const int8_t *x, int32_t H, int32_t W, int32_t Cin,
                               int32_t Cout, int32_t KH, int32_t KW, int32_t sh, int32_t sw,
                               int32_t pt, int32_t pl, int32_t OH, int32_t OW, int32_t co0,
                               int32_t co1, int32_t *gw)
{
    const int32_t OWp = (OW + 1) / 2, Hp = (OH - 1) * sh + KH, Wp = 2 * OWp + KW - 1;
    const int32_t nco = co1 - co0, L = KH * KW * Cin, HW = Hp * Wp;
    int16_t xt[TT_CONV_WG_X_MAX];
    uint32_t et[TT_CONV_WG_E_MAX];
    int32_t ci, ih, iw, oh, k, c, kh, kw, nk, ih0, ih1, iw0, iw1;
    if (sw != 1 || nco < 1 || Cin * HW > TT_CONV_WG_X_MAX || OH * OWp * nco > TT_CONV_WG_E_MAX) return 0;
    /* the input rows and columns inside the padded frame: ih + pt in [0, Hp), iw + pl in [0, Wp) */
    ih0 = pt > 0 ? 0 : -pt;
    ih1 = H < Hp - pt ? H : Hp - pt;
    iw0 = pl > 0 ? 0 : -pl;
    iw1 = W < Wp - pl ? W : Wp - pl;
    memset(xt, 0, sizeof(int16_t) * (size_t)(Cin * HW));
    for (ih = ih0; ih < ih1; ih++) {
        const int8_t *xs = x + (ih * W + iw0) * Cin;
        int16_t *xd = xt + (ih + pt) * Wp + iw0 + pl;
        if (Cin == 1) {
            for (iw = iw0; iw < iw1; iw++) *xd++ = *xs++;
            continue;
        }
        for (iw = iw0; iw < iw1; iw++, xd++) {
            int16_t *xc = xd;
            /* four channels a step: one LDR, SXTB16 for the even and the odd ones */
            for (ci = 0; ci + 4 <= Cin; ci += 4, xs += 4, xc += 4 * HW) {
                const uint32_t v = tt_ld_s8x4(xs), ev = (uint32_t)__sxtb16((int32_t)v);
                const uint32_t od = (uint32_t)__sxtb16((int32_t)(v >> 8));
                xc[0] = (int16_t)ev;
                xc[HW] = (int16_t)od;
                xc[2 * HW] = (int16_t)(ev >> 16);
                xc[3 * HW] = (int16_t)(od >> 16);
            }
            for (; ci < Cin; ci++, xc += HW) *xc = *xs++;
        }
    }
    for (oh = 0; oh < OH; oh++)
        for (k = 0; k < OWp; k++) {
            const int8_t *e0 = e + (oh * OW + 2 * k) * Cout + co0;
            const int32_t two = 2 * k + 1 < OW;
            uint32_t *ed = et + (oh * OWp + k) * nco;
            /* four channels a step: SXTB16 splits the position pair's words into their even and
             * odd channels, PKHBT / PKHTB pair each channel across the two positions */
            for (c = 0; c + 4 <= nco; c += 4, ed += 4) {
                const uint32_t a = tt_ld_s8x4(e0 + c), b = two ? tt_ld_s8x4(e0 + Cout + c) : 0u;
                const uint32_t ae = (uint32_t)__sxtb16((int32_t)a), ao = (uint32_t)__sxtb16((int32_t)(a >> 8));
                const uint32_t be = (uint32_t)__sxtb16((int32_t)b), bo = (uint32_t)__sxtb16((int32_t)(b >> 8));
                ed[0] = tt_pack_lo(ae, be);
                ed[1] = tt_pack_lo(ao, bo);
                ed[2] = tt_pack_hi(ae, be);
                ed[3] = tt_pack_hi(ao, bo);
            }
            for (; c < nco; c++)
                *ed++ = (uint16_t)(int16_t)e0[c] | (two ? (uint32_t)(uint16_t)(int16_t)e0[Cout + c] << 16 : 0u);
        }
#define TT_WG_P(NO, NK, P2) conv_wg_row(et + c, xt + kh * Wp + kw, nco, OH, OWp, sh, Hp, Wp, Cin, NO, NK, P2, \
                                  gw + c * L + (kh * KW + kw) * Cin, gw + (c + (NO) - 1) * L + (kh * KW + kw) * Cin)
#define TT_WG(NO, NK) TT_WG_P(NO, NK, 0)
    for (c = 0; c < nco; c += 2)
        for (kw = 0; kw < KW; kw += nk) {
            nk = KW - kw < 3 ? KW - kw : 3;
            for (kh = 0; kh < KH; kh++) {
                if (c + 2 <= nco) {
                    if (nk == 3 && OWp == 2 && nco == 2) TT_WG_P(2, 3, 1); /* W3's conv2 */
                    else if (nk == 3) TT_WG(2, 3); else if (nk == 2) TT_WG(2, 2); else TT_WG(2, 1);
                } else {
                    if (nk == 3) TT_WG(1, 3); else if (nk == 2) TT_WG(1, 2); else TT_WG(1, 1);
                }
            }
        }
#undef TT_WG
#undef TT_WG_P
    return 1;
}
#endif

#if TT_HAVE_DSP
/* The bias-gradient sums of NW words of four channels (a constant after inlining) from the word
 * at e + c, over P positions Cout bytes apart: SXTAB16 adds bytes 0 and 2 (and, shifted, 1 and
 * 3) of each word into int16 lanes, exact while P * 128 <= 32767. */
TT_CONV_INLINE void conv_grad_b_words(const int8_t *e, int32_t P, int32_t Cout, int32_t NW, int32_t *gb)
{
    uint32_t ev0 = 0, od0 = 0, ev1 = 0, od1 = 0;
    const int8_t *end = e + P * Cout;
    do {
        const uint32_t w0 = tt_ld_s8x4(e);
        ev0 = (uint32_t)__sxtab16((int32_t)ev0, (int32_t)w0);
        od0 = (uint32_t)__sxtab16((int32_t)od0, (int32_t)(w0 >> 8));
        if (NW > 1) {
            const uint32_t w1 = tt_ld_s8x4(e + 4);
            ev1 = (uint32_t)__sxtab16((int32_t)ev1, (int32_t)w1);
            od1 = (uint32_t)__sxtab16((int32_t)od1, (int32_t)(w1 >> 8));
        }
        e += Cout;
    } while (e != end);
    gb[0] = (int16_t)ev0; gb[1] = (int16_t)od0; gb[2] = (int16_t)(ev0 >> 16); gb[3] = (int16_t)(od0 >> 16);
    if (NW > 1) {
        gb[4] = (int16_t)ev1; gb[5] = (int16_t)od1; gb[6] = (int16_t)(ev1 >> 16); gb[7] = (int16_t)(od1 >> 16);
    }
}
#endif

/* gb[co] = sum over the P positions of e[p][co] (int32; DSP: eight or four channels a pass in
 * int16 lanes when P <= 255, the rest scalar). */
static void conv_grad_b(const int8_t *e, int32_t P, int32_t Cout, int32_t *gb)
{
    int32_t p, co = 0;
#if TT_HAVE_DSP
    if (P >= 1 && P <= 255) {
        for (; co + 8 <= Cout; co += 8) conv_grad_b_words(e + co, P, Cout, 2, gb + co);
        for (; co + 4 <= Cout; co += 4) conv_grad_b_words(e + co, P, Cout, 1, gb + co);
    }
#endif
    {
        const int32_t c0 = co;
        for (; co < Cout; co++) gb[co] = 0;
        for (p = 0; p < P; p++)
            for (co = c0; co < Cout; co++) gb[co] += e[p * Cout + co];
    }
}

/* The weight gradient gathered tap by tap: each gw element is one sum over the output
 * positions, its accumulators in registers (blocks of 2 output x 4 input channels, or 4 x 1
 * when Cin < 4). int32 sums, exact as in conv2d_grad's scatter. Output channels [co0, co1)
 * only, gw holding theirs (tt_conv_wgrad.h); gb (all channels) unless NULL. */
static void conv2d_grad_gather(const int8_t *e, const int8_t *x, int32_t H, int32_t W,
                               int32_t Cin, int32_t Cout, int32_t KH, int32_t KW, int32_t sh,
                               int32_t sw, int32_t pt, int32_t pl, int32_t OH, int32_t OW,
                               int32_t co0, int32_t co1, int32_t *gw, int32_t *gb)
{
    const int32_t L = KH * KW * Cin;
#define TT_GB(NO, NI) conv_grad_block(e, x, W, Cin, Cout, sh, sw, pt, pl, OW, kh, kw, oh0, oh1, ow0, \
                                      ow1, co, ci, L, NO, NI, gw + (co - co0) * L + (kh * KW + kw) * Cin + ci)
    int32_t kh, kw, co, ci, oh0, oh1, ow0, ow1;
    if (gb) conv_grad_b(e, OH * OW, Cout, gb);
#if TT_HAVE_DSP
    if (conv2d_grad_dsp(e, x, H, W, Cin, Cout, KH, KW, sh, sw, pt, pl, OH, OW, co0, co1, gw)) return;
#endif
    for (kh = 0; kh < KH; kh++) {
        conv_out_range(kh, sh, pt, H, OH, &oh0, &oh1);
        for (kw = 0; kw < KW; kw++) {
            conv_out_range(kw, sw, pl, W, OW, &ow0, &ow1);
            if (Cin >= 4) {
                for (co = co0; co + 2 <= co1; co += 2) {
                    for (ci = 0; ci + 4 <= Cin; ci += 4) TT_GB(2, 4);
                    for (; ci < Cin; ci++) TT_GB(2, 1);
                }
                for (; co < co1; co++) {
                    for (ci = 0; ci + 4 <= Cin; ci += 4) TT_GB(1, 4);
                    for (; ci < Cin; ci++) TT_GB(1, 1);
                }
            } else {
                for (ci = 0; ci < Cin; ci++) {
                    for (co = co0; co + 4 <= co1; co += 4) TT_GB(4, 1);
                    for (; co < co1; co++) TT_GB(1, 1);
                }
            }
        }
    }
#undef TT_GB
}

/* One block of the gathered input gradient: acc[j] = sum over the taps (kh, kw) that reach input
 * (ih, iw) and over co of e[o(kh, kw)][co] * w[co][kh][kw][ci + j], j < NI (4 or 1, a constant
 * after inlining); DSP: SMLABB/SMLABT on weight pairs. Raises *m to each |acc[j]|. */
static inline void conv_bwd_block(const int8_t *e, const int16_t *w, int32_t Cin, int32_t Cout,
                                  int32_t KH, int32_t KW, int32_t sh, int32_t sw, int32_t pt,
                                  int32_t pl, int32_t OH, int32_t OW, int32_t ih, int32_t iw,
                                  int32_t ci, int32_t NI, int64_t *dst, uint32_t *m)
{
    const int32_t L = KH * KW * Cin;
    int32_t a0 = 0, a1 = 0, a2 = 0, a3 = 0, kh, kw, co, j, v[4];
    for (kh = 0; kh < KH; kh++) {
        const int32_t th = ih + pt - kh, oh = th / sh;
        if (th < 0 || oh * sh != th || oh >= OH) continue;
        for (kw = 0; kw < KW; kw++) {
            const int32_t tw = iw + pl - kw, ow = tw / sw;
            const int8_t *ep;
            const int16_t *wp;
            if (tw < 0 || ow * sw != tw || ow >= OW) continue;
            ep = e + (oh * OW + ow) * Cout;
            wp = w + (kh * KW + kw) * Cin + ci;
            for (co = 0; co < Cout; co++, wp += L) {
                const int32_t en = ep[co];
                if (NI > 1) {
#if TT_HAVE_DSP
                    const int32_t w01 = (int32_t)tt_ld_s16x2(wp), w23 = (int32_t)tt_ld_s16x2(wp + 2);
                    a0 = __smlabb(en, w01, a0);
                    a1 = __smlabt(en, w01, a1);
                    a2 = __smlabb(en, w23, a2);
                    a3 = __smlabt(en, w23, a3);
#else
                    a0 += en * wp[0]; a1 += en * wp[1]; a2 += en * wp[2]; a3 += en * wp[3];
#endif
                } else {
                    a0 += en * wp[0];
                }
            }
        }
    }
    v[0] = a0; v[1] = a1; v[2] = a2; v[3] = a3;
    for (j = 0; j < NI; j++) {
        const uint32_t a = v[j] < 0 ? 0u - (uint32_t)v[j] : (uint32_t)v[j];
        dst[j] = v[j];
        if (a > *m) *m = a;
    }
}

#if TT_HAVE_DSP
/* The DSP input gradient: SMLAD over pairs of output channels. Two stack copies make each pair
 * one word: the errors et[p][j] = (e[p][2j], e[p][2j + 1]) and the weights transposed,
 * wt[t][ci][j] = (w[2j][t][ci], w[2j + 1][t][ci]) for the tap t = kh * KW + kw (a 0 lane past an
 * odd Cout). Per input element, 4 input channels at a time: per tap reaching it and channel pair
 * 1 error word, 4 weight words, 4 SMLAD. The sums of conv_bwd_block in another order: exact int32
 * (KH*KW*Cout <= TT_CONV_BWD_MAX_TERMS). */
#define TT_CONV_BWD_WT_MAX 640 /* weight pair words (2.5 KB of stack) */
#define TT_CONV_BWD_ET_MAX 256 /* error pair words (1 KB) */

TT_CONV_INLINE void conv_bwd_block_dsp(const uint32_t *et, const uint32_t *wt, int32_t Cin, int32_t Cp,
                                       int32_t KH, int32_t KW, int32_t sh, int32_t sw, int32_t pt,
                                       int32_t pl, int32_t OH, int32_t OW, int32_t ih, int32_t iw,
                                       int32_t ci, int32_t NI, int64_t *dst, uint32_t *m)
{
    int32_t a0 = 0, a1 = 0, a2 = 0, a3 = 0, kh, kw, j, v[4];
    for (kh = 0; kh < KH; kh++) {
        const int32_t th = ih + pt - kh, oh = th / sh;
        if (th < 0 || oh * sh != th || oh >= OH) continue;
        for (kw = 0; kw < KW; kw++) {
            const int32_t tw = iw + pl - kw, ow = tw / sw;
            const uint32_t *ep, *w0;
            if (tw < 0 || ow * sw != tw || ow >= OW) continue;
            ep = et + (oh * OW + ow) * Cp;
            w0 = wt + ((kh * KW + kw) * Cin + ci) * Cp;
            for (j = 0; j < Cp; j++, w0++) {
                const int32_t E = (int32_t)ep[j];
                a0 = __smlad(E, (int32_t)w0[0], a0);
                if (NI > 1) {
                    a1 = __smlad(E, (int32_t)w0[Cp], a1);
                    a2 = __smlad(E, (int32_t)w0[2 * Cp], a2);
                    a3 = __smlad(E, (int32_t)w0[3 * Cp], a3);
                }
            }
        }
    }
    v[0] = a0; v[1] = a1; v[2] = a2; v[3] = a3;
    for (j = 0; j < NI; j++) {
        const uint32_t a = v[j] < 0 ? 0u - (uint32_t)v[j] : (uint32_t)v[j];
        dst[j] = v[j];
        if (a > *m) *m = a;
    }
}

/* The input gradient into scratch with its maximum |sum| in *m; returns 0 when the copies do not
 * fit their stack buffers (nothing written). */
static int32_t conv2d_bwd_dsp(const int8_t *e, const int16_t *w, int32_t H, int32_t W, int32_t Cin,
                              int32_t Cout, int32_t KH, int32_t KW, int32_t sh, int32_t sw, int32_t pt,
                              int32_t pl, int32_t OH, int32_t OW, int64_t *scratch, uint32_t *m)
{
    const int32_t Cp = (Cout + 1) / 2, T = KH * KW, L = T * Cin;
    uint32_t wt[TT_CONV_BWD_WT_MAX], et[TT_CONV_BWD_ET_MAX];
    int32_t ci, j, p, ih, iw;
    /* KH, KW >= 1 stated here also keeps GCC from storing an empty window's int64 zero through a
     * VFP register (vstmia d7) on hard-float cores: the runtime stays free of VFP instructions */
    if (KH < 1 || KW < 1 || T * Cin * Cp > TT_CONV_BWD_WT_MAX || OH * OW * Cp > TT_CONV_BWD_ET_MAX) return 0;
    for (j = 0; j < Cp; j++) { /* channel rows 2j, 2j + 1 of w: each L contiguous weights */
        const int16_t *w0 = w + 2 * j * L, *w1 = w0 + L;
        uint32_t *d = wt + j;
        if (2 * j + 1 < Cout)
            for (ci = 0; ci < L; ci++, d += Cp) *d = (uint16_t)w0[ci] | (uint32_t)(uint16_t)w1[ci] << 16;
        else
            for (ci = 0; ci < L; ci++, d += Cp) *d = (uint16_t)w0[ci];
    }
    for (p = 0; p < OH * OW; p++) {
        const int8_t *e0 = e + p * Cout;
        uint32_t *d = et + p * Cp;
        for (j = 0; j < Cout / 2; j++)
            d[j] = (uint16_t)(int16_t)e0[2 * j] | (uint32_t)(uint16_t)(int16_t)e0[2 * j + 1] << 16;
        if (Cout & 1) d[Cp - 1] = (uint16_t)(int16_t)e0[Cout - 1];
    }
    for (ih = 0; ih < H; ih++)
        for (iw = 0; iw < W; iw++) {
            int64_t *dst = scratch + (ih * W + iw) * Cin;
            for (ci = 0; ci + 4 <= Cin; ci += 4)
                conv_bwd_block_dsp(et, wt, Cin, Cp, KH, KW, sh, sw, pt, pl, OH, OW, ih, iw, ci, 4, dst + ci, m);
            for (; ci < Cin; ci++)
                conv_bwd_block_dsp(et, wt, Cin, Cp, KH, KW, sh, sw, pt, pl, OH, OW, ih, iw, ci, 1, dst + ci, m);
        }
    return 1;
}
#endif

/* The input gradient gathered input by input (KH*KW*Cout <= TT_CONV_BWD_MAX_TERMS: int32 sums,
 * exact), its accumulators in registers, then requantized with the tracked maximum. */
static int32_t conv2d_bwd_s32(const int8_t *e, int32_t ee, const int16_t *w, int32_t ew,
                              int32_t H, int32_t W, int32_t Cin, int32_t Cout, int32_t KH,
                              int32_t KW, int32_t sh, int32_t sw, int32_t pt, int32_t pl,
                              int32_t OH, int32_t OW, int64_t *scratch, int8_t *dx, tt_stats *st)
{
    uint32_t m = 0;
    int32_t ih, iw, ci;
#if TT_HAVE_DSP
    if (conv2d_bwd_dsp(e, w, H, W, Cin, Cout, KH, KW, sh, sw, pt, pl, OH, OW, scratch, &m))
        return ee + ew + tt_requant_s8_from_s64_max(scratch, H * W * Cin, m, dx, st);
#endif
    for (ih = 0; ih < H; ih++)
        for (iw = 0; iw < W; iw++) {
            int64_t *dst = scratch + (ih * W + iw) * Cin;
            for (ci = 0; ci + 4 <= Cin; ci += 4)
                conv_bwd_block(e, w, Cin, Cout, KH, KW, sh, sw, pt, pl, OH, OW, ih, iw, ci, 4, dst + ci, &m);
            for (; ci < Cin; ci++)
                conv_bwd_block(e, w, Cin, Cout, KH, KW, sh, sw, pt, pl, OH, OW, ih, iw, ci, 1, dst + ci, &m);
        }
    return ee + ew + tt_requant_s8_from_s64_max(scratch, H * W * Cin, m, dx, st);
}

/* Conv2d on positional dims (tt_conv_params' fields in order: stride sh, sw; top / left padding
 * pt, pl), shared by the 2-D and the 1-D entry points at the end of this file. */
static int32_t conv2d_fwd(const int8_t *x, int32_t ex, const int16_t *w, int32_t ew,
                          const int32_t *b, int32_t eb, int32_t H, int32_t W, int32_t Cin,
                          int32_t Cout, int32_t KH, int32_t KW, int32_t sh, int32_t sw,
                          int32_t pt, int32_t pl, int32_t OH, int32_t OW,
                          int64_t *scratch, int8_t *y, tt_stats *st)
{
    const int32_t ea = ex + ew;
    int64_t *acc = scratch;
    int32_t oh, ow, co, kh, j, kh0, kh1, kw0, kw1, kh_end;
    if (KH * KW * Cin <= TT_CONV_COL_MAX && OH * OW >= 1 && Cout >= 1)
        return conv2d_fwd_s32(x, ex, w, ew, b, eb, H, W, Cin, Cout, KH, KW, sh, sw, pt, pl, OH, OW,
                              scratch, y, st);
    for (oh = 0; oh < OH; oh++) {
        const int32_t ih0 = oh * sh - pt;
        tt_conv_taps(ih0, KH, H, &kh0, &kh1);
        for (ow = 0; ow < OW; ow++) {
            const int32_t iw0 = ow * sw - pl;
            int32_t n;
            tt_conv_taps(iw0, KW, W, &kw0, &kw1);
            n = (kw1 - kw0) * Cin;
            kh_end = n > 0 ? kh1 : kh0; /* no pointer into the padding when n == 0 */
            for (co = 0; co < Cout; co++) {
                int64_t a = tt_align(b[co], eb, ea);
                for (kh = kh0; kh < kh_end; kh++) {
                    const int8_t *xp = x + ((ih0 + kh) * W + iw0 + kw0) * Cin;
                    const int16_t *wp = w + ((co * KH + kh) * KW + kw0) * Cin;
                    for (j = 0; j < n; j++) a += (int32_t)xp[j] * (int32_t)wp[j];
                }
                *acc++ = a;
            }
        }
    }
    return ea + tt_requant_s8_from_s64(scratch, OH * OW * Cout, y, st);
}

static int32_t conv2d_bwd(const int8_t *e, int32_t ee, const int16_t *w, int32_t ew,
                          int32_t H, int32_t W, int32_t Cin, int32_t Cout, int32_t KH, int32_t KW,
                          int32_t sh, int32_t sw, int32_t pt, int32_t pl, int32_t OH, int32_t OW,
                          int64_t *scratch, int8_t *dx, tt_stats *st)
{
    int32_t oh, ow, co, kh, j, kh0, kh1, kw0, kw1, kh_end;
    if (KH * KW * Cout <= TT_CONV_BWD_MAX_TERMS && H * W * Cin >= 1)
        return conv2d_bwd_s32(e, ee, w, ew, H, W, Cin, Cout, KH, KW, sh, sw, pt, pl, OH, OW, scratch, dx, st);
    memset(scratch, 0, sizeof(int64_t) * (size_t)(H * W * Cin));
    for (oh = 0; oh < OH; oh++) {
        const int32_t ih0 = oh * sh - pt;
        tt_conv_taps(ih0, KH, H, &kh0, &kh1);
        for (ow = 0; ow < OW; ow++) {
            const int32_t iw0 = ow * sw - pl;
            const int8_t *ep = e + (oh * OW + ow) * Cout;
            int32_t n;
            tt_conv_taps(iw0, KW, W, &kw0, &kw1);
            n = (kw1 - kw0) * Cin;
            kh_end = n > 0 ? kh1 : kh0; /* no pointer into the padding when n == 0 */
            for (co = 0; co < Cout; co++) {
                const int32_t ev = ep[co];
                if (ev == 0) continue;
                for (kh = kh0; kh < kh_end; kh++) {
                    int64_t *dp = scratch + ((ih0 + kh) * W + iw0 + kw0) * Cin;
                    const int16_t *wp = w + ((co * KH + kh) * KW + kw0) * Cin;
                    for (j = 0; j < n; j++) dp[j] += ev * (int32_t)wp[j];
                }
            }
        }
    }
    return ee + ew + tt_requant_s8_from_s64(scratch, H * W * Cin, dx, st);
}

static void conv2d_grad(const int8_t *e, const int8_t *x, int32_t H, int32_t W, int32_t Cin,
                        int32_t Cout, int32_t KH, int32_t KW, int32_t sh, int32_t sw,
                        int32_t pt, int32_t pl, int32_t OH, int32_t OW, int32_t *gw, int32_t *gb)
{
    /* int32 sums: OH*OW <= TT_CONV_GRAD_MAX_POSITIONS terms of |e*x| <= 127*127 each. */
    int32_t oh, ow, co, kh, j, kh0, kh1, kw0, kw1, kh_end;
    if (Cin >= 1 && Cout >= 1) {
        conv2d_grad_gather(e, x, H, W, Cin, Cout, KH, KW, sh, sw, pt, pl, OH, OW, 0, Cout, gw, gb);
        return;
    }
    memset(gw, 0, sizeof(int32_t) * (size_t)(Cout * KH * KW * Cin));
    memset(gb, 0, sizeof(int32_t) * (size_t)Cout);
    for (oh = 0; oh < OH; oh++) {
        const int32_t ih0 = oh * sh - pt;
        tt_conv_taps(ih0, KH, H, &kh0, &kh1);
        for (ow = 0; ow < OW; ow++) {
            const int32_t iw0 = ow * sw - pl;
            const int8_t *ep = e + (oh * OW + ow) * Cout;
            int32_t n;
            tt_conv_taps(iw0, KW, W, &kw0, &kw1);
            n = (kw1 - kw0) * Cin;
            kh_end = n > 0 ? kh1 : kh0; /* no pointer into the padding when n == 0 */
            for (co = 0; co < Cout; co++) {
                const int32_t ev = ep[co];
                gb[co] += ev;
                if (ev == 0) continue;
                for (kh = kh0; kh < kh_end; kh++) {
                    const int8_t *xp = x + ((ih0 + kh) * W + iw0 + kw0) * Cin;
                    int32_t *gp = gw + ((co * KH + kh) * KW + kw0) * Cin;
                    for (j = 0; j < n; j++) gp[j] += ev * (int32_t)xp[j];
                }
            }
        }
    }
}

/* The dims of p as locals for the depthwise kernels, named as in the loops (kh, kw there are
 * tap indices). */
#define TT_CONV_DIMS(p)                                                                     \
    const int32_t H = (p)->H, W = (p)->W, Cin = (p)->Cin, Cout = (p)->Cout, KH = (p)->kh;   \
    const int32_t KW = (p)->kw, sh = (p)->stride_h, sw = (p)->stride_w, pt = (p)->pad_h;    \
    const int32_t pl = (p)->pad_w, OH = (p)->Ho, OW = (p)->Wo

int32_t tt_depthwise_fwd_s8(const tt_ctx *ctx, const tt_conv_params *p, const int8_t *x,
                            int32_t ex, int8_t *y)
{
    TT_CONV_DIMS(p);
    const int32_t C = Cin, eb = p->eb, ea = ex + p->ew;
    const int16_t *w = p->w;
    const int32_t *b = p->b;
    int64_t *scratch = ctx->scratch;
    int32_t oh, ow, kh, kw, c, kh0, kh1, kw0, kw1;
    for (oh = 0; oh < OH; oh++) {
        const int32_t ih0 = oh * sh - pt;
        tt_conv_taps(ih0, KH, H, &kh0, &kh1);
        for (ow = 0; ow < OW; ow++) {
            const int32_t iw0 = ow * sw - pl;
            int64_t *acc = scratch + (oh * OW + ow) * C;
            tt_conv_taps(iw0, KW, W, &kw0, &kw1);
            for (c = 0; c < C; c++) acc[c] = tt_align(b[c], eb, ea);
            for (kh = kh0; kh < kh1; kh++) {
                for (kw = kw0; kw < kw1; kw++) {
                    const int8_t *xp = x + ((ih0 + kh) * W + iw0 + kw) * C;
                    const int16_t *wp = w + (kh * KW + kw) * C;
                    for (c = 0; c < C; c++) acc[c] += (int32_t)xp[c] * (int32_t)wp[c];
                }
            }
        }
    }
    (void)Cout;
    return ea + tt_requant_s8_from_s64(scratch, OH * OW * C, y, ctx->stats);
}

int32_t tt_depthwise_bwd_s8(const tt_ctx *ctx, const tt_conv_params *p, const int8_t *e,
                            int32_t ee, int8_t *dx)
{
    TT_CONV_DIMS(p);
    const int32_t C = Cin;
    const int16_t *w = p->w;
    int64_t *scratch = ctx->scratch;
    int32_t oh, ow, kh, kw, c, kh0, kh1, kw0, kw1;
    memset(scratch, 0, sizeof(int64_t) * (size_t)(H * W * C));
    for (oh = 0; oh < OH; oh++) {
        const int32_t ih0 = oh * sh - pt;
        tt_conv_taps(ih0, KH, H, &kh0, &kh1);
        for (ow = 0; ow < OW; ow++) {
            const int32_t iw0 = ow * sw - pl;
            const int8_t *ep = e + (oh * OW + ow) * C;
            tt_conv_taps(iw0, KW, W, &kw0, &kw1);
            for (kh = kh0; kh < kh1; kh++) {
                for (kw = kw0; kw < kw1; kw++) {
                    int64_t *dp = scratch + ((ih0 + kh) * W + iw0 + kw) * C;
                    const int16_t *wp = w + (kh * KW + kw) * C;
                    for (c = 0; c < C; c++) dp[c] += (int32_t)ep[c] * (int32_t)wp[c];
                }
            }
        }
    }
    (void)Cout;
    return ee + p->ew + tt_requant_s8_from_s64(scratch, H * W * C, dx, ctx->stats);
}

void tt_depthwise_grad_s32(const tt_conv_params *p, const int8_t *e, const int8_t *x, int32_t *gw,
                           int32_t *gb)
{
    TT_CONV_DIMS(p);
    const int32_t C = Cin;
    /* int32 sums: OH*OW <= TT_CONV_GRAD_MAX_POSITIONS terms of |e*x| <= 127*127 each. */
    int32_t oh, ow, kh, kw, c, kh0, kh1, kw0, kw1;
    (void)Cout;
    memset(gw, 0, sizeof(int32_t) * (size_t)(KH * KW * C));
    memset(gb, 0, sizeof(int32_t) * (size_t)C);
    for (oh = 0; oh < OH; oh++) {
        const int32_t ih0 = oh * sh - pt;
        tt_conv_taps(ih0, KH, H, &kh0, &kh1);
        for (ow = 0; ow < OW; ow++) {
            const int32_t iw0 = ow * sw - pl;
            const int8_t *ep = e + (oh * OW + ow) * C;
            tt_conv_taps(iw0, KW, W, &kw0, &kw1);
            for (c = 0; c < C; c++) gb[c] += ep[c];
            for (kh = kh0; kh < kh1; kh++) {
                for (kw = kw0; kw < kw1; kw++) {
                    const int8_t *xp = x + ((ih0 + kh) * W + iw0 + kw) * C;
                    int32_t *gp = gw + (kh * KW + kw) * C;
                    for (c = 0; c < C; c++) gp[c] += (int32_t)ep[c] * (int32_t)xp[c];
                }
            }
        }
    }
}

/* The public entry points unpack their params into the positional bodies above, which Conv1d
 * shares (H = kh = Ho = 1). With two callers GCC keeps each body out of line with its dims in
 * argument registers and stack slots; unpacking the struct inside the loops cost W3's conv
 * forward 0.5 % more instructions on Cortex-M4 (bench/dev/profile_device.py). */
#define TT_CONV2D_ARGS(p) (p)->H, (p)->W, (p)->Cin, (p)->Cout, (p)->kh, (p)->kw, (p)->stride_h, \
    (p)->stride_w, (p)->pad_h, (p)->pad_w, (p)->Ho, (p)->Wo
#define TT_CONV1D_ARGS(p) 1, (p)->L, (p)->Cin, (p)->Cout, 1, (p)->k, 1, (p)->stride, 0, (p)->pad, 1, \
    (p)->Lo

int32_t tt_conv2d_fwd_s8(const tt_ctx *ctx, const tt_conv_params *p, const int8_t *x, int32_t ex,
                         int8_t *y)
{
    return conv2d_fwd(x, ex, p->w, p->ew, p->b, p->eb, TT_CONV2D_ARGS(p), ctx->scratch, y, ctx->stats);
}

int32_t tt_conv2d_bwd_s8(const tt_ctx *ctx, const tt_conv_params *p, const int8_t *e, int32_t ee,
                         int8_t *dx)
{
    return conv2d_bwd(e, ee, p->w, p->ew, TT_CONV2D_ARGS(p), ctx->scratch, dx, ctx->stats);
}

void tt_conv2d_grad_s32(const tt_conv_params *p, const int8_t *e, const int8_t *x, int32_t *gw,
                        int32_t *gb)
{
    conv2d_grad(e, x, TT_CONV2D_ARGS(p), gw, gb);
}

int32_t tt_conv1d_fwd_s8(const tt_ctx *ctx, const tt_conv1d_params *p, const int8_t *x,
                         int32_t ex, int8_t *y)
{
    return conv2d_fwd(x, ex, p->w, p->ew, p->b, p->eb, TT_CONV1D_ARGS(p), ctx->scratch, y, ctx->stats);
}

int32_t tt_conv1d_bwd_s8(const tt_ctx *ctx, const tt_conv1d_params *p, const int8_t *e,
                         int32_t ee, int8_t *dx)
{
    return conv2d_bwd(e, ee, p->w, p->ew, TT_CONV1D_ARGS(p), ctx->scratch, dx, ctx->stats);
}

void tt_conv1d_grad_s32(const tt_conv1d_params *p, const int8_t *e, const int8_t *x, int32_t *gw,
                        int32_t *gb)
{
    conv2d_grad(e, x, TT_CONV1D_ARGS(p), gw, gb);
}

/* ---- weight gradients a few output channels at a time (tt_conv_wgrad.h): conv2d_grad_gather on
 * the channel range, the biases apart; one entry per params struct (int16 and int8 weights) */
#include "tt_conv_wgrad.h"


void tt_conv2d_grad_w_chan_s32(const tt_conv_params *p, const int8_t *e, const int8_t *x,
                               int32_t co, int32_t nco, int32_t *gw)
{
    conv2d_grad_gather(e, x, TT_CONV2D_ARGS(p), co, co + nco, gw, 0);
}

void tt_conv2d_grad_b_s32(const tt_conv_params *p, const int8_t *e, int32_t *gb)
{
    conv_grad_b(e, p->Ho * p->Wo, p->Cout, gb);
}

void tt_conv1d_grad_w_chan_s32(const tt_conv1d_params *p, const int8_t *e, const int8_t *x,
                               int32_t co, int32_t nco, int32_t *gw)
{
    conv2d_grad_gather(e, x, TT_CONV1D_ARGS(p), co, co + nco, gw, 0);
}

void tt_conv1d_grad_b_s32(const tt_conv1d_params *p, const int8_t *e, int32_t *gb)
{
    conv_grad_b(e, p->Lo, p->Cout, gb);
}

void tt_conv2d_grad_w_chan_s32_w8(const tt_conv_w8_params *p, const int8_t *e, const int8_t *x,
                                  int32_t co, int32_t nco, int32_t *gw)
{
    conv2d_grad_gather(e, x, TT_CONV2D_ARGS(p), co, co + nco, gw, 0);
}

void tt_conv2d_grad_b_s32_w8(const tt_conv_w8_params *p, const int8_t *e, int32_t *gb)
{
    conv_grad_b(e, p->Ho * p->Wo, p->Cout, gb);
}

void tt_conv1d_grad_w_chan_s32_w8(const tt_conv1d_w8_params *p, const int8_t *e, const int8_t *x,
                                  int32_t co, int32_t nco, int32_t *gw)
{
    conv2d_grad_gather(e, x, TT_CONV1D_ARGS(p), co, co + nco, gw, 0);
}

void tt_conv1d_grad_b_s32_w8(const tt_conv1d_w8_params *p, const int8_t *e, int32_t *gb)
{
    conv_grad_b(e, p->Lo, p->Cout, gb);
}
