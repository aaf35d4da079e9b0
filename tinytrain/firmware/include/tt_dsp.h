/** Cortex-M DSP extension (ARMv7E-M: Cortex-M4, M7, M33...) for the kernels' fast paths.
 *
 * TT_HAVE_DSP is 1 when the compiler targets a CPU with the DSP instructions
 * (__ARM_FEATURE_DSP), else 0; a build flag -DTT_HAVE_DSP=0 forces the portable paths. Kernels
 * keep both paths side by side under the same function names (#if TT_HAVE_DSP ... #else ...)
 * and give the same bits; tests/test_ops_dsp.py checks that by building the DSP paths for the
 * host with -DTT_HAVE_DSP=1 and the plain C intrinsics of tests/c/tt_dsp_emul.h.
 *
 * Intrinsics used (ACLE, <arm_acle.h>): __smlad, __smlabb, __smlabt, __smlatb, __smlatt, __smlawb, __smlawt, __ssub16,
 * __sadd16, __shsub16, __sxtb16, __qadd16, __qsub16, __qadd, __qsub, __ssub8 with __sel (SEL reads the GE flags
 * SSUB8 sets); PKHBT/PKHTB, SMMULR,
 * SMMLAR, LDRD/STRD of int32 pairs and the Q-flag guard (SSAT16, SSAT, MRS/MSR APSR) by inline asm.
 * Packed int16 pairs are read and written with memcpy (one LDR/STR on ARMv7E-M, which allows
 * unaligned word access; no aliasing of int16_t arrays through uint32_t pointers).
 */
#ifndef TT_DSP_H
#define TT_DSP_H

#include <stdint.h>
#include <string.h>

#ifndef TT_HAVE_DSP
#if defined(__ARM_FEATURE_DSP) && __ARM_FEATURE_DSP
#define TT_HAVE_DSP 1
#else
#define TT_HAVE_DSP 0
#endif
#endif

#if TT_HAVE_DSP
#if defined(__ARM_FEATURE_DSP) && __ARM_FEATURE_DSP
#include <arm_acle.h>
#else
#include "tt_dsp_emul.h" /* host test build: plain C definitions of the intrinsics above */
#endif

#ifdef __cplusplus
extern "C" {
#endif

/** Two int16 at p (any 2-byte alignment), p[0] in the low half. */
static inline uint32_t tt_ld_s16x2(const int16_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/** Store the two halves of v at p[0] (low) and p[1] (high). */
static inline void tt_st_s16x2(int16_t *p, uint32_t v)
{
    memcpy(p, &v, 4);
}

/** Four int8 at p (any alignment), p[0] in the low byte. */
static inline uint32_t tt_ld_s8x4(const int8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/** Store the four bytes of v at p[0] (low byte) .. p[3] (any alignment). */
static inline void tt_st_s8x4(int8_t *p, uint32_t v)
{
    memcpy(p, &v, 4);
}

/* Four int16 at p (4-byte aligned) as two pairs, p[0..1] in *lo and p[2..3] in *hi: one LDRD
 * on the target. */
#if defined(__ARM_FEATURE_DSP) && __ARM_FEATURE_DSP
static inline void tt_ld_s16x4(const int16_t *p, uint32_t *lo, uint32_t *hi)
{
    uint32_t a, b;
    __asm__("ldrd %0, %1, [%2]" : "=r"(a), "=r"(b) : "r"(p), "m"(*(const int16_t(*)[4])p));
    *lo = a;
    *hi = b;
}
#else
static inline void tt_ld_s16x4(const int16_t *p, uint32_t *lo, uint32_t *hi)
{
    *lo = tt_ld_s16x2(p);
    *hi = tt_ld_s16x2(p + 2);
}
#endif

/* Store two pairs at *p (4-byte aligned), lo at p[0..1] and hi at p[2..3], then *p += 4: one
 * STRD with writeback on the target. */
#if defined(__ARM_FEATURE_DSP) && __ARM_FEATURE_DSP
static inline void tt_st_s16x4_next(int16_t **p, uint32_t lo, uint32_t hi)
{
    int16_t *q = *p;
    __asm__("strd %2, %3, [%0], #8" : "+r"(q), "=m"(*(int16_t(*)[4])q) : "r"(lo), "r"(hi));
    *p = q;
}

/* Two words at *p (4-byte aligned), then *p += 2: one LDRD with writeback. */
static inline void tt_ld_u32x2_next(const uint32_t **p, uint32_t *a, uint32_t *b)
{
    const uint32_t *q = *p;
    uint32_t x, y;
    __asm__("ldrd %0, %1, [%2], #8" : "=r"(x), "=r"(y), "+r"(q) : "m"(*(const uint32_t(*)[2])q));
    *p = q;
    *a = x;
    *b = y;
}
#else
static inline void tt_st_s16x4_next(int16_t **p, uint32_t lo, uint32_t hi)
{
    tt_st_s16x2(*p, lo);
    tt_st_s16x2(*p + 2, hi);
    *p += 4;
}

static inline void tt_ld_u32x2_next(const uint32_t **p, uint32_t *a, uint32_t *b)
{
    *a = (*p)[0];
    *b = (*p)[1];
    *p += 2;
}
#endif

/* Store two pairs at p (4-byte aligned): lo at p[0..1], hi at p[2..3]; one STRD on the target. */
#if defined(__ARM_FEATURE_DSP) && __ARM_FEATURE_DSP
static inline void tt_st_s16x4(int16_t *p, uint32_t lo, uint32_t hi)
{
    __asm__("strd %1, %2, [%3]" : "=m"(*(int16_t(*)[4])p) : "r"(lo), "r"(hi), "r"(p));
}
#else
static inline void tt_st_s16x4(int16_t *p, uint32_t lo, uint32_t hi)
{
    tt_st_s16x2(p, lo);
    tt_st_s16x2(p + 2, hi);
}
#endif

/* Four int16 at *p (4-byte aligned) as two pairs (p[0..1] in *lo, p[2..3] in *hi), then
 * *p += 4: one LDRD with writeback on the target (GCC 12 does not pair the two LDRs of
 * memcpy'd int16 pairs itself). */
#if defined(__ARM_FEATURE_DSP) && __ARM_FEATURE_DSP
static inline void tt_ld_s16x4_next(const int16_t **p, uint32_t *lo, uint32_t *hi)
{
    const int16_t *q = *p;
    uint32_t a, b;
    __asm__("ldrd %0, %1, [%2], #8" : "=r"(a), "=r"(b), "+r"(q) : "m"(*(const int16_t(*)[4])q));
    *p = q;
    *lo = a;
    *hi = b;
}
#else
static inline void tt_ld_s16x4_next(const int16_t **p, uint32_t *lo, uint32_t *hi)
{
    *lo = tt_ld_s16x2(*p);
    *hi = tt_ld_s16x2(*p + 2);
    *p += 4;
}
#endif

#if defined(__ARM_FEATURE_DSP) && __ARM_FEATURE_DSP
/* GCC 12 does not form PKHBT/PKHTB from shifts and masks, and ACLE has no intrinsic for them. */

/** (low half of lo, low half of hi << 16): PKHBT. */
static inline uint32_t tt_pack_lo(uint32_t lo, uint32_t hi)
{
    uint32_t r;
    __asm__("pkhbt %0, %1, %2, lsl #16" : "=r"(r) : "r"(lo), "r"(hi));
    return r;
}

/** (high half of lo >> 16, high half of hi): PKHTB. */
static inline uint32_t tt_pack_hi(uint32_t lo, uint32_t hi)
{
    uint32_t r;
    __asm__("pkhtb %0, %1, %2, asr #16" : "=r"(r) : "r"(hi), "r"(lo));
    return r;
}

/* Sticky saturation guard on the Q flag: clear it, let SSAT16 #15 set it when a lane of v is
 * outside [-16384, 16383], read it. Volatile asm: kept in program order among themselves. */
static inline void tt_guard_clear(void)
{
    __asm__ volatile("msr APSR_nzcvq, %0" : : "r"(0) : "cc");
}

static inline void tt_guard_s16x2_15(uint32_t v)
{
    uint32_t t;
    __asm__ volatile("ssat16 %0, #15, %1" : "=r"(t) : "r"(v));
    (void)t;
}

/* SSAT #15 of one word: sets the Q flag when v is outside [-16384, 16383]. */
static inline void tt_guard_s32_15(int32_t v)
{
    int32_t t;
    __asm__ volatile("ssat %0, #15, %1" : "=r"(t) : "r"(v));
    (void)t;
}

/** SXTB16 of v rotated right by 8 (bytes 1 and 3 sign-extended into the lanes): one instruction
 *  (GCC 12 does not fold the rotation into __sxtb16's operand). */
static inline uint32_t tt_sxtb16_ror8(uint32_t v)
{
    uint32_t r;
    __asm__("sxtb16 %0, %1, ror #8" : "=r"(r) : "r"(v));
    return r;
}

/** (a * b + 2^31) >> 32 of the exact 64-bit product (SMMULR: most significant word, rounded). */
static inline int32_t tt_smmulr(int32_t a, int32_t b)
{
    int32_t r;
    __asm__("smmulr %0, %1, %2" : "=r"(r) : "r"(a), "r"(b));
    return r;
}

/** lo(a) lo(b) (SMULBB; GCC 12's arm_acle.h has no __smulbb). */
static inline int32_t tt_smulbb(int32_t a, int32_t b)
{
    int32_t r;
    __asm__("smulbb %0, %1, %2" : "=r"(r) : "r"(a), "r"(b));
    return r;
}

/** hi(a) lo(b) (SMULTB). */
static inline int32_t tt_smultb(int32_t a, int32_t b)
{
    int32_t r;
    __asm__("smultb %0, %1, %2" : "=r"(r) : "r"(a), "r"(b));
    return r;
}

/** (c 2^32 + a * b + 2^31) >> 32 mod 2^32: c + SMMULR(a, b) in one instruction (SMMLAR). */
static inline int32_t tt_smmlar(int32_t a, int32_t b, int32_t c)
{
    int32_t r;
    __asm__("smmlar %0, %1, %2, %3" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
}

/* SSAT #15 of t >> 8 (arithmetic): t >> 8 clamped to [-16384, 16383], setting the Q flag when
 * it was outside (volatile: kept in order with the guard's other steps). */
static inline int32_t tt_ssat15_asr8(int32_t t)
{
    int32_t r;
    __asm__ volatile("ssat %0, #15, %1, asr #8" : "=r"(r) : "r"(t));
    return r;
}

/* Two int32 at p (4-byte aligned) by one LDRD, then p += 2 (writeback). */
static inline void tt_ld_s32x2_next(const int32_t **p, int32_t *a, int32_t *b)
{
    const int32_t *q = *p;
    int32_t x, y;
    __asm__("ldrd %0, %1, [%2], #8" : "=r"(x), "=r"(y), "+r"(q) : "m"(*(const int32_t(*)[2])q));
    *p = q;
    *a = x;
    *b = y;
}

/* Two int32 at p (4-byte aligned) by one LDRD. */
static inline void tt_ld_s32x2(const int32_t *p, int32_t *a, int32_t *b)
{
    int32_t x, y;
    __asm__("ldrd %0, %1, [%2]" : "=r"(x), "=r"(y) : "r"(p), "m"(*(const int32_t(*)[2])p));
    *a = x;
    *b = y;
}

/* Two int32 at *p (4-byte aligned) by one STRD, then *p += 2 (writeback). */
static inline void tt_st_s32x2_next(int32_t **p, int32_t a, int32_t b)
{
    int32_t *q = *p;
    __asm__("strd %2, %3, [%0], #8" : "+r"(q), "=m"(*(int32_t(*)[2])q) : "r"(a), "r"(b));
    *p = q;
}

/* Two int32 at *p (4-byte aligned) by one LDRD into *a, *b, then both set to z by one STRD and
 * *p += 2 (writeback): an accumulator pair read and cleared (early-clobber outputs: the pointer
 * register survives the load, no copy of it). */
static inline void tt_ld_clear_s32x2_next(int32_t **p, int32_t *a, int32_t *b, int32_t z)
{
    int32_t *q = *p, x, y;
    __asm__("ldrd %0, %1, [%2]\n\tstrd %4, %4, [%2], #8"
            : "=&r"(x), "=&r"(y), "+r"(q), "+m"(*(int32_t(*)[2])q) : "r"(z));
    *p = q;
    *a = x;
    *b = y;
}

/* a, b to p[-2], p[-1] (4-byte aligned) by one STRD: the store after a tt_ld_s32x2_next of p. */
static inline void tt_st_s32x2_prev(int32_t *p, int32_t a, int32_t b)
{
    __asm__("strd %2, %3, [%1, #-8]" : "=m"(*(int32_t(*)[2])(p - 2)) : "r"(p), "r"(a), "r"(b));
}

/* tt_guard_clear once *a and *b exist, before anything later reads them (both pass through the
 * instruction): the Q flag a saturating step that needs no redo (a velocity's QADD) set is
 * dropped before the guarded instructions that follow. */
static inline void tt_guard_clear_after2(int32_t *a, int32_t *b)
{
    __asm__ volatile("msr APSR_nzcvq, %2" : "+r"(*a), "+r"(*b) : "r"(0) : "cc");
}

static inline int tt_guard_hit(void)
{
    uint32_t apsr;
    __asm__ volatile("mrs %0, APSR" : "=r"(apsr));
    return (int)((apsr >> 27) & 1u);
}

/* tt_guard_hit after the QADD/QSUB results a..d exist (their inputs to the read: the compiler may
 * not move the saturating instructions, which set the Q flag, after it). */
static inline int tt_guard_hit_after(int32_t a, int32_t b, int32_t c, int32_t d)
{
    uint32_t apsr;
    __asm__ volatile("mrs %0, APSR" : "=r"(apsr) : "r"(a), "r"(b), "r"(c), "r"(d));
    return (int)((apsr >> 27) & 1u);
}
#else
/* tt_dsp_emul.h defines tt_guard_clear, tt_guard_s16x2_15, tt_guard_s32_15, tt_ssat15_asr8, tt_guard_hit_after and
 * tt_guard_hit in C. */

/** (c 2^32 + a * b + 2^31) >> 32 mod 2^32: c + SMMULR(a, b) in one instruction (SMMLAR). */
static inline int32_t tt_smmlar(int32_t a, int32_t b, int32_t c)
{
    return (int32_t)(uint32_t)((((uint64_t)(uint32_t)c << 32) + (uint64_t)((int64_t)a * b) + ((uint64_t)1 << 31)) >> 32);
}

static inline void tt_ld_s32x2_next(const int32_t **p, int32_t *a, int32_t *b)
{
    *a = (*p)[0];
    *b = (*p)[1];
    *p += 2;
}

static inline void tt_ld_s32x2(const int32_t *p, int32_t *a, int32_t *b)
{
    *a = p[0];
    *b = p[1];
}

static inline void tt_st_s32x2_next(int32_t **p, int32_t a, int32_t b)
{
    (*p)[0] = a;
    (*p)[1] = b;
    *p += 2;
}

static inline void tt_ld_clear_s32x2_next(int32_t **p, int32_t *a, int32_t *b, int32_t z)
{
    *a = (*p)[0];
    *b = (*p)[1];
    (*p)[0] = z;
    (*p)[1] = z;
    *p += 2;
}

static inline void tt_st_s32x2_prev(int32_t *p, int32_t a, int32_t b)
{
    p[-2] = a;
    p[-1] = b;
}

/** (a * b + 2^31) >> 32 of the exact 64-bit product (SMMULR: most significant word, rounded). */
static inline int32_t tt_smmulr(int32_t a, int32_t b)
{
    return (int32_t)(((int64_t)a * b + ((int64_t)1 << 31)) >> 32);
}

/** SXTB16 of v rotated right by 8. */
static inline uint32_t tt_sxtb16_ror8(uint32_t v)
{
    return (uint32_t)__sxtb16((int32_t)((v >> 8) | (v << 24)));
}

/** lo(a) lo(b) (SMULBB). */
static inline int32_t tt_smulbb(int32_t a, int32_t b)
{
    return (int32_t)(int16_t)(uint16_t)((uint32_t)a & 0xFFFFu) * (int32_t)(int16_t)(uint16_t)((uint32_t)b & 0xFFFFu);
}

/** hi(a) lo(b) (SMULTB). */
static inline int32_t tt_smultb(int32_t a, int32_t b)
{
    return (int32_t)(int16_t)(uint16_t)((uint32_t)a >> 16) * (int32_t)(int16_t)(uint16_t)((uint32_t)b & 0xFFFFu);
}

/** (low half of lo, low half of hi << 16): PKHBT. */
static inline uint32_t tt_pack_lo(uint32_t lo, uint32_t hi)
{
    return (lo & 0xFFFFu) | (hi << 16);
}

/** (high half of lo >> 16, high half of hi): PKHTB. */
static inline uint32_t tt_pack_hi(uint32_t lo, uint32_t hi)
{
    return (lo >> 16) | (hi & 0xFFFF0000u);
}
#endif

/** The fused SGD step pair D = (d_lo, d_hi) of a row's A and one widened input pair X: the
 *  high halves of SMLAWB / SMLAWT(A, X, 2^15), d = round(a x / 2^s) exactly when X = x 2^c and
 *  A = a 2^(32 - s - c) (tt_sgd.c's tt_sgd_dense_rows_s16 states the bounds). */
static inline uint32_t tt_step_s16x2(int32_t A, uint32_t X)
{
    return tt_pack_hi((uint32_t)__smlawb(A, (int32_t)X, 32768), (uint32_t)__smlawt(A, (int32_t)X, 32768));
}

/** Widen x[0..n) (n even) to int16 pairs: xx[j] = x[2j] * 2^c in the low half, x[2j+1] * 2^c in
 *  the high half; c in [0, 8], so |x| * 2^c <= 2^15 fits (-128 * 256 = -32768). Four inputs per
 *  step: SXTB16 splits even and odd bytes into sign-extended lanes, PKHBT/PKHTB reorder them;
 *  a word shift by c scales both lanes, except that the low lane's sign bits spill into the low
 *  c bits of the high lane, which the mask clears (the high lane's own low c bits are 0). */
static inline void tt_widen_s8(const int8_t *x, int32_t n, int32_t c, uint32_t *xx)
{
    const uint32_t keep = ~((((uint32_t)1 << c) - 1u) << 16);
    const int8_t *end = x + (n & ~3);
    for (; x != end; x += 4, xx += 2) { /* pointer steps: no index arithmetic per turn */
        const uint32_t v = tt_ld_s8x4(x);
        const uint32_t e = (uint32_t)__sxtb16((int32_t)v), o = (uint32_t)__sxtb16((int32_t)((v >> 8) | (v << 24)));
        xx[0] = (tt_pack_lo(e, o) << c) & keep;
        xx[1] = (tt_pack_hi(e, o) << c) & keep;
    }
    if (n & 2)
        xx[0] = (((uint32_t)(int32_t)x[0] << c) & 0xFFFFu) | ((uint32_t)(int32_t)x[1] << (16 + c));
}

/** tt_widen_s8(x, n, 0, xx): per four inputs one LDR, the two SXTB16 (the second with its
 *  rotation), PKHBT, PKHTB and one STRD with writeback. */
static inline void tt_widen0_s8(const int8_t *x, int32_t n, uint32_t *xx)
{
    const int8_t *end = x + (n & ~3);
    int32_t *q = (int32_t *)(void *)xx;
    for (; x != end; x += 4) {
        const uint32_t v = tt_ld_s8x4(x);
        const uint32_t e = (uint32_t)__sxtb16((int32_t)v), o = tt_sxtb16_ror8(v);
        tt_st_s32x2_next(&q, (int32_t)tt_pack_lo(e, o), (int32_t)tt_pack_hi(e, o));
    }
    if (n & 2) *q = (int32_t)(((uint32_t)(int32_t)x[0] & 0xFFFFu) | ((uint32_t)(int32_t)x[1] << 16));
}

#ifdef __cplusplus
}
#endif
#endif /* TT_HAVE_DSP */

#endif /* TT_DSP_H */
