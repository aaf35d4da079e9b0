/** Fixed-point primitives of tinytrain, mirrored 1:1 from tinytrain/fixedpoint.py. */
#ifndef TT_FIXEDPOINT_H
#define TT_FIXEDPOINT_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* C99 leaves >> of negative values implementation-defined; every tinytrain kernel needs it
 * to be arithmetic (floor). This typedef fails to compile on a compiler where it is not. */
typedef char tt_require_arith_shift[((-1) >> 1) == -1 && ((int64_t)-5 >> 1) == -3 ? 1 : -1];

#define TT_S8_MAX 127
#define TT_S16_MAX 32767
#define TT_ALIGN_LIM (1L << 30)

/** Saturation counters reported by kernels (the simulator keeps the same counts). */
typedef struct tt_stats {
    uint32_t saturated;  /* values clamped by a saturating cast */
} tt_stats;

/** What every kernel that needs scratch or counts saturations receives: one per model (the
 *  generated C emits it `static const`). scratch: at least the kernel's TT_<OP>_BUFFER_SIZE
 *  bytes, 8-byte aligned, contents undefined on entry and exit; stats: incremented, never reset
 *  by a kernel. Kernels that do not saturate leave stats untouched. */
typedef struct tt_ctx {
    int64_t *scratch;
    tt_stats *stats;
} tt_ctx;

/** Round-to-nearest right shift, ties toward +inf; s in [0, 62]. Never overflows. */
static inline int64_t tt_rshift_round_s64(int64_t x, int32_t s)
{
    return s == 0 ? x : (x >> s) + ((x >> (s - 1)) & 1);
}

/** Round-to-nearest right shift of an int32, ties toward +inf; s in [0, 31]. */
static inline int32_t tt_rshift_round_s32(int32_t x, int32_t s)
{
    return s == 0 ? x : (x >> s) + ((x >> (s - 1)) & 1);
}

/** Stochastic rounding right shift: floor((x + (r mod 2^s)) / 2^s); s in [0, 31]. */
static inline int64_t tt_rshift_stoch_s64(int64_t x, int32_t s, uint32_t r)
{
    uint64_t m;
    if (s == 0) return x;
    m = ((uint64_t)1 << s) - 1u;
    return (x >> s) + (int64_t)((((uint64_t)x & m) + ((uint64_t)r & m)) >> s);
}

/** Clamp to the symmetric int8 range [-127, 127]. */
static inline int8_t tt_sat_s8(int64_t x)
{
    return (int8_t)(x > TT_S8_MAX ? TT_S8_MAX : x < -TT_S8_MAX ? -TT_S8_MAX : x);
}

/** Clamp to the symmetric int16 range [-32767, 32767]. */
static inline int16_t tt_sat_s16(int64_t x)
{
    return (int16_t)(x > TT_S16_MAX ? TT_S16_MAX : x < -TT_S16_MAX ? -TT_S16_MAX : x);
}

/** Clamp to the full int32 range. */
static inline int32_t tt_sat_s32(int64_t x)
{
    return (int32_t)(x > INT32_MAX ? INT32_MAX : x < INT32_MIN ? INT32_MIN : x);
}

/** Number of bits of a uint64 value (0 for 0). By CLZ where the core has it (ARMv7-M and up,
 *  hosts): the loop cost Cortex-M4 tens of instructions per call in every requantization;
 *  ARMv6-M (Cortex-M0) has no CLZ and keeps the loop. */
static inline int32_t tt_bitwidth_u64(uint64_t v)
{
#if defined(__GNUC__) && (defined(__ARM_FEATURE_CLZ) || !defined(__arm__))
    const uint32_t hi = (uint32_t)(v >> 32), lo = (uint32_t)v;
    return hi ? 64 - __builtin_clz(hi) : lo ? 32 - __builtin_clz(lo) : 0;
#else
    int32_t n = 0;
    while (v >= 256u) { v >>= 8; n += 8; }
    while (v) { v >>= 1; n += 1; }
    return n;
#endif
}

/** |x| of an int64 as uint64 without overflow on INT64_MIN. */
static inline uint64_t tt_abs_u64(int64_t x)
{
    return x < 0 ? (uint64_t)0 - (uint64_t)x : (uint64_t)x;
}

/** Right shift that brings values with this max |.| into a signed bits-bit range. */
static inline int32_t tt_requant_shift(uint64_t max_abs, int32_t bits)
{
    int32_t s = tt_bitwidth_u64(max_abs) - (bits - 1);
    return s > 0 ? s : 0;
}

/** Clamp to [-2^30, 2^30] (aligned bias / residual term). */
static inline int64_t tt_clamp_align(int64_t x)
{
    return x > TT_ALIGN_LIM ? TT_ALIGN_LIM : x < -TT_ALIGN_LIM ? -TT_ALIGN_LIM : x;
}

/** Re-express an int32 at exponent e_from at exponent e_to (see ops/_common.align_to). */
static inline int64_t tt_align(int32_t v, int32_t e_from, int32_t e_to)
{
    int64_t r;
    if (e_to >= e_from) {
        int32_t d = e_to - e_from;
        r = tt_rshift_round_s64((int64_t)v, d > 62 ? 62 : d);
    } else {
        int32_t d = e_from - e_to;
        r = (int64_t)((uint64_t)(int64_t)v << (d > 31 ? 31 : d)); /* |v| <= 2^31: no overflow */
    }
    return tt_clamp_align(r);
}

/** tt_align as an int32 (its result is within [-2^30, 2^30]), without 64-bit shifts when
 *  e_to >= e_from: d = e_to - e_from in [1, 31] is the int32 rounding shift (|result| <= 2^30),
 *  d >= 32 gives 0 (floor(v / 2^d) is 0 or -1 and the rounding bit cancels -1), d = 0 clamps. */
static inline int32_t tt_align_s32(int32_t v, int32_t e_from, int32_t e_to)
{
    if (e_to >= e_from) {
        const int32_t d = e_to - e_from;
        if (d == 0) return v > (int32_t)TT_ALIGN_LIM ? (int32_t)TT_ALIGN_LIM : v < -(int32_t)TT_ALIGN_LIM ? -(int32_t)TT_ALIGN_LIM : v;
        return d > 31 ? 0 : tt_rshift_round_s32(v, d);
    }
    return (int32_t)tt_align(v, e_from, e_to);
}

/** An int16 tensor (a bias under the policy "bias": "int16") as int32, exactly: the kernels
 *  whose params hold an int32 bias read the copy (the generated forward widens it first). */
static inline void tt_widen_s16_s32(const int16_t *v, int32_t n, int32_t *out)
{
    for (int32_t i = 0; i < n; i++) out[i] = v[i];
}

/** An int8 error as int32: the gradient of a bias (at the error's exponent). */
static inline void tt_widen_s8_s32(const int8_t *v, int32_t n, int32_t *out)
{
    for (int32_t i = 0; i < n; i++) out[i] = v[i];
}

/** Requantize n int64 values to int8 with a shared dynamic exponent; returns the shift. */
int32_t tt_requant_s8_from_s64(const int64_t *acc, int32_t n, int8_t *y, tt_stats *st);
/** Same, given max_abs = max |acc[i]| (a kernel that tracked it while accumulating). */
int32_t tt_requant_s8_from_s64_max(const int64_t *acc, int32_t n, uint64_t max_abs, int8_t *y,
                                   tt_stats *st);
/** Same for int32 accumulators. */
int32_t tt_requant_s8_from_s32(const int32_t *acc, int32_t n, int8_t *y, tt_stats *st);
/** Same for int32 accumulators, given max_abs >= max |acc[i]| with the same bit width (e.g. the
 *  OR of every |acc[i]|). */
int32_t tt_requant_s8_from_s32_max(const int32_t *acc, int32_t n, uint32_t max_abs, int8_t *y,
                                   tt_stats *st);
/** Same, given m, the OR of every acc[i] ^ (acc[i] >> 31) (an int32 scratch, 4-byte aligned):
 *  four values a step on the DSP, redone by tt_requant_s8_from_s32 when a result needs a clamp. */
int32_t tt_requant_s8_from_s32_or(const int32_t *acc, int32_t n, uint32_t m, int8_t *y, tt_stats *st);

/** Integer division truncating toward zero (C99 semantics); b != 0. */
static inline int32_t tt_div_trunc_s32(int32_t a, int32_t b) { return a / b; }

/** Integer division rounding toward -inf (Python //); b > 0. */
static inline int64_t tt_div_floor_s64(int64_t a, int64_t b)
{
    int64_t q = a / b;
    return a % b < 0 ? q - 1 : q;
}

/** floor(sqrt(x)) by the bit-by-bit method. */
uint32_t tt_isqrt_u32(uint32_t x);

/** 2^(t/256) in Q15 for t <= 0 (Q8). */
int32_t tt_exp2_neg_q15(int32_t t_q8);

/** 2^(-f/256) in Q15 for f in [0, 255] (tt_fixedpoint.c; generated by tinytrain.fixedpoint). */
extern const uint16_t tt_exp2_neg_q15_table[256];

/** The body of tt_exp2_neg_q15, inlined into hot loops (the softmax). */
static inline int32_t tt_exp2_neg_q15_inline(int32_t t_q8)
{
    const uint32_t u = (uint32_t)(-t_q8), n = u >> 8;
    if (n > 15) return 0;
    return tt_rshift_round_s32((int32_t)tt_exp2_neg_q15_table[u & 0xFFu], (int32_t)n);
}
/** log2(x) in Q16 for x >= 1. */
int32_t tt_log2_q16(uint32_t x);

/** xorshift32 step (13, 17, 5): returns the new state, which is the draw. */
static inline uint32_t tt_prng_next(uint32_t *state)
{
    uint32_t x = *state;
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    *state = x;
    return x;
}

/** 1 where a 32-bit load or store at any alignment is one instruction (ARMv7-M, ARMv8-M
 *  mainline, the little-endian hosts the tests build for), else 0 (Cortex-M0/M0+/M23 fault on an
 *  unaligned word): kernels that mask or scan bytes a word at a time (memcpy to a uint32_t) take
 *  that path only where this is 1 and keep the element loop beside it. */
#ifndef TT_WORD_ACCESS
#if (defined(__ARM_ARCH_7M__) || defined(__ARM_ARCH_7EM__) || defined(__ARM_ARCH_8M_MAIN__) || \
     defined(__x86_64__) || defined(__i386__) || defined(__aarch64__)) && \
    !(defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__)
#define TT_WORD_ACCESS 1
#else
#define TT_WORD_ACCESS 0
#endif
#endif

/** state advanced by k tt_prng_next steps at once, from the table of those k steps
 *  (tinytrain.fixedpoint.prng_jump_table(k), emitted by the code generator): xorshift32 is linear
 *  over GF(2), so the result is the XOR of table[j][nibble j of state] (8 lookups, ~24 M4
 *  instructions, for k steps of ~3 each). */
static inline uint32_t tt_prng_jump(const uint32_t (*table)[16], uint32_t state)
{
    uint32_t out = 0;
    int32_t j;
    for (j = 0; j < 8; j++, state >>= 4) out ^= table[j][state & 15u];
    return out;
}

/** Map a seed to a non-zero xorshift32 state. */
uint32_t tt_prng_seed(uint32_t seed);

#ifdef __cplusplus
}
#endif

#endif /* TT_FIXEDPOINT_H */
