/** Integer batch normalization: portable scalar path, and Cortex-M DSP paths (TT_HAVE_DSP)
 * beside it with the same bits. Every helper mirrors one function of
 * tinytrain/ops/batchnorm.py; int64 everywhere a value can pass 2^31 (bounds in that file).
 * The per-element loops take int32 forms (one 32x32->64 multiply for x_hat, words of the
 * product for its shift) on channels where the bounds are checked once per channel; the int64
 * formulas remain for the others. On cores with the DSP extension and GCC, the train backward's
 * three passes and the forward's non-saturating output pass are inline-asm loops (their C twins
 * beside them serve the other cores and the host's emulated-DSP build;
 * tests/test_bn_kernel_qemu.py runs the asm under QEMU). The per-channel work runs in phases
 * across the channels, each a short loop or call of its own. */
#include <string.h>

#include "tt_batchnorm.h"
#include "tt_dsp.h"

#define BN_F TT_BN_XHAT_FRAC

#if defined(__GNUC__)
#define BN_NOINLINE __attribute__((noinline))
#define BN_ALWAYS_INLINE static inline __attribute__((always_inline))
#else
#define BN_NOINLINE
#define BN_ALWAYS_INLINE static inline
#endif

/** n * 2^t for n >= 0: rounded right shift (t < 0) or left shift capped at 2^61. */
static int64_t bn_scale_cap(int64_t n, int32_t t)
{
    if (t < 0) return tt_rshift_round_s64(n, -t < 62 ? -t : 62);
    if (n == 0) return 0;
    if (tt_bitwidth_u64((uint64_t)n) + t > 61) return (int64_t)1 << 61;
    return n << t;
}

/** sat_s32(round(n * 2^a / d)), ties toward +inf, exact; |n| < 2^40, 1 <= d < 2^25. */
static int32_t bn_rdiv(int64_t n, int32_t a, int64_t d)
{
    if (a < 0) return tt_sat_s32(tt_rshift_round_s64(tt_div_floor_s64(n, d), -a < 62 ? -a : 62));
    if (n == 0) return 0;
    if (tt_bitwidth_u64(tt_abs_u64(n)) + a > tt_bitwidth_u64((uint64_t)d) + 32)
        return n > 0 ? INT32_MAX : INT32_MIN;
    {
        const int64_t num = 2 * (n * ((int64_t)1 << a)) + d, den = 2 * d;
        if (num >= INT32_MIN && num <= INT32_MAX && den <= INT32_MAX) {
            /* the same floor division in 32 bits (a hardware divide on M3 and up) */
            const int32_t q = (int32_t)num / (int32_t)den;
            return (int32_t)num % (int32_t)den < 0 ? q - 1 : q;
        }
        return tt_sat_s32(tt_div_floor_s64(num, den));
    }
}

/** Shift-EMA r + round((b - r) / 2^k); the result lies between r and b. */
static inline int32_t bn_ema(int32_t r, int32_t b, int32_t k)
{
    const int64_t d = (int64_t)b - r;
    /* k = mom_k <= 31: the int32 rounding shift when b - r fits int32 (no 64-bit shifts) */
    if (d == (int32_t)d && k <= 31) return (int32_t)((uint32_t)r + (uint32_t)tt_rshift_round_s32((int32_t)d, k));
    return (int32_t)(r + tt_rshift_round_s64(d, k));
}

/* bn_rdiv(n, a, d) for 0 <= a < 29 and |n| 2^a < 2^29 (1 <= d < 2^25): num = 2 n 2^a + d and
 * 2 d fit int32 and no saturation is possible, so one 32-bit floor division; else bn_rdiv. */
static inline int32_t bn_rdiv_fast(int64_t n, int32_t a, int64_t d)
{
    const uint32_t lim = (uint32_t)1 << ((29 - a) & 31); /* a < 29: |n| < lim iff n + lim - 1 <= 2 lim - 2 */
    if ((uint32_t)a < 29 && n == (int32_t)n && (uint32_t)(int32_t)n + lim - 1u < 2u * lim - 1u) {
        const int32_t num = (int32_t)((uint32_t)(int32_t)n << (a + 1)) + (int32_t)d, den = 2 * (int32_t)d;
        const int32_t q = num / den;
        return num % den < 0 ? q - 1 : q;
    }
    return bn_rdiv(n, a, d);
}

/* tt_align(v, e_from, e_to) as an int32 (within [-2^30, 2^30]), a left shift (e_to < e_from) by
 * comparing v with 2^30 >> d first: v 2^d <= 2^30 iff v <= floor(2^30 / 2^d). */
static inline int32_t bn_align32(int32_t v, int32_t e_from, int32_t e_to)
{
    if (e_to < e_from) {
        const int32_t d = e_from - e_to > 31 ? 31 : e_from - e_to, lim = (int32_t)(TT_ALIGN_LIM >> d);
        if (v > lim) return (int32_t)TT_ALIGN_LIM;
        if (v < -lim) return -(int32_t)TT_ALIGN_LIM;
        return (int32_t)((uint32_t)v << d);
    }
    return tt_align_s32(v, e_from, e_to);
}

/** 1/sqrt(v) ~ inv * 2^(n/2 - TT_BN_INV_BITS), n = e_v (mod 2), bitwidth(v 2^n) in {31, 32}. */
static int32_t bn_inv_sqrt(int64_t v, int32_t e_v, int32_t *n_out)
{
    int32_t n = 32 - tt_bitwidth_u64((uint64_t)v);
    uint32_t s;
    if ((n - e_v) % 2 != 0) n -= 1;
    s = tt_isqrt_u32((uint32_t)(n >= 0 ? (uint64_t)v << n : (uint64_t)v >> -n));
    *n_out = n;
    /* floor((2^45 + floor(s/2)) / s) by two 32-bit divisions (no 64-bit division routine):
     * 2^45 + h = 2^29 * 2^16 + h with h < 2^15 <= s < 2^16, so q1 = 2^29 / s < 2^14 and the
     * remainder step (r1 * 2^16 + h) / s has r1 < s < 2^16: its numerator is below 2^32. */
    {
        const uint32_t q1 = ((uint32_t)1 << (TT_BN_INV_BITS - 16)) / s;
        const uint32_t r1 = ((uint32_t)1 << (TT_BN_INV_BITS - 16)) - q1 * s;
        return (int32_t)((q1 << 16) + ((r1 << 16) + (s >> 1)) / s);
    }
}

#if defined(__ARM_FEATURE_IDIV) || !defined(__arm__)
/* round(sqrt((i + 16.5) 2^26)) for i = 0..47: Newton seeds of bn_isqrt_hi, one per 2^26-wide
 * slice of [2^30, 2^32) (python: round(math.sqrt((i + 16.5) * 2**26))). */
static const uint16_t bn_isqrt_seed[48] = {
    33276, 34270, 35235, 36175, 37091, 37985, 38858, 39712, 40548, 41368, 42171, 42959,
    43733, 44494, 45242, 45977, 46702, 47415, 48117, 48809, 49492, 50166, 50830, 51486,
    52134, 52773, 53405, 54030, 54647, 55258, 55862, 56459, 57051, 57636, 58215, 58789,
    59357, 59919, 60477, 61029, 61576, 62119, 62657, 63190, 63719, 64243, 64763, 65279};

/* floor(sqrt(x)) for 2^30 <= x < 2^32 (tt_isqrt_u32's value). s0 = floor((floor(x / t) + t) / 2)
 * + 1 >= sqrt(x) for any t > 0 (AM-GM; the + 1 covers the floors), and a Newton step
 * floor((s + floor(x / s)) / 2) from any s >= floor(sqrt(x)) stays >= floor(sqrt(x)); with t
 * the slice's seed (within 1/32 of sqrt(x)) two steps leave s at most one above, which the loop
 * removes (s > floor(x / s) iff s^2 > x). Checked for every x in range. */
static inline uint32_t bn_isqrt_hi(uint32_t x)
{
    const uint32_t t = bn_isqrt_seed[(x >> 26) - 16];
    uint32_t s = ((x / t + t) >> 1) + 1;
    s = (s + x / s) >> 1;
    while (s > x / s) s--;
    return s;
}
#endif

/** bn_inv_sqrt(v, 0, n_out) for 1 <= v < 2^32: n >= 0, a left shift in 32 bits. */
static inline int32_t bn_inv_sqrt32(uint32_t v, int32_t *n_out)
{
    const int32_t n = (32 - tt_bitwidth_u64(v)) & ~1; /* e_v = 0: n even */
#if defined(__ARM_FEATURE_IDIV) || !defined(__arm__)
    const uint32_t s = bn_isqrt_hi(v << n); /* v << n in [2^30, 2^32) */
#else
    const uint32_t s = tt_isqrt_u32(v << n); /* no hardware divide: the bit-by-bit loop */
#endif
    const uint32_t q1 = ((uint32_t)1 << (TT_BN_INV_BITS - 16)) / s;
    const uint32_t r1 = ((uint32_t)1 << (TT_BN_INV_BITS - 16)) - q1 * s;
    *n_out = n;
    return (int32_t)((q1 << 16) + ((r1 << 16) + (s >> 1)) / s);
}

/* The train forward's running statistics of every channel from scratch[c] = S, scratch[C + c]
 * = Q: mean by bn_rdiv(S, ex - e_rm, P), variance by bn_rdiv(M2, 2 ex - e_rv, P (P - 1)), each
 * folded in by the shift-EMA. Out of line: a loop of its own keeps its constants in registers. */
static BN_NOINLINE void bn_running_stats(const int64_t *scratch, int32_t P, int32_t C, int32_t ex,
                                         int32_t *rmean, int32_t e_rm, int32_t *rvar, int32_t e_rv,
                                         int32_t mom_k)
{
    const int32_t am = ex - e_rm, av = 2 * ex - e_rv;
    const int64_t dv = (int64_t)P * (P - 1);
    int32_t c = 0;
    /* Where the whole layer allows (P <= 362: m2 < 2^31; |S| <= 128 P, so 128 P 2^am < 2^29 makes
     * every mean bn_rdiv_fast's 32-bit division; 0 <= av <= 28; 2 <= mom_k <= 31), the channels
     * in 32 bits: the variance's division when m2 2^av < 2^29 (m2 >= 0: num > 0, a truncating
     * division is the floor), the EMA's difference by a subtraction that reports its overflow
     * and its rounding shift as ((d >> (k - 1)) + 1) >> 1 (= floor((d + 2^(k-1)) / 2^k); no
     * overflow for k >= 2, where d >> (k - 1) < 2^30: at k = 1 and d = INT32_MAX the + 1 would
     * wrap, so momentum 0.5 takes the loop below). A channel outside those bounds takes bn_rdiv /
     * bn_ema. */
    if (P <= 362 && (uint32_t)am <= 28u && (uint32_t)(128 * P) < ((uint32_t)1 << (29 - am)) &&
        (uint32_t)av <= 28u && mom_k >= 2 && mom_k <= 31) {
        const int32_t dm = 2 * P, hm = P, k1 = mom_k - 1, dd = (int32_t)(2 * dv), hd = (int32_t)dv;
        const uint32_t vlim = (uint32_t)1 << (29 - av);
        for (; c < C; c++) {
            const int32_t S = (int32_t)scratch[c], Q = (int32_t)scratch[C + c];
            const uint32_t m2 = (uint32_t)P * (uint32_t)Q - (uint32_t)(S * S);
            const int32_t num = (int32_t)((uint32_t)S << (am + 1)) + hm;
            int32_t bm = num / dm, bv, r, d;
            if (num % dm < 0) bm--;
            bv = m2 < vlim ? (int32_t)(((m2 << (av + 1)) + (uint32_t)hd) / (uint32_t)dd)
                           : bn_rdiv((int64_t)m2, av, dv);
            r = rmean[c];
#if defined(__GNUC__)
            if (!__builtin_sub_overflow(bm, r, &d)) rmean[c] = r + (((d >> k1) + 1) >> 1);
            else
#endif
                rmean[c] = bn_ema(r, bm, mom_k);
            r = rvar[c];
#if defined(__GNUC__)
            if (!__builtin_sub_overflow(bv, r, &d)) rvar[c] = r + (((d >> k1) + 1) >> 1);
            else
#endif
                rvar[c] = bn_ema(r, bv, mom_k);
        }
    }
    for (; c < C; c++) {
        const int32_t S = (int32_t)scratch[c], Q = (int32_t)scratch[C + c];
        const int64_t m2 = (int64_t)P * Q - (int64_t)S * S;
        rmean[c] = bn_ema(rmean[c], bn_rdiv_fast(S, am, P), mom_k);
        rvar[c] = bn_ema(rvar[c], bn_rdiv_fast(m2, av, dv), mom_k);
    }
}

/** round(v * 2^-sh) before int32 saturation; +-2^32 stands for a too large left shift. */
static int64_t bn_shift_unsat(int64_t v, int32_t sh)
{
    if (sh >= 0) return tt_rshift_round_s64(v, sh < 62 ? sh : 62);
    if (v == 0) return 0;
    if (tt_bitwidth_u64(tt_abs_u64(v)) > 32 + sh)
        return v > 0 ? (int64_t)1 << 32 : -((int64_t)1 << 32);
    return v * ((int64_t)1 << -sh);
}

/** x_hat_q of one value of channel c, saturated to int32; counts saturations if nsat. */
static int32_t bn_xhat(int32_t xv, int64_t A, const int32_t *saved, int32_t C, int32_t c,
                       uint32_t *nsat)
{
    int64_t r = bn_shift_unsat((A * xv - saved[c]) * saved[C + c], saved[2 * C + c]);
    int32_t xh = tt_sat_s32(r);
    if (nsat && xh != r) (*nsat)++;
    return xh;
}

/** Channel c's x_hat constants, hoisted out of the loops over positions. fast: 1 <= sh <= 62
 * (always in train, where 18 <= sh <= 48), so bn_xhat's rounded shift is (v + half) >> sh: the
 * same floor(v / 2^sh + 1/2), and no overflow as |v| < 2^61. A*x - B fits int32 (|A*x - B| <
 * 2^20 in train, < 2^31 in eval: bounds in ops/batchnorm.py), so v is one 32x32->64 multiply. */
typedef struct {
    int32_t A, B, inv, sh, fast; /* no int64 member: a copy would go through VFP registers in
                                   * hard-float builds, which must stay VFP-free */
} bn_chan;

static bn_chan bn_channel(int64_t A, const int32_t *saved, int32_t C, int32_t c)
{
    bn_chan k;
    k.A = (int32_t)A;
    k.B = saved[c];
    k.inv = saved[C + c];
    k.sh = saved[2 * C + c];
    k.fast = k.sh >= 1 && k.sh <= 62;
    return k;
}

/** (a * b + 2^31) >> 32 of the exact product: SMMULR on DSP cores, a 32x32->64 multiply
 *  elsewhere. */
static inline int32_t bn_mulhr(int32_t a, int32_t b)
{
#if TT_HAVE_DSP
    return tt_smmulr(a, b);
#else
    return (int32_t)((uint64_t)((int64_t)a * b + ((int64_t)1 << 31)) >> 32);
#endif
}

/* Channel k's x_hat as one rounded high-word multiply. For 1 <= sh <= 32 and z = 32 - sh,
 * floor((t * inv + 2^(sh-1)) / 2^sh) = floor((t * 2^z * inv + 2^31) / 2^32) exactly (numerator
 * and denominator times 2^z), = bn_mulhr(t * 2^z, inv) when t * 2^z fits int32 for every int8
 * x: |t| = |A*x - B| <= 128 A + |B| (A > 0; < 2^32 as A <= 2^12); then |x_hat| < 2^30, no
 * saturation. Returns whether it applies, with *az = A * 2^z and *bz = B * 2^z mod 2^32
 * (x * az - bz wraps back to the exact t * 2^z). */
static int32_t bn_mulr_consts(const bn_chan *k, uint32_t *az, uint32_t *bz)
{
    const uint32_t B = (uint32_t)k->B, tmax = (uint32_t)k->A * 128u + (k->B < 0 ? 0u - B : B);
    const int32_t z = 32 - k->sh;
    if (k->sh < 1 || k->sh > 32 || tmax > ((uint32_t)INT32_MAX >> z)) return 0;
    *az = (uint32_t)k->A << z;
    *bz = B << z;
    return 1;
}

/** bn_xhat(xv, A, saved, C, c, nsat) for the channel k describes, bit for bit. */
static inline int32_t bn_xhat_k(const bn_chan *k, int32_t xv, const int32_t *saved, int32_t C,
                                int32_t c, uint32_t *nsat)
{
    uint32_t az, bz;
    if (bn_mulr_consts(k, &az, &bz)) return bn_mulhr((int32_t)((uint32_t)xv * az - bz), k->inv);
    if (k->fast) {
        const int64_t r = ((int64_t)(k->A * xv - k->B) * k->inv + ((int64_t)1 << (k->sh - 1))) >> k->sh;
        const int32_t xh = tt_sat_s32(r);
        if (nsat && xh != r) (*nsat)++;
        return xh;
    }
    return bn_xhat(xv, k->A, saved, C, c, nsat);
}

/* Whether channel k's x_hat takes an int32 form for every int8 x: bn_mulr_consts, or sh >= 33
 * (x_hat = (hi(t * inv) + 2^(sh - 33)) >> (sh - 32): half has no low word and the low word of
 * t * inv cannot carry into the result) when x_hat does not saturate (the callers check that). */
static int32_t bn_fast32(const bn_chan *k)
{
    uint32_t az, bz;
    return k->fast && (k->sh >= 33 || bn_mulr_consts(k, &az, &bz));
}

/* y[i] = requant(g * x_hat(x[i]) + b) for i = 0, C, .., n - C (one channel) on the fast path:
 * bn_fast32, x_hat fits int32 (no saturation in the channel), every |g * x_hat + b| <= m <=
 * INT32_MAX, so the sum is formed mod 2^32 and is exact, and s in [1, 24], so round(v / 2^s) is
 * ((v >> (s - 1)) + 1) >> 1 (tt_rshift_round on an int32). With FOLD (the caller's m + 2^(s-1)
 * <= INT32_MAX) the half is folded into b and round(v / 2^s) = (v + 2^(s-1)) >> s: the same
 * value (floor(floor(v / 2^(s-1) + 1) / 2) = floor((v + 2^(s-1)) / 2^s)), two instructions less
 * per element. Inlined into bn_out32 with MULR and FOLD constant: four loops, one source. */
BN_ALWAYS_INLINE void bn_out32_loop(const int8_t *x, int32_t n, int32_t C, const bn_chan *k, int32_t g,
                                    int32_t b, int32_t s, int8_t *y, uint32_t *nsat, const int32_t MULR,
                                    const int32_t FOLD)
{
    const int32_t A = k->A, B = k->B, inv = k->inv, sh = k->sh, s1 = s - 1;
    const int32_t bb = FOLD ? (int32_t)((uint32_t)b + ((uint32_t)1 << s1)) : b;
    const int32_t hh = MULR ? 0 : (int32_t)1 << (sh - 33), sr = MULR ? 0 : sh - 32;
    uint32_t cnt = 0, az = 0, bz = 0;
    const int8_t *xp = x, *end = x + n;
    if (MULR) bn_mulr_consts(k, &az, &bz);
    for (; xp < end; xp += C, y += C) {
        const int32_t xv = *xp;
        const int32_t xh = MULR ? bn_mulhr((int32_t)((uint32_t)xv * az - bz), inv)
                                : ((int32_t)((uint64_t)((int64_t)(A * xv - B) * inv) >> 32) + hh) >> sr;
        const int32_t v = (int32_t)((uint32_t)g * (uint32_t)xh + (uint32_t)bb);
        const int32_t r = FOLD ? v >> s : ((v >> s1) + 1) >> 1;
        if ((uint32_t)(r + TT_S8_MAX) > 2u * TT_S8_MAX) { cnt++; *y = r > 0 ? TT_S8_MAX : -TT_S8_MAX; }
        else *y = (int8_t)r;
    }
    *nsat += cnt;
}

/* Two positions (x[0], x[C]) of bn_out32_nosat's asm loop: y = (g smmulr(x az - bz, inv) + bb) >> s,
 * then both pointers two positions on. */
#define BN_OUT_TWO \
    "ldrsb %[a], [%[xp]]\n\t" \
    "ldrsb %[b], [%[xp], %[C]]\n\t" \
    "mla %[a], %[a], %[az], %[nbz]\n\t" \
    "mla %[b], %[b], %[az], %[nbz]\n\t" \
    "smmulr %[a], %[a], %[inv]\n\t" \
    "smmulr %[b], %[b], %[inv]\n\t" \
    "mla %[a], %[a], %[g], %[bb]\n\t" \
    "mla %[b], %[b], %[g], %[bb]\n\t" \
    "asr %[a], %[a], %[s]\n\t" \
    "asr %[b], %[b], %[s]\n\t" \
    "strb %[a], [%[yp]]\n\t" \
    "strb %[b], [%[yp], %[C]]\n\t" \
    "add %[xp], %[xp], %[C], lsl #1\n\t" \
    "add %[yp], %[yp], %[C], lsl #1\n\t"

/* bn_out32_loop with MULR and FOLD when no output of the channel saturates (the caller's check at
 * the two ends of its x range: the output is monotone in x), so the clamp and its count go. On
 * DSP cores an inline-asm loop of four positions a turn (30 instructions), its C twin beside it
 * for the other cores and the host's emulated-DSP build: two positions a turn, indexed from two
 * bases (no pointer steps per element). */
static BN_NOINLINE void bn_out32_nosat(const int8_t *x, int32_t n, int32_t C, uint32_t az, uint32_t bz,
                                       int32_t inv, int32_t g, int32_t b, int32_t s, int8_t *y)
{
    const int32_t bb = (int32_t)((uint32_t)b + ((uint32_t)1 << (s - 1)));
    uint32_t nbz = 0u - bz; /* x az - bz as one MLA */
#if defined(__GNUC__)
    __asm__("" : "+r"(nbz)); /* opaque: GCC would turn x az + (-bz) back into MUL and SUB */
#endif
#if TT_HAVE_DSP && defined(__ARM_FEATURE_DSP) && __ARM_FEATURE_DSP && defined(__GNUC__) && defined(__OPTIMIZE__)
    /* stepped pointers (no index registers: the loop's twelve operands fit), the last (fewer
     * than four) positions one at a time */
    {
        const int8_t *xp = x, *const xe = x + n;
        int8_t *yp = y;
        if (3 * C < n) {
            const int8_t *const xl = xe - 3 * C;
            uint32_t ta, tb;
            __asm__ volatile(
                "1:\n\t"
                BN_OUT_TWO BN_OUT_TWO
                "cmp %[xp], %[xl]\n\t"
                "blo 1b"
                : [a] "=&r"(ta), [b] "=&r"(tb), [xp] "+r"(xp), [yp] "+r"(yp)
                : [C] "r"(C), [xl] "r"(xl), [az] "r"(az), [nbz] "r"(nbz), [inv] "r"(inv), [g] "r"(g),
                  [bb] "r"(bb), [s] "r"(s)
                : "cc", "memory");
        }
        for (; xp < xe; xp += C, yp += C) {
            const int32_t h0 = bn_mulhr((int32_t)((uint32_t)(int32_t)*xp * az + nbz), inv);
            *yp = (int8_t)((int32_t)((uint32_t)g * (uint32_t)h0 + (uint32_t)bb) >> s);
        }
    }
#else
    {
        const int8_t *x1 = x + C;
        int8_t *y1 = y + C;
        const int32_t C2 = 2 * C;
        int32_t i = 0;
        for (; i + C < n; i += C2) {
            const int32_t h0 = bn_mulhr((int32_t)((uint32_t)(int32_t)x[i] * az + nbz), inv);
            const int32_t h1 = bn_mulhr((int32_t)((uint32_t)(int32_t)x1[i] * az + nbz), inv);
            y[i] = (int8_t)((int32_t)((uint32_t)g * (uint32_t)h0 + (uint32_t)bb) >> s);
            y1[i] = (int8_t)((int32_t)((uint32_t)g * (uint32_t)h1 + (uint32_t)bb) >> s);
        }
        if (i < n) {
            const int32_t h0 = bn_mulhr((int32_t)((uint32_t)(int32_t)x[i] * az + nbz), inv);
            y[i] = (int8_t)((int32_t)((uint32_t)g * (uint32_t)h0 + (uint32_t)bb) >> s);
        }
    }
#endif
}

/* The forward's ends when every channel (C <= 64) is on bn_mulr_consts' path (x_hat =
 * bn_mulhr(x az - bz, inv), no saturation), as bn_fwd's general loop forms them, in a loop of
 * its own (few live values): b = bn_align32(beta) (in the loop of the tests, out of the main
 * one), the sums el, er at the channel's smallest and largest x (its range
 * from scratch[2C + c]) into scratch {b[C], er[C], el[C]}, zc[c] = z + 1 and *m = the largest
 * |el|, |er|, or the OR of them all when its bitwidth is not 31: the caller reads m only through
 * its bitwidth (the shift), m <= INT32_MAX (bitwidth <= 31) and m + 2^(s-1) <= INT32_MAX (s =
 * bitwidth - 7: true for bitwidth <= 30, false from 32 on), so the OR, whose bitwidth is the
 * maximum's, decides the same except at bitwidth 31, where the maximum is taken. Returns 0
 * when some channel is not on that path, having written only b of the channels before it (the
 * caller's general loop forms its own). */
static BN_NOINLINE int32_t bn_fwd_ends(int32_t A, int32_t C, const int32_t *saved, const int16_t *gamma,
                                       const int32_t *beta, int32_t e_b, int32_t ea, int64_t *scratch,
                                       uint8_t *zc, uint64_t *m_out)
{
    const uint32_t a128 = (uint32_t)A * 128u;
    uint64_t m = 0;
    int32_t c;
    if (C > 64) return 0;
    for (c = 0; c < C; c++) {
        const int32_t B = saved[c], sh = saved[2 * C + c];
        const uint32_t tmax = a128 + (B < 0 ? 0u - (uint32_t)B : (uint32_t)B);
        if ((uint32_t)(sh - 1) > 31u || tmax > ((uint32_t)INT32_MAX >> (32 - sh))) return 0;
        scratch[c] = bn_align32(beta[c], e_b, ea); /* S is no longer read (nor b by the general path) */
    }
    for (c = 0; c < C; c++) {
        const int32_t B = saved[c], inv = saved[C + c], z = 32 - saved[2 * C + c];
        const int32_t r = (int32_t)scratch[2 * C + c], lo = r >> 8, hi = (r & 255) - 128; /* lo 256 + hi + 128 */
        const uint32_t az = (uint32_t)A << z, bz = (uint32_t)B << z;
        const int32_t xl = bn_mulhr((int32_t)((uint32_t)lo * az - bz), inv);
        const int32_t xr = bn_mulhr((int32_t)((uint32_t)hi * az - bz), inv);
        const int32_t g = gamma[c], b = (int32_t)scratch[c];
        const int64_t el = (int64_t)g * xl + b, er = (int64_t)g * xr + b;
        const uint64_t al = tt_abs_u64(el), ar = tt_abs_u64(er);
        scratch[C + c] = er;
        scratch[2 * C + c] = el;
        zc[c] = (uint8_t)(z + 1);
        m |= al | ar;
    }
    if (tt_bitwidth_u64(m) == 31) { /* the OR has the maximum's bitwidth; only here is that not enough */
        m = 0;
        for (c = 0; c < C; c++) {
            const uint64_t al = tt_abs_u64(scratch[2 * C + c]), ar = tt_abs_u64(scratch[C + c]);
            if (al > m) m = al;
            if (ar > m) m = ar;
        }
    }
    *m_out = m;
    return 1;
}

/* The forward's output pass of every channel c < 64 with zc[c] = z + 1 != 0 (bn_mulr_consts'
 * path, x_hat unsaturated) whose two ends' outputs do not saturate, when the half folds (the
 * caller's fold: every end sum fits int32): bn_out32_nosat for each, from a loop of its own
 * (the per-channel tests and arguments without bn_fwd's loop state).
 * sums: scratch {b[C], er[C], el[C]}. Marks the channels it wrote by zc[c] = 0xFF and returns
 * their count. */
static BN_NOINLINE int32_t bn_out_fold_all(const int8_t *x, int32_t P, int32_t C, int32_t A, const int32_t *saved,
                                           const int16_t *gamma, const int64_t *sums, int32_t s, uint8_t *zc,
                                           int8_t *y)
{
    const int32_t h = (int32_t)1 << (s - 1), n = P * C, cn = C < 64 ? C : 64;
    int32_t c, done = 0;
    for (c = 0; c < cn; c++) {
        const int32_t z = zc[c] - 1;
        if (z >= 0) {
            const int32_t rl = ((int32_t)sums[2 * C + c] + h) >> s, rr = ((int32_t)sums[C + c] + h) >> s;
            if ((uint32_t)(rl + TT_S8_MAX) <= 2u * TT_S8_MAX && (uint32_t)(rr + TT_S8_MAX) <= 2u * TT_S8_MAX) {
                bn_out32_nosat(x + c, n, C, (uint32_t)A << z, (uint32_t)saved[c] << z, saved[C + c], gamma[c],
                               (int32_t)sums[c], s, y + c);
                zc[c] = 0xFF;
                done++;
            }
        }
    }
    return done;
}

/* Out of line: its loop keeps its constants in registers. */
static BN_NOINLINE void bn_out32(const int8_t *x, int32_t n, int32_t C, const bn_chan *k, int32_t g, int32_t b, int32_t s,
                                 int32_t fold, int32_t nosat, int8_t *y, uint32_t *nsat)
{
    uint32_t az, bz;
    const int32_t mulr = bn_mulr_consts(k, &az, &bz);
    if (mulr && fold && nosat) bn_out32_nosat(x, n, C, az, bz, k->inv, g, b, s, y);
    else if (mulr && fold) bn_out32_loop(x, n, C, k, g, b, s, y, nsat, 1, 1);
    else if (mulr) bn_out32_loop(x, n, C, k, g, b, s, y, nsat, 1, 0);
    else if (fold) bn_out32_loop(x, n, C, k, g, b, s, y, nsat, 0, 1);
    else bn_out32_loop(x, n, C, k, g, b, s, y, nsat, 0, 0);
}

#if TT_HAVE_DSP
/* bn_stats' words of channel c: S, Q, and its range lo * 256 + (hi + 128) from the low bytes of
 * lo and hi. */
BN_ALWAYS_INLINE void bn_stats_put(int64_t *scratch, int32_t C, int32_t c, int32_t S, int32_t Q, uint32_t lo,
                                   uint32_t hi)
{
    scratch[c] = S;
    scratch[C + c] = Q;
    scratch[2 * C + c] = (int32_t)(int8_t)lo * 256 + ((int32_t)(int8_t)hi + 128);
}
#endif

/* Per channel c of x (P positions, C channels): scratch[c] = S = sum x, scratch[C + c] = Q =
 * sum x^2 (train only; |S| < 2^19, Q < 2^26 for P <= 4096) and scratch[2C + c] = lo * 256 +
 * (hi + 128) for the range [lo, hi] of x; P >= 1. */
static BN_NOINLINE void bn_stats(const int8_t *x, int32_t P, int32_t C, int32_t train, int64_t *scratch)
{
    int32_t p, c = 0;
#if TT_HAVE_DSP
    /* Four channels per word, P <= 255 so that |S| <= 128 P fits an int16 lane: SXTB16 splits
     * channels (c, c+2) and, of the word rotated by 8, (c+1, c+3) into sign-extended lanes;
     * SADD16 sums them lane by lane, SMLABB / SMLATT square each lane into its own Q (exact:
     * Q < 2^22), SSUB8 + SEL keep the bytewise minimum and maximum. Eval computes the sums too
     * (cheaper than a second loop) and does not read them. */
    if (P <= 255) {
        for (; c + 4 <= C; c += 4) {
            const int8_t *xc = x + c;
            uint32_t lo = tt_ld_s8x4(xc), hi = lo, s02 = 0, s13 = 0;
            int32_t q0 = 0, q1 = 0, q2 = 0, q3 = 0;
            for (p = 0; p < P; p++, xc += C) {
                const uint32_t v = tt_ld_s8x4(xc);
                const int32_t ev = __sxtb16((int32_t)v), od = __sxtb16((int32_t)((v >> 8) | (v << 24)));
                s02 = (uint32_t)__sadd16((int32_t)s02, ev);
                s13 = (uint32_t)__sadd16((int32_t)s13, od);
                q0 = __smlabb(ev, ev, q0);
                q2 = __smlatt(ev, ev, q2);
                q1 = __smlabb(od, od, q1);
                q3 = __smlatt(od, od, q3);
                (void)__ssub8((int32_t)v, (int32_t)lo);
                lo = __sel(lo, v);
                (void)__ssub8((int32_t)v, (int32_t)hi);
                hi = __sel(v, hi);
            }
            /* channel by channel, each value formed in 32 bits and stored at once (no 64-bit
             * arithmetic, nothing held across the stores) */
            bn_stats_put(scratch, C, c, (int16_t)(s02 & 0xFFFFu), q0, lo, hi);
            bn_stats_put(scratch, C, c + 1, (int16_t)(s13 & 0xFFFFu), q1, lo >> 8, hi >> 8);
            bn_stats_put(scratch, C, c + 2, (int32_t)s02 >> 16, q2, lo >> 16, hi >> 16);
            bn_stats_put(scratch, C, c + 3, (int32_t)s13 >> 16, q3, lo >> 24, hi >> 24);
        }
    }
#endif
    for (; c < C; c++) {
        const int8_t *xc = x + c;
        int32_t S = 0, Q = 0, lo = xc[0], hi = xc[0];
        if (train) {
            for (p = 0; p < P; p++, xc += C) {
                const int32_t v = xc[0];
                S += v;
                Q += v * v;
                if (v < lo) lo = v;
                if (v > hi) hi = v;
            }
        } else {
            for (p = 0; p < P; p++, xc += C) {
                const int32_t v = xc[0];
                if (v < lo) lo = v;
                if (v > hi) hi = v;
            }
        }
        scratch[c] = S;
        scratch[C + c] = Q;
        scratch[2 * C + c] = (int64_t)lo * 256 + (hi + 128);
    }
}

/* The forward on positional arguments (tt_batchnorm_params' fields in order), out of line with
 * them in argument registers and stack slots: unpacking the struct inside the loops cost W3's
 * batch norm forward 0.4 % more instructions on Cortex-M4 (bench/dev/profile_device.py).
 *
 * x_hat is non-decreasing in x within a channel (A > 0, inv > 0, and every rounding, shift and
 * clamp of bn_xhat is monotone), so gamma * x_hat + b is monotone in x: its largest |.| is taken
 * at the channel's smallest or largest x, and x_hat saturates somewhere in the channel iff it
 * does at one of those two. The maximum (hence the shift) and the saturation count come from
 * two evaluations per channel; only a channel whose x_hat saturates (eval, stale statistics) is
 * evaluated element by element. Scratch (3C words): b, flags and the x range per channel. */
static int32_t bn_fwd(const int8_t *x, int32_t ex, int32_t P, int32_t C, const int16_t *gamma,
                      int32_t e_g, const int32_t *beta, int32_t e_b, int32_t *rmean, int32_t e_rm,
                      int32_t *rvar, int32_t e_rv, int32_t eps_m, int32_t eps_k, int32_t mom_k,
                      int32_t train, int32_t *saved, int64_t *scratch, int8_t *y, tt_stats *st)
{
    const int32_t ea = e_g - BN_F;
    const int64_t A = train ? P : 1 << TT_BN_EVAL_FRAC;
    uint64_t m = 0;
    int32_t p, c, s, n;
    uint8_t zc[64]; /* channel c < 64: z + 1 on bn_mulr_consts' path, else 0 */
    int32_t fold;
    bn_stats(x, P, C, train, scratch);
    /* The channels in phases, each a short loop with few live values (one loop doing all of it
     * spilled most of them): the saved constants; the running statistics (train); then x_hat's
     * ends, the sums at them and the maximum. Channel c reads its scratch words (S, Q, range)
     * in the phases before the last, which reads its range before writing b and the ends. */
    if (train) {
        const int64_t eps_v = bn_scale_cap((int64_t)eps_m * P * P, -eps_k - 2 * ex);
        if (P <= 362 && eps_v < ((int64_t)1 << 31)) {
            /* m2 = P Q - S^2 <= P Q <= P^2 2^14 < 2^31 and eps_v < 2^31: V fits uint32 */
            const uint32_t ev = (uint32_t)eps_v;
            for (c = 0; c < C; c++) {
                const int32_t S = (int32_t)scratch[c], Q = (int32_t)scratch[C + c];
                const uint32_t v = (uint32_t)P * (uint32_t)Q - (uint32_t)(S * S) + ev;
                saved[c] = S;
                saved[C + c] = bn_inv_sqrt32(v > 1u ? v : 1u, &n);
                saved[2 * C + c] = TT_BN_INV_BITS - BN_F - n / 2;
            }
        } else {
            for (c = 0; c < C; c++) {
                const int32_t S = (int32_t)scratch[c], Q = (int32_t)scratch[C + c];
                const int64_t v = (int64_t)P * Q - (int64_t)S * S + eps_v;
                saved[c] = S;
                saved[C + c] = bn_inv_sqrt(v > 1 ? v : 1, 0, &n);
                saved[2 * C + c] = TT_BN_INV_BITS - BN_F - n / 2;
            }
        }
        bn_running_stats(scratch, P, C, ex, rmean, e_rm, rvar, e_rv, mom_k);
    } else {
        const int64_t eps_r = bn_scale_cap(eps_m, -eps_k - e_rv);
        for (c = 0; c < C; c++) {
            const int64_t v = (rvar[c] > 0 ? rvar[c] : 0) + eps_r;
            saved[c] = (int32_t)tt_align(rmean[c], e_rm, ex - TT_BN_EVAL_FRAC);
            saved[C + c] = bn_inv_sqrt(v > 1 ? v : 1, e_rv, &n);
            saved[2 * C + c] = TT_BN_INV_BITS - BN_F + (e_rv - n) / 2 + TT_BN_EVAL_FRAC - ex;
        }
    }
    if (!bn_fwd_ends((int32_t)A, C, saved, gamma, beta, e_b, ea, scratch, zc, &m))
    for (c = 0; c < C; c++) {
        const int64_t r = scratch[2 * C + c];
        const int32_t g = gamma[c], lo = (int32_t)(r >> 8), hi = (int32_t)(r & 255) - 128;
        const int32_t b = bn_align32(beta[c], e_b, ea);
        bn_chan k = bn_channel(A, saved, C, c);
        uint32_t sat = 0, az, bz;
        int32_t xl, xr;
        int64_t el, er;
        if (bn_mulr_consts(&k, &az, &bz)) { /* x_hat = bn_mulhr(x az - bz, inv): no saturation */
            xl = bn_mulhr((int32_t)((uint32_t)lo * az - bz), k.inv);
            xr = bn_mulhr((int32_t)((uint32_t)hi * az - bz), k.inv);
            if (c < 64) zc[c] = (uint8_t)(33 - k.sh); /* z + 1 */
        } else {
            const bn_chan k2 = k; /* its address taken here only: k stays in registers */
            xl = bn_xhat_k(&k2, lo, saved, C, c, &sat);
            xr = bn_xhat_k(&k2, hi, saved, C, c, &sat);
            if (c < 64) zc[c] = 0;
        }
        el = (int64_t)g * xl + b;
        er = (int64_t)g * xr + b;
        scratch[c] = b;
        /* a saturating channel is marked by its count << 56 (>= 2^56; |acc| < 2^47 otherwise: a
         * computed mark, as a 64-bit constant would be stored through VFP registers in hard-float
         * builds); else the sums at its two ends, for the output pass's saturation check */
        scratch[C + c] = sat ? (int64_t)sat << 56 : er;
        scratch[2 * C + c] = el;
        if (sat) {
            const bn_chan k2 = k;
            for (p = 0; p < P; p++) {
                const int32_t xh = bn_xhat_k(&k2, x[(int64_t)p * C + c], saved, C, c, &st->saturated);
                const uint64_t a = tt_abs_u64((int64_t)g * xh + b);
                if (a > m) m = a;
            }
        } else {
            const uint64_t al = tt_abs_u64(el), ar = tt_abs_u64(er);
            if (al > m) m = al;
            if (ar > m) m = ar;
        }
    }
    saved[3 * C] = ex;
    s = tt_requant_shift(m, 8);
    fold = s >= 1 && m + ((uint64_t)1 << (s - 1)) <= (uint64_t)INT32_MAX; /* (v + 2^(s-1)) >> s in int32 */
    if (fold && bn_out_fold_all(x, P, C, (int32_t)A, saved, gamma, scratch, s, zc, y) == C) return ea + s;
    for (c = 0; c < C; c++) {
        bn_chan k;
        int64_t b;
        int32_t g;
        /* m <= INT32_MAX: s <= 24; |b| <= 2^30 (tt_align clamps) */
        if (c < 64 && zc[c] == 0xFF) continue; /* written by bn_out_fold_all */
        k = bn_channel(A, saved, C, c);
        b = scratch[c];
        g = gamma[c];
        if (m <= (uint64_t)INT32_MAX && s >= 1 && scratch[C + c] < ((int64_t)1 << 56) && bn_fast32(&k)) {
            /* both ends' sums fit int32 here (<= m) */
            const int32_t rl = tt_rshift_round_s32((int32_t)scratch[2 * C + c], s);
            const int32_t rr = tt_rshift_round_s32((int32_t)scratch[C + c], s);
            const int32_t nosat = (uint32_t)(rl + TT_S8_MAX) <= 2u * TT_S8_MAX && (uint32_t)(rr + TT_S8_MAX) <= 2u * TT_S8_MAX;
            bn_out32(x + c, P * C, C, &k, g, (int32_t)b, s, fold, nosat, y + c, &st->saturated);
            continue;
        }
        for (p = 0; p < P; p++) {
            const int32_t xh = bn_xhat_k(&k, x[(int64_t)p * C + c], saved, C, c, 0);
            const int64_t r = tt_rshift_round_s64((int64_t)g * xh + b, s);
            if (r > TT_S8_MAX || r < -TT_S8_MAX) st->saturated++;
            y[(int64_t)p * C + c] = tt_sat_s8(r);
        }
    }
    return ea + s;
}

#define TT_BN_FWD_ARGS(p) (p)->P, (p)->C, (p)->gamma, (p)->e_g, (p)->beta, (p)->e_b, (p)->rmean, \
    (p)->e_rm, (p)->rvar, (p)->e_rv, (p)->eps_m, (p)->eps_k, (p)->mom_k

int32_t tt_batchnorm_fwd_s8(const tt_ctx *ctx, const tt_batchnorm_params *p, const int8_t *x,
                            int32_t ex, int8_t *y)
{
    return bn_fwd(x, ex, TT_BN_FWD_ARGS(p), 1, p->saved, ctx->scratch, y, ctx->stats);
}

int32_t tt_batchnorm_fwd_eval_s8(const tt_ctx *ctx, const tt_batchnorm_params *p,
                                 const int8_t *x, int32_t ex, int8_t *y)
{
    return bn_fwd(x, ex, TT_BN_FWD_ARGS(p), 0, p->saved, ctx->scratch, y, ctx->stats);
}

/** J = rshift_round(I, BN_F) of one position (see ops/batchnorm.py, Backward). */
static int64_t bn_j(int32_t ev, int64_t xh, int64_t A, int64_t se, int64_t g, int32_t train)
{
    const int64_t i = train ? (A * ev - se) * ((int64_t)1 << (2 * BN_F)) - xh * g
                            : A * ev * ((int64_t)1 << (2 * BN_F));
    return tt_rshift_round_s64(i, BN_F);
}

/* One channel on the fast path of bn_out32 (same contract: bn_fast32, no saturation):
 * *se = sum e, *G = sum e * x_hat (exact int64) over i = 0, C, .., n - C, and w[2i] = x_hat(x[i])
 * when store (a constant after inlining): an int32 in element i's int64 scratch slot (the
 * backward's layout for channels whose x_hat fits int32; BN_W). */
static inline int64_t bn_xhat_sums(const int8_t *e, const int8_t *x, int32_t n, int32_t C,
                                   const bn_chan *k, int32_t *w, int32_t *se, int32_t store)
{
    const int32_t A = k->A, B = k->B, inv = k->inv, sh = k->sh;
    int32_t i, ss = 0;
    int64_t gs = 0;
    uint32_t az, bz;
    if (bn_mulr_consts(k, &az, &bz)) {
        for (i = 0; i < n; i += C) {
            const int32_t xh = bn_mulhr((int32_t)((uint32_t)(int32_t)x[i] * az - bz), inv), ev = e[i];
            if (store) w[2 * i] = xh;
            ss += ev;
            gs += (int64_t)ev * xh;
        }
    } else {
        const int32_t hh = (int32_t)1 << (sh - 33), sr = sh - 32;
        for (i = 0; i < n; i += C) {
            const int32_t h = (int32_t)((uint64_t)((int64_t)(A * x[i] - B) * inv) >> 32);
            const int32_t xh = (h + hh) >> sr, ev = e[i];
            if (store) w[2 * i] = xh;
            ss += ev;
            gs += (int64_t)ev * xh;
        }
    }
    *se = ss;
    return gs;
}

/* Backward pass 1 of one channel (bn_xhat_sums, storing x_hat). */
static BN_NOINLINE int64_t bn_bwd_xhat(const int8_t *e, const int8_t *x, int32_t n, int32_t C,
                                       const bn_chan *k, int32_t *w, int32_t *se)
{
    return bn_xhat_sums(e, x, n, C, k, w, se, 1);
}

/* c + bn_mulhr(a, b) (mod 2^32): SMMLAR on DSP cores. */
static inline int32_t bn_mulhr_add(int32_t a, int32_t b, int32_t c)
{
#if TT_HAVE_DSP
    return tt_smmlar(a, b, c);
#else
    return (int32_t)((uint32_t)c + (uint32_t)bn_mulhr(a, b));
#endif
}

/* Backward pass 1 of one channel on bn_mulr_consts' path (az, nbz = -bz mod 2^32) with both sums
 * in one multiply-accumulate: w[2i] = x_hat + 2^30 (SMMLAR from 2^30; |x_hat| < 2^30 there), and
 * the return value T = sum e * (x_hat + 2^30) = G + 2^30 Se, exact in int64; the caller splits it
 * (its bound |G| < 2^29). Two positions a turn. */
BN_ALWAYS_INLINE int64_t bn_bwd_xhat_off(const int8_t *e, const int8_t *x, int32_t n, int32_t C, uint32_t az,
                                           uint32_t nbz, int32_t inv, int32_t *w)
{
    const int32_t off = (int32_t)1 << 30, C2 = 2 * C;
    int64_t T = 0;
    int32_t i = 0;
#if TT_HAVE_DSP && defined(__ARM_FEATURE_DSP) && __ARM_FEATURE_DSP && defined(__GNUC__) && defined(__OPTIMIZE__)
    /* The same loop, four positions a turn, with stepped pointers (GCC's index form spilled the
     * sum and the bases): 32 instructions per four positions; the rest in C below. Only in
     * optimized builds: at -O0 the frame pointer takes a register and GCC finds the asm's
     * thirteen operands impossible (an -O0 debug build of a user's firmware takes the C). */
    if (3 * C < n) {
        const int8_t *xp = x, *ep = e, *const xl = x + (n - 3 * C);
        int32_t *wp = w;
        uint32_t lo = 0, hi = 0, a, b;
        __asm__ volatile(
            "1:\n\t"
            "ldrsb %[a], [%[xp]]\n\t"
            "mla %[a], %[a], %[az], %[nbz]\n\t"
            "smmlar %[a], %[a], %[inv], %[off]\n\t"
            "ldrsb %[b], [%[ep]]\n\t"
            "str %[a], [%[wp]]\n\t"
            "smlal %[lo], %[hi], %[a], %[b]\n\t"
            "ldrsb %[a], [%[xp], %[C]]\n\t"
            "mla %[a], %[a], %[az], %[nbz]\n\t"
            "smmlar %[a], %[a], %[inv], %[off]\n\t"
            "ldrsb %[b], [%[ep], %[C]]\n\t"
            "str %[a], [%[wp], %[C], lsl #3]\n\t"
            "smlal %[lo], %[hi], %[a], %[b]\n\t"
            "add %[xp], %[xp], %[C], lsl #1\n\t"
            "add %[ep], %[ep], %[C], lsl #1\n\t"
            "add %[wp], %[wp], %[C], lsl #4\n\t"
            "ldrsb %[a], [%[xp]]\n\t"
            "mla %[a], %[a], %[az], %[nbz]\n\t"
            "smmlar %[a], %[a], %[inv], %[off]\n\t"
            "ldrsb %[b], [%[ep]]\n\t"
            "str %[a], [%[wp]]\n\t"
            "smlal %[lo], %[hi], %[a], %[b]\n\t"
            "ldrsb %[a], [%[xp], %[C]]\n\t"
            "mla %[a], %[a], %[az], %[nbz]\n\t"
            "smmlar %[a], %[a], %[inv], %[off]\n\t"
            "ldrsb %[b], [%[ep], %[C]]\n\t"
            "str %[a], [%[wp], %[C], lsl #3]\n\t"
            "smlal %[lo], %[hi], %[a], %[b]\n\t"
            "add %[xp], %[xp], %[C], lsl #1\n\t"
            "add %[ep], %[ep], %[C], lsl #1\n\t"
            "add %[wp], %[wp], %[C], lsl #4\n\t"
            "cmp %[xp], %[xl]\n\t"
            "blo 1b"
            : [a] "=&r"(a), [b] "=&r"(b), [xp] "+r"(xp), [ep] "+r"(ep), [wp] "+r"(wp), [lo] "+r"(lo), [hi] "+r"(hi)
            : [C] "r"(C), [xl] "r"(xl), [az] "r"(az), [nbz] "r"(nbz), [inv] "r"(inv), [off] "r"(off)
            : "cc", "memory");
        T = (int64_t)(((uint64_t)hi << 32) | lo);
        i = (int32_t)(xp - x);
    }
#endif
    for (; i + C < n; i += C2) {
        const int32_t h0 = bn_mulhr_add((int32_t)((uint32_t)(int32_t)x[i] * az + nbz), inv, off);
        const int32_t h1 = bn_mulhr_add((int32_t)((uint32_t)(int32_t)x[i + C] * az + nbz), inv, off);
        w[2 * i] = h0;
        w[2 * (i + C)] = h1;
        T += (int64_t)e[i] * h0;
        T += (int64_t)e[i + C] * h1;
    }
    if (i < n) {
        const int32_t h0 = bn_mulhr_add((int32_t)((uint32_t)(int32_t)x[i] * az + nbz), inv, off);
        w[2 * i] = h0;
        T += (int64_t)e[i] * h0;
    }
    return T;
}

/* The gradient sums of one channel (bn_xhat_sums, nothing stored). */
static BN_NOINLINE int64_t bn_grad_sums(const int8_t *e, const int8_t *x, int32_t n, int32_t C,
                                        const bn_chan *k, int32_t *se)
{
    return bn_xhat_sums(e, x, n, C, k, 0, se, 0);
}

/* Whether channel k's x_hat fits int32 for every int8 x (x_hat is monotone in x: the two ends
 * decide) and takes the fast path of bn_out32. */
static int32_t bn_chan_fast(const bn_chan *k, const int32_t *saved, int32_t C, int32_t c)
{
    uint32_t sat = 0;
    if (!bn_fast32(k)) return 0;
    (void)bn_xhat_k(k, -128, saved, C, c, &sat);
    (void)bn_xhat_k(k, 127, saved, C, c, &sat);
    return sat == 0;
}

/* Backward pass 2 of one channel when every J fits int32 (the caller's bound): w[2i] = J =
 * (A*e - Se) * 2^F + rshift_round(-x_hat * G, F) (= rshift_round(I, F), as (A*e - Se) * 2^(2F) is
 * a multiple of 2^F), from x_hat + off in w[2i]; returns max |J|. The multiple -Se * 2^(2F) joins
 * the rounding constant inside the floor (exact), so J = A*e * 2^F + floor((x_hat * -G + c) / 2^F),
 * c = 2^(F-1) - Se * 2^(2F): one multiply-accumulate from c, the words of the sum shifted (bits
 * F..F+31: the value mod 2^32, and J fits int32, so the wrapping int32 sum is exact). */
static BN_NOINLINE uint32_t bn_bwd_j32(const int8_t *e, int32_t n, int32_t C, int32_t A,
                                       int32_t se, int32_t nG, int32_t off, int32_t *w)
{
    const int64_t c0 = ((int64_t)1 << (BN_F - 1)) - (int64_t)se * ((int64_t)1 << (2 * BN_F));
    const uint32_t af = (uint32_t)A << BN_F; /* A <= 4096: < 2^25 */
    uint32_t mx = 0;
    int32_t i;
    for (i = 0; i < n; i += C) {
        const uint64_t w64 = (uint64_t)((int64_t)(int32_t)((uint32_t)w[2 * i] - (uint32_t)off) * nG + c0);
        const uint32_t q = ((uint32_t)w64 >> BN_F) | ((uint32_t)(w64 >> 32) << (32 - BN_F));
        const int32_t J = (int32_t)((uint32_t)(int32_t)e[i] * af + q);
        const uint32_t sg = (uint32_t)(J >> 31), a = ((uint32_t)J ^ sg) - sg; /* |J|: EOR, SUB */
        w[2 * i] = J;
        if (a > mx) mx = a;
    }
    return mx;
}

/* bn_bwd_j32 by one rounded high-word multiply-accumulate per element: with |x_hat| * 2^k and
 * |G| * 2^(20 - k) below 2^31 (the caller picks k), SMMULR(x_hat 2^k, -G 2^(20-k)) =
 * floor((-x_hat G 2^20 + 2^31) / 2^32) = floor((-x_hat G + 2^(F-1)) / 2^F) exactly (F = 12), so
 * J = SMMLAR(x_hat 2^k, -G 2^(20-k), A e 2^F - Se 2^F) (mod 2^32, exact as J fits int32;
 * |Se| 2^F < 2^31). w[2i] holds x_hat + off with off * 2^k = 0 mod 2^32 (off = 0, or 2^30 and
 * k >= 2), so its shift is x_hat 2^k. Returns the largest J ^ (J >> 31) (= |J|, or |J| - 1 for
 * J < 0: max |J| is it or one more, which the caller settles: one instruction per element
 * instead of three), two positions a turn. */
BN_ALWAYS_INLINE uint32_t bn_bwd_j32_mlar_body(const int8_t *e, int32_t n, int32_t C, int32_t A, uint32_t base,
                                            int32_t nGk, int32_t k, int32_t *w)
{
    const uint32_t af = (uint32_t)A << BN_F; /* base = -Se 2^F, formed by the caller: one MLA */
    const int32_t C2 = 2 * C;
    uint32_t mx = 0;
    int32_t i = 0;
#if TT_HAVE_DSP && defined(__ARM_FEATURE_DSP) && __ARM_FEATURE_DSP && defined(__GNUC__) && defined(__OPTIMIZE__)
    /* The same loop, four positions a turn, with stepped pointers and no spills: 46 instructions
     * per four positions; the rest in C below. */
    if (3 * C < n) {
        const int8_t *ep = e, *const el = e + (n - 3 * C);
        int32_t *wp = w;
        uint32_t a, b;
        __asm__ volatile(
            "1:\n\t"
            "ldrsb %[a], [%[ep]]\n\t"
            "ldr %[b], [%[wp]]\n\t"
            "mla %[a], %[a], %[af], %[base]\n\t"
            "lsl %[b], %[b], %[k]\n\t"
            "smmlar %[a], %[b], %[g], %[a]\n\t"
            "str %[a], [%[wp]]\n\t"
            "eor %[a], %[a], %[a], asr #31\n\t"
            "cmp %[a], %[mx]\n\t"
            "it hi\n\t"
            "movhi %[mx], %[a]\n\t"
            "ldrsb %[a], [%[ep], %[C]]\n\t"
            "ldr %[b], [%[wp], %[C], lsl #3]\n\t"
            "mla %[a], %[a], %[af], %[base]\n\t"
            "lsl %[b], %[b], %[k]\n\t"
            "smmlar %[a], %[b], %[g], %[a]\n\t"
            "str %[a], [%[wp], %[C], lsl #3]\n\t"
            "eor %[a], %[a], %[a], asr #31\n\t"
            "cmp %[a], %[mx]\n\t"
            "it hi\n\t"
            "movhi %[mx], %[a]\n\t"
            "add %[ep], %[ep], %[C], lsl #1\n\t"
            "add %[wp], %[wp], %[C], lsl #4\n\t"
            "ldrsb %[a], [%[ep]]\n\t"
            "ldr %[b], [%[wp]]\n\t"
            "mla %[a], %[a], %[af], %[base]\n\t"
            "lsl %[b], %[b], %[k]\n\t"
            "smmlar %[a], %[b], %[g], %[a]\n\t"
            "str %[a], [%[wp]]\n\t"
            "eor %[a], %[a], %[a], asr #31\n\t"
            "cmp %[a], %[mx]\n\t"
            "it hi\n\t"
            "movhi %[mx], %[a]\n\t"
            "ldrsb %[a], [%[ep], %[C]]\n\t"
            "ldr %[b], [%[wp], %[C], lsl #3]\n\t"
            "mla %[a], %[a], %[af], %[base]\n\t"
            "lsl %[b], %[b], %[k]\n\t"
            "smmlar %[a], %[b], %[g], %[a]\n\t"
            "str %[a], [%[wp], %[C], lsl #3]\n\t"
            "eor %[a], %[a], %[a], asr #31\n\t"
            "cmp %[a], %[mx]\n\t"
            "it hi\n\t"
            "movhi %[mx], %[a]\n\t"
            "add %[ep], %[ep], %[C], lsl #1\n\t"
            "add %[wp], %[wp], %[C], lsl #4\n\t"
            "cmp %[ep], %[el]\n\t"
            "blo 1b"
            : [a] "=&r"(a), [b] "=&r"(b), [ep] "+r"(ep), [wp] "+r"(wp), [mx] "+r"(mx)
            : [C] "r"(C), [el] "r"(el), [af] "r"(af), [base] "r"(base), [g] "r"(nGk), [k] "r"(k)
            : "cc", "memory");
        i = (int32_t)(ep - e);
    }
#endif
    for (; i + C < n; i += C2) {
        const int32_t t0 = (int32_t)((uint32_t)(int32_t)e[i] * af + base);
        const int32_t t1 = (int32_t)((uint32_t)(int32_t)e[i + C] * af + base);
        const int32_t J0 = bn_mulhr_add((int32_t)((uint32_t)w[2 * i] << k), nGk, t0);
        const int32_t J1 = bn_mulhr_add((int32_t)((uint32_t)w[2 * (i + C)] << k), nGk, t1);
        const uint32_t a0 = (uint32_t)(J0 ^ (J0 >> 31)), a1 = (uint32_t)(J1 ^ (J1 >> 31));
        w[2 * i] = J0;
        w[2 * (i + C)] = J1;
        if (a0 > mx) mx = a0;
        if (a1 > mx) mx = a1;
    }
    if (i < n) {
        const int32_t t0 = (int32_t)((uint32_t)(int32_t)e[i] * af + base);
        const int32_t J0 = bn_mulhr_add((int32_t)((uint32_t)w[2 * i] << k), nGk, t0);
        const uint32_t a0 = (uint32_t)(J0 ^ (J0 >> 31));
        w[2 * i] = J0;
        if (a0 > mx) mx = a0;
    }
    return mx;
}

static BN_NOINLINE uint32_t bn_bwd_j32_mlar(const int8_t *e, int32_t n, int32_t C, int32_t A, uint32_t base,
                                            int32_t nGk, int32_t k, int32_t *w)
{
    return bn_bwd_j32_mlar_body(e, n, C, A, base, nGk, k, w);
}

/* Backward passes 1 and 2 of one channel on bn_mulr_consts' path with max |x_hat| = x32 <= xlim
 * (P x32 < 2^22) in one call: bn_bwd_xhat_off's T = G + 2^30 Se split (|G| < 2^29) into sv[0] =
 * Se and sv[C] = G (the saved rows of tt_batchnorm_grad_saved_s32), then, when J fits int32 and
 * k = 31 - bitwidth(x32) (or 20) leaves |G| 2^(20-k) below 2^31, bn_bwd_j32_mlar's J and its
 * maximum a (returned; a < 2^31). Returns UINT32_MAX after pass 1 when those bounds fail or two is
 * 0 (w then holds x_hat + 2^30). */
static BN_NOINLINE uint32_t bn_bwd_p12(const int8_t *e, const int8_t *x, int32_t n, int32_t C, int32_t A,
                                       uint32_t az, uint32_t nbz, int32_t inv, uint32_t x32, int32_t *w,
                                       int32_t *sv, int32_t two)
{
    const int64_t T = bn_bwd_xhat_off(e, x, n, C, az, nbz, inv, w);
    const int32_t se = (int32_t)((T + ((int64_t)1 << 29)) >> 30);
    const int32_t G = (int32_t)((uint32_t)T - ((uint32_t)se << 30)); /* |G| < 2^29: its low word */
    const uint32_t aG = G < 0 ? 0u - (uint32_t)G : (uint32_t)G, ase = se < 0 ? 0u - (uint32_t)se : (uint32_t)se;
    const int32_t bx = tt_bitwidth_u64(x32), kk = bx >= 11 ? 31 - bx : 20;
    sv[0] = se;
    sv[C] = G;
    /* bn_bwd_train's general tests in 32 bits (x32 < 2^22, |G| < 2^29) */
    if (!two || ((uint64_t)((uint32_t)(128 * A) + ase) << BN_F) + (((uint64_t)x32 * aG) >> BN_F) + 2 > (uint64_t)INT32_MAX ||
        tt_bitwidth_u64(aG) + 20 - kk > 31)
        return UINT32_MAX;
    return bn_bwd_j32_mlar_body(e, n, C, A, 0u - ((uint32_t)se << BN_F), (int32_t)((uint32_t)-G << (20 - kk)), kk, w);
}

/* Whether some J = -(a + 1) among w[2i] (i = 0, C, .., n - C): then max |J| is a + 1, not a
 * (bn_bwd_j32_mlar's maximum a). */
static BN_NOINLINE int32_t bn_has_neg(const int32_t *w, int32_t n, int32_t C, uint32_t a)
{
    const int32_t t = (int32_t)(0u - a - 1u);
    int32_t i;
    for (i = 0; i < n; i += C)
        if (w[2 * i] == t) return 1;
    return 0;
}

/* Backward pass 3 of one channel when every J fits int32: dx[i] = sat_s8(rshift_round(km * J, s))
 * for s >= 1 and |km * J| <= m with s = bitwidth(m) - 7, so t = floor(km * J / 2^(s-1)) fits
 * int32 (|t| <= 2^8) and is taken from the words of the product; r = (t + 1) >> 1. */
static BN_NOINLINE void bn_bwd_out32(const int32_t *w, int32_t n, int32_t C, int32_t km,
                                     int32_t s, int8_t *dx, uint32_t *nsat)
{
    const int32_t s1 = s - 1;
    uint32_t cnt = 0;
    int32_t i;
#define BN_OUT(T)                                                                            \
    for (i = 0; i < n; i += C) {                                                             \
        const int64_t v = (int64_t)km * w[2 * i];                                            \
        const uint32_t lo = (uint32_t)v, hi = (uint32_t)((uint64_t)v >> 32);                 \
        const int32_t r = ((T) + 1) >> 1;                                                    \
        (void)lo; (void)hi;                                                                  \
        dx[i] = (int8_t)r;                                                                   \
        if ((uint32_t)(r + TT_S8_MAX) > 2u * TT_S8_MAX) { cnt++; dx[i] = r > 0 ? TT_S8_MAX : -TT_S8_MAX; } \
    }
    if (s1 >= 32) {
        const int32_t sr = s1 - 32;
        BN_OUT((int32_t)hi >> sr)
    } else if (s1 == 0) {
        BN_OUT((int32_t)lo)
    } else {
        const int32_t sl = 32 - s1;
        BN_OUT((int32_t)((lo >> s1) | (hi << sl)))
    }
#undef BN_OUT
    *nsat += cnt;
}

/* floor(a * b / 2^32) + c (mod 2^32): SMMLA on DSP cores. */
static inline int32_t bn_mulhi_add(int32_t a, int32_t b, int32_t c)
{
#if TT_HAVE_DSP && defined(__ARM_FEATURE_DSP) && __ARM_FEATURE_DSP
    int32_t r;
    __asm__("smmla %0, %1, %2, %3" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
#else
    return (int32_t)((uint32_t)(int32_t)(((int64_t)a * b) >> 32) + (uint32_t)c);
#endif
}

/* bn_bwd_out32 for s >= 33 when no dx of the channel saturates (the caller's check: with M the
 * channel's max |km * J|, every |round(km * J / 2^s)| <= round(M / 2^s) <= 127): with v = km * J
 * = hi 2^32 + lo, v + 2^(s-1) = (hi + 2^(s-33)) 2^32 + lo and lo cannot carry into floor(. / 2^s),
 * so dx = (hi + 2^(s-33)) >> (s - 32): one SMMLA and a shift (|hi| < 2^(s-25): no overflow). */
static BN_NOINLINE void bn_bwd_out32_nosat(const int32_t *w, int32_t n, int32_t C, int32_t km, int32_t s,
                                           int8_t *dx)
{
    const int32_t h = (int32_t)1 << (s - 33), sr = s - 32, C2 = 2 * C;
    int32_t i = 0;
#if TT_HAVE_DSP && defined(__ARM_FEATURE_DSP) && __ARM_FEATURE_DSP && defined(__GNUC__) && defined(__OPTIMIZE__)
    /* four positions a turn (20 instructions), stepped pointers */
    if (3 * C < n) {
        const int32_t *wp = w, *const wl = w + 2 * (n - 3 * C);
        int8_t *dp = dx;
        const int32_t C3 = 3 * C;
        uint32_t a, b, c, d;
        __asm__ volatile(
            "1:\n\t"
            "ldr %[a], [%[wp]]\n\t"
            "ldr %[b], [%[wp], %[C], lsl #3]\n\t"
            "ldr %[c], [%[wp], %[C2], lsl #3]\n\t"
            "ldr %[d], [%[wp], %[C3], lsl #3]\n\t"
            "smmla %[a], %[km], %[a], %[h]\n\t"
            "smmla %[b], %[km], %[b], %[h]\n\t"
            "smmla %[c], %[km], %[c], %[h]\n\t"
            "smmla %[d], %[km], %[d], %[h]\n\t"
            "asr %[a], %[a], %[sr]\n\t"
            "asr %[b], %[b], %[sr]\n\t"
            "asr %[c], %[c], %[sr]\n\t"
            "asr %[d], %[d], %[sr]\n\t"
            "strb %[a], [%[dp]]\n\t"
            "strb %[b], [%[dp], %[C]]\n\t"
            "strb %[c], [%[dp], %[C2]]\n\t"
            "strb %[d], [%[dp], %[C3]]\n\t"
            "add %[wp], %[wp], %[C], lsl #5\n\t"
            "add %[dp], %[dp], %[C], lsl #2\n\t"
            "cmp %[wp], %[wl]\n\t"
            "blo 1b"
            : [a] "=&r"(a), [b] "=&r"(b), [c] "=&r"(c), [d] "=&r"(d), [wp] "+r"(wp), [dp] "+r"(dp)
            : [C] "r"(C), [C2] "r"(C2), [C3] "r"(C3), [wl] "r"(wl), [km] "r"(km), [h] "r"(h), [sr] "r"(sr)
            : "cc", "memory");
        i = (int32_t)(dp - dx);
    }
#endif
    for (; i + C < n; i += C2) { /* two positions a turn */
        const int32_t r0 = bn_mulhi_add(km, w[2 * i], h), r1 = bn_mulhi_add(km, w[2 * (i + C)], h);
        dx[i] = (int8_t)(r0 >> sr);
        dx[i + C] = (int8_t)(r1 >> sr);
    }
    if (i < n) dx[i] = (int8_t)(bn_mulhi_add(km, w[2 * i], h) >> sr);
}

/* E_k of the backward (ops/batchnorm.py): the largest bitwidth(gamma * inv) - sh over channels
 * with gamma * inv != 0, minus KM_BITS; and channel c's km = round(gamma * inv * 2^-(sh + E_k)). */
static int32_t bn_e_k(const int16_t *gamma, const int32_t *saved, int32_t C)
{
    int32_t c, top = 0, have = 0;
    for (c = 0; c < C; c++) {
        const int64_t k = (int64_t)gamma[c] * saved[C + c];
        if (k != 0) {
            const int32_t t = tt_bitwidth_u64(tt_abs_u64(k)) - saved[2 * C + c];
            if (!have || t > top) top = t;
            have = 1;
        }
    }
    return have ? top - TT_BN_KM_BITS : 0;
}

static inline int64_t bn_km(const int16_t *gamma, const int32_t *saved, int32_t C, int32_t c, int32_t e_k)
{
    const int64_t k = (int64_t)gamma[c] * saved[C + c];
    const int32_t sk = saved[2 * C + c] + e_k;
    if (sk >= 1 && sk <= 31) {
        /* |km| <= 2^24 (E_k's definition): the low word of floor((k + 2^(sk-1)) / 2^sk), |k| < 2^46 */
        const uint64_t v = (uint64_t)(k + ((int64_t)1 << (sk - 1)));
        return (int32_t)(((uint32_t)v >> sk) | ((uint32_t)(v >> 32) << (32 - sk)));
    }
    return sk >= 0 ? tt_rshift_round_s64(k, sk < 62 ? sk : 62) : k * ((int64_t)1 << -sk);
}

/* The train backward, channel by channel, with x_hat, then J, kept per element in the scratch
 * (P*C int64 slots: TT_BATCHNORM_BUFFER_SIZE). Pass 1: x_hat, Se, G; pass 2: J and max |J| per
 * channel, so max |km * J| = |km| * max |J| per channel; pass 3: dx. A channel takes the int32
 * paths when x_hat cannot saturate there (x_hat at x = -128 and 127 fits int32: x_hat is
 * monotone in x), and J's when J is bounded below 2^31 (|A*e - Se| <= 128 A + |Se|, |x_hat| <=
 * the larger endpoint); else the int64 formulas of bn_bwd_eval, element by element. A channel
 * whose x_hat fits int32 keeps it (plus off), then its J when J fits int32, as an int32 in the
 * first word of each element's slot (w[2i], w the scratch as int32: one store, no sign word);
 * an int64 J, and everything of the other channels, takes the whole slot. */
#define BN_FITS 1
#define BN_AMB 2
#define BN_DONE 4

/* Pass 3 of every channel c < 64 whose J fit int32 (fl[c] & BN_FITS) and whose bound of max
 * |km * J| (|km| mjc[c], plus |km| where that maximum may be one more: BN_AMB) is below
 * nosat_lim = 255 2^(s-1), s >= 33: bn_bwd_out32_nosat for each, from a loop of its own (no
 * per-channel state of bn_bwd_train's loop). Marks them fl[c] = BN_DONE; returns their count. */
static BN_NOINLINE int32_t bn_bwd_out_nosat_all(const int32_t *w, int32_t n, int32_t C, const int32_t *kmc,
                                                const uint32_t *mjc, uint8_t *fl, int32_t s, uint64_t nosat_lim,
                                                int8_t *dx)
{
    const int32_t cn = C < 64 ? C : 64;
    int32_t c, done = 0;
    for (c = 0; c < cn; c++) {
        const uint32_t f = fl[c];
        if (f & BN_FITS) {
            const int32_t km = kmc[c];
            const uint32_t akm = km < 0 ? 0u - (uint32_t)km : (uint32_t)km;
            const uint64_t mcj = (uint64_t)akm * mjc[c] + ((f & BN_AMB) ? akm : 0u);
            if (mcj < nosat_lim) {
                bn_bwd_out32_nosat(w + 2 * c, n, C, km, s, dx + c);
                fl[c] = BN_DONE;
                done++;
            }
        }
    }
    return done;
}

static int32_t bn_bwd_train(const tt_ctx *ctx, const tt_batchnorm_params *bp, const int8_t *e,
                            int32_t ee, const int8_t *x, int8_t *dx)
{
    const int32_t P = bp->P, C = bp->C, n = P * C, e_g = bp->e_g, ex = bp->saved[3 * bp->C];
    const int32_t *saved = bp->saved;
    const int16_t *gamma = bp->gamma;
    int64_t *xs = ctx->scratch;
    int32_t *w = (int32_t *)ctx->scratch;
    tt_stats *st = ctx->stats;
    const int32_t A = P, e_k = bn_e_k(gamma, saved, C);
    /* m0: max |km * J| over the channels whose max |J| is known; m1, m2: over the others (BN_AMB),
     * from mjc[c] and from mjc[c] + 1 */
    uint64_t m0 = 0, m1 = 0, m2 = 0, m, nosat_lim;
    /* km and max |J| of channel c < 64 (|km| <= 2^24; max |J| < 2^31 where J fits int32, the
     * only channels that read it): 32-bit words, as a 64-bit array would be copied through VFP
     * registers in hard-float builds, which must stay VFP-free */
    int32_t kmc[64];
    uint32_t mjc[64];
    /* channel c < 64: BN_FITS when its J are int32 (in w), BN_AMB when its max |J| is mjc[c] or
     * mjc[c] + 1 (bn_bwd_j32_mlar); bytes, not bits of a 64-bit mask (variable 64-bit shifts) */
    uint8_t fl[64];
    int32_t c, p, s;
    const uint32_t xlim = (((uint32_t)1 << 22) - 1u) / (uint32_t)P; /* P * xmax < 2^22 iff xmax <= xlim */
    for (c = 0; c < C; c++) {
        const bn_chan k = bn_channel(A, saved, C, c);
        const int64_t km = bn_km(gamma, saved, C, c, e_k);
        const uint32_t akm = (uint32_t)tt_abs_u64(km); /* <= 2^24 */
        uint32_t az = 0, bz = 0;
        uint64_t xmax;
        int32_t se = 0, off = 0, fast, pass1 = 0;
        int64_t G = 0;
        uint64_t mj = 0;
        if (bn_mulr_consts(&k, &az, &bz)) {
            /* x_hat = bn_mulhr(x az - bz, inv), |x_hat| < 2^30: the ends in 32 bits */
            const int32_t lo = bn_mulhr((int32_t)(0u - 128u * az - bz), k.inv);
            const int32_t hi = bn_mulhr((int32_t)(127u * az - bz), k.inv);
            const uint32_t alo = lo < 0 ? 0u - (uint32_t)lo : (uint32_t)lo, ahi = hi < 0 ? 0u - (uint32_t)hi : (uint32_t)hi;
            xmax = alo > ahi ? alo : ahi;
            fast = 1;
            if (xmax <= xlim) {
                /* |G| <= 128 P max |x_hat| < 2^29: passes 1 and 2 in one call where J fits int32 */
                int32_t *const sv = bp->saved + 3 * C + 1 + c;
                const uint32_t a = bn_bwd_p12(e + c, x + c, n, C, A, az, 0u - bz, k.inv, (uint32_t)xmax, w + 2 * c, sv,
                                              c < 64);
                if (a != UINT32_MAX) {
                    const uint64_t a1 = (uint64_t)akm * a, a2 = a1 + akm;
                    fl[c] = BN_FITS | BN_AMB;
                    if (a1 > m1) m1 = a1;
                    if (a2 > m2) m2 = a2;
                    kmc[c] = (int32_t)km;
                    mjc[c] = a;
                    continue;
                }
                se = sv[0];
                G = sv[C];
                off = (int32_t)1 << 30;
                pass1 = 1;
            }
        } else {
            const bn_chan k2 = k; /* addresses taken of copies only: k stays in registers */
            uint32_t sat = 0;
            const int32_t lo = bn_xhat_k(&k2, -128, saved, C, c, &sat), hi = bn_xhat_k(&k2, 127, saved, C, c, &sat);
            xmax = tt_abs_u64(lo) > tt_abs_u64(hi) ? tt_abs_u64(lo) : tt_abs_u64(hi);
            fast = !sat && bn_fast32(&k2);
        }
        if (fast && !pass1) {
            const bn_chan k2 = k;
            G = bn_bwd_xhat(e + c, x + c, n, C, &k2, w + 2 * c, &se);
        } else if (!fast) {
            const bn_chan k2 = k;
            for (p = 0; p < P; p++) {
                const int32_t i = p * C + c, xh = bn_xhat_k(&k2, x[i], saved, C, c, 0);
                xs[i] = xh;
                se += e[i];
                G += (int64_t)e[i] * xh;
            }
        }
        /* |J| <= (128 A + |Se|) 2^F + (xmax |G| + 2^(F-1)) / 2^F + 1 */
        if (c < 64) fl[c] = 0;
        if (fast && c < 64 && tt_abs_u64(G) <= (uint64_t)INT32_MAX && xmax < ((uint64_t)1 << 32) &&
            ((uint64_t)(128 * (int64_t)A + (se < 0 ? -se : se)) << BN_F) +
            (((uint64_t)(uint32_t)xmax * (uint32_t)tt_abs_u64(G)) >> BN_F) + 2 <= (uint64_t)INT32_MAX) {
            /* k: x_hat 2^k and G 2^(20-k) both below 2^31 (xmax >= |x_hat|), and off 2^k = 0
             * mod 2^32 */
            const int32_t bx = tt_bitwidth_u64(xmax), kk = bx >= 11 ? 31 - bx : 20;
            if (bx <= 31 && tt_bitwidth_u64(tt_abs_u64(G)) + 20 - kk <= 31 && (off == 0 || kk >= 2)) {
                mj = bn_bwd_j32_mlar(e + c, n, C, A, 0u - ((uint32_t)se << BN_F),
                                     (int32_t)((uint32_t)(int32_t)-G << (20 - kk)), kk, w + 2 * c);
                fl[c] = BN_AMB;
            } else {
                mj = bn_bwd_j32(e + c, n, C, A, se, (int32_t)-G, off, w + 2 * c);
            }
            fl[c] |= BN_FITS;
        } else if (fast) {
            for (p = 0; p < P; p++) { /* x_hat (int32, read bytewise: the slot turns int64) */
                const int32_t i = p * C + c;
                int32_t xh;
                memcpy(&xh, w + 2 * i, sizeof xh);
                xs[i] = bn_j(e[i], (int32_t)((uint32_t)xh - (uint32_t)off), A, se, G, 1);
                if (tt_abs_u64(xs[i]) > mj) mj = tt_abs_u64(xs[i]);
            }
        } else {
            for (p = 0; p < P; p++) {
                const int32_t i = p * C + c;
                const int64_t J = bn_j(e[i], xs[i], A, se, G, 1);
                const uint64_t a = tt_abs_u64(J);
                xs[i] = J;
                if (a > mj) mj = a;
            }
        }
        /* pass 1's sums are the gradients (tt_batchnorm_grad_s32's, bit for bit): kept for
         * tt_batchnorm_grad_saved_s32 */
        bp->saved[3 * C + 1 + c] = se;
        bp->saved[4 * C + 1 + c] = tt_sat_s32(G);
        /* |km| <= 2^24, |J| <= 2^38 */
        if (c < 64 && (fl[c] & BN_AMB)) { /* mj < 2^31: 32x32 -> 64 products */
            const uint64_t a1 = (uint64_t)akm * (uint32_t)mj, a2 = a1 + akm;
            if (a1 > m1) m1 = a1;
            if (a2 > m2) m2 = a2;
        } else if (akm * mj > m0) {
            m0 = akm * mj;
        }
        if (c < 64) { kmc[c] = (int32_t)km; mjc[c] = (uint32_t)mj; }
    }
    m = m0 > m2 ? m0 : m2;
    if (tt_bitwidth_u64(m0 > m1 ? m0 : m1) != tt_bitwidth_u64(m)) {
        /* the shift depends on which: settle the amb channels' max |J| */
        m = m0;
        for (c = 0; c < C && c < 64; c++) {
            if (fl[c] & BN_AMB) {
                if (bn_has_neg(w + 2 * c, n, C, mjc[c])) mjc[c]++;
                fl[c] &= (uint8_t)~BN_AMB;
                if ((uint64_t)(kmc[c] < 0 ? -(int64_t)kmc[c] : kmc[c]) * mjc[c] > m)
                    m = (uint64_t)(kmc[c] < 0 ? -(int64_t)kmc[c] : kmc[c]) * mjc[c];
            }
        }
    }
    s = tt_requant_shift(m, 8);
    nosat_lim = s >= 33 ? (uint64_t)255 << (s - 1) : 0;
    if (s >= 33 && bn_bwd_out_nosat_all(w, n, C, kmc, mjc, fl, s, nosat_lim, dx) == C)
        return e_k + e_g + ee - ex - 2 * BN_F + s;
    for (c = 0; c < C; c++) {
        const int64_t km = c < 64 ? kmc[c] : bn_km(gamma, saved, C, c, e_k);
        if (c < 64 && fl[c] == BN_DONE) continue; /* written by bn_bwd_out_nosat_all */
        if (c < 64 && (fl[c] & BN_FITS)) {
            /* an upper bound of the channel's max |km * J| (fits: mj < 2^31); rshift_round(mcj, s)
             * <= 127 iff mcj < 255 * 2^(s-1) */
            const uint64_t mcj = (uint64_t)(uint32_t)tt_abs_u64(km) * mjc[c] + ((fl[c] & BN_AMB) ? (uint32_t)tt_abs_u64(km) : 0u);
            if (s >= 33 && mcj < nosat_lim)
                bn_bwd_out32_nosat(w + 2 * c, n, C, (int32_t)km, s, dx + c);
            else if (s >= 1)
                bn_bwd_out32(w + 2 * c, n, C, (int32_t)km, s, dx + c, &st->saturated);
            else
                for (p = 0; p < P; p++) { /* s = 0: |km * J| <= m < 2^7 */
                    const int32_t i = p * C + c;
                    dx[i] = (int8_t)(km * w[2 * i]);
                }
            continue;
        }
        for (p = 0; p < P; p++) {
            const int32_t i = p * C + c;
            const int64_t r = tt_rshift_round_s64(km * xs[i], s);
            if (r > TT_S8_MAX || r < -TT_S8_MAX) st->saturated++;
            dx[i] = tt_sat_s8(r);
        }
    }
    return e_k + e_g + ee - ex - 2 * BN_F + s;
}

static int32_t bn_bwd(const tt_ctx *ctx, const tt_batchnorm_params *bp, const int8_t *e,
                      int32_t ee, const int8_t *x, int32_t train, int8_t *dx)
{
    const int32_t P = bp->P, C = bp->C, e_g = bp->e_g, ex = bp->saved[3 * bp->C];
    const int32_t *saved = bp->saved;
    const int16_t *gamma = bp->gamma;
    int64_t *scratch = ctx->scratch;
    tt_stats *st = ctx->stats;
    int64_t *se = scratch, *g = scratch + C, *km = scratch + 2 * C;
    const int64_t A = train ? P : 1 << TT_BN_EVAL_FRAC;
    uint64_t m = 0;
    int32_t p, c, s, top = 0, have = 0, e_k;
    for (c = 0; c < C; c++) se[c] = g[c] = 0;
    if (train) {
        for (c = 0; c < C; c++) {
            const bn_chan k = bn_channel(A, saved, C, c);
            int64_t gs = 0;
            int32_t ss = 0; /* |sum e| <= 127 * P < 2^20 */
            for (p = 0; p < P; p++) {
                const int32_t ev = e[(int64_t)p * C + c];
                ss += ev;
                gs += (int64_t)ev * bn_xhat_k(&k, x[(int64_t)p * C + c], saved, C, c, 0);
            }
            se[c] = ss;
            g[c] = gs;
        }
    }
    for (c = 0; c < C; c++) {
        const int64_t k = (int64_t)gamma[c] * saved[C + c];
        if (k != 0) {
            const int32_t t = tt_bitwidth_u64(tt_abs_u64(k)) - saved[2 * C + c];
            if (!have || t > top) top = t;
            have = 1;
        }
    }
    e_k = have ? top - TT_BN_KM_BITS : 0;
    for (c = 0; c < C; c++) {
        const int64_t k = (int64_t)gamma[c] * saved[C + c];
        const int32_t sk = saved[2 * C + c] + e_k;
        km[c] = sk >= 0 ? tt_rshift_round_s64(k, sk < 62 ? sk : 62) : k * ((int64_t)1 << -sk);
    }
    /* Channel by channel, as the forward pass. */
    for (c = 0; c < C; c++) {
        const bn_chan k = bn_channel(A, saved, C, c);
        const int64_t kmc = km[c], sec = se[c], gc = g[c];
        for (p = 0; p < P; p++) {
            const int64_t i = (int64_t)p * C + c;
            const int64_t xh = train ? bn_xhat_k(&k, x[i], saved, C, c, 0) : 0;
            const uint64_t a = tt_abs_u64(kmc * bn_j(e[i], xh, A, sec, gc, train));
            if (a > m) m = a;
        }
    }
    s = tt_requant_shift(m, 8);
    for (c = 0; c < C; c++) {
        const bn_chan k = bn_channel(A, saved, C, c);
        const int64_t kmc = km[c], sec = se[c], gc = g[c];
        for (p = 0; p < P; p++) {
            const int64_t i = (int64_t)p * C + c;
            const int64_t xh = train ? bn_xhat_k(&k, x[i], saved, C, c, 0) : 0;
            const int64_t r = tt_rshift_round_s64(kmc * bn_j(e[i], xh, A, sec, gc, train), s);
            if (r > TT_S8_MAX || r < -TT_S8_MAX) st->saturated++;
            dx[i] = tt_sat_s8(r);
        }
    }
    return e_k + e_g + ee - ex - 2 * BN_F + s;
}

int32_t tt_batchnorm_bwd_s8(const tt_ctx *ctx, const tt_batchnorm_params *p, const int8_t *e,
                            int32_t ee, const int8_t *x, int8_t *dx)
{
    return bn_bwd_train(ctx, p, e, ee, x, dx);
}

void tt_batchnorm_grad_saved_s32(const tt_batchnorm_params *p, int32_t *ggamma, int32_t *gbeta)
{
    /* C and the rows in locals: the stores could alias *p, which the loop would reload */
    const int32_t C = p->C;
    const int32_t *const sb = p->saved + 3 * C + 1, *const sg = sb + C;
    int32_t c;
    for (c = 0; c < C; c++) {
        gbeta[c] = sb[c];
        ggamma[c] = sg[c];
    }
}

int32_t tt_batchnorm_bwd_eval_s8(const tt_ctx *ctx, const tt_batchnorm_params *p,
                                 const int8_t *e, int32_t ee, const int8_t *x, int8_t *dx)
{
    return bn_bwd(ctx, p, e, ee, x, 0, dx);
}

static void bn_grad(const tt_batchnorm_params *bp, const int8_t *e, const int8_t *x,
                    int32_t train, int32_t *ggamma, int32_t *gbeta)
{
    const int32_t P = bp->P, C = bp->C;
    const int32_t *saved = bp->saved;
    const int64_t A = train ? P : 1 << TT_BN_EVAL_FRAC;
    int32_t p, c;
    for (c = 0; c < C; c++) {
        const bn_chan k = bn_channel(A, saved, C, c);
        int64_t se = 0, g = 0;
        if (bn_chan_fast(&k, saved, C, c)) {
            int32_t se32;
            g = bn_grad_sums(e + c, x + c, P * C, C, &k, &se32);
            ggamma[c] = tt_sat_s32(g);
            gbeta[c] = se32;
            continue;
        }
        for (p = 0; p < P; p++) {
            const int64_t i = (int64_t)p * C + c;
            se += e[i];
            g += (int64_t)e[i] * bn_xhat_k(&k, x[i], saved, C, c, 0);
        }
        ggamma[c] = tt_sat_s32(g);
        gbeta[c] = (int32_t)se;
    }
}

void tt_batchnorm_grad_s32(const tt_batchnorm_params *p, const int8_t *e, const int8_t *x,
                           int32_t *ggamma, int32_t *gbeta)
{
    bn_grad(p, e, x, 1, ggamma, gbeta);
}

void tt_batchnorm_grad_eval_s32(const tt_batchnorm_params *p, const int8_t *e, const int8_t *x,
                                int32_t *ggamma, int32_t *gbeta)
{
    bn_grad(p, e, x, 0, ggamma, gbeta);
}
