/** Plain C definitions of the ACLE DSP intrinsics used by the TT_HAVE_DSP paths, so that those
 *  paths can be built and tested on the host (tests/test_ops_dsp.py). Semantics from the Arm
 *  ARM (ARMv7-M) pseudo-code. The Q flag is modelled only for the saturation guard of tt_dsp.h
 *  (SSAT16 #15); the kernels never let SMLAD/SMLAW overflow. */
#ifndef TT_DSP_EMUL_H
#define TT_DSP_EMUL_H

#include <stdint.h>

static inline int32_t tt_emul_lo(int32_t v) { return (int16_t)(uint16_t)((uint32_t)v & 0xFFFFu); }
static inline int32_t tt_emul_hi(int32_t v) { return (int16_t)(uint16_t)((uint32_t)v >> 16); }
static inline int32_t tt_emul_wrap(int64_t v) { return (int32_t)(uint32_t)(uint64_t)v; }

/** SMLAD: c + lo(a) lo(b) + hi(a) hi(b), modulo 2^32. */
static inline int32_t __smlad(int32_t a, int32_t b, int32_t c)
{
    return tt_emul_wrap((int64_t)c + (int64_t)tt_emul_lo(a) * tt_emul_lo(b) + (int64_t)tt_emul_hi(a) * tt_emul_hi(b));
}

/** SMUAD: lo(a) lo(b) + hi(a) hi(b), modulo 2^32. */
static inline int32_t __smuad(int32_t a, int32_t b)
{
    return tt_emul_wrap((int64_t)tt_emul_lo(a) * tt_emul_lo(b) + (int64_t)tt_emul_hi(a) * tt_emul_hi(b));
}

/** SMLALD: c + lo(a) lo(b) + hi(a) hi(b) in 64 bits (modulo 2^64; no overflow for the sums that use it). */
static inline int64_t __smlald(int32_t a, int32_t b, int64_t c)
{
    return (int64_t)((uint64_t)c + (uint64_t)((int64_t)tt_emul_lo(a) * tt_emul_lo(b) + (int64_t)tt_emul_hi(a) * tt_emul_hi(b)));
}

/** SMLABB: c + lo(a) lo(b); SMLABT: c + lo(a) hi(b), modulo 2^32. */
static inline int32_t __smlabb(int32_t a, int32_t b, int32_t c) { return tt_emul_wrap((int64_t)c + (int64_t)tt_emul_lo(a) * tt_emul_lo(b)); }
static inline int32_t __smlabt(int32_t a, int32_t b, int32_t c) { return tt_emul_wrap((int64_t)c + (int64_t)tt_emul_lo(a) * tt_emul_hi(b)); }
/** SMLATT: c + hi(a) hi(b), modulo 2^32; SMLATB: c + hi(a) lo(b). */
static inline int32_t __smlatt(int32_t a, int32_t b, int32_t c) { return tt_emul_wrap((int64_t)c + (int64_t)tt_emul_hi(a) * tt_emul_hi(b)); }
static inline int32_t __smlatb(int32_t a, int32_t b, int32_t c) { return tt_emul_wrap((int64_t)c + (int64_t)tt_emul_hi(a) * tt_emul_lo(b)); }

/** SMLAWB: c + bits [47:16] of a * lo(b) (floor division by 2^16); SMLAWT with hi(b). */
static inline int32_t tt_emul_smlaw(int32_t a, int32_t h, int32_t c)
{
    const int64_t p = (int64_t)a * h;
    return tt_emul_wrap((int64_t)c + (p >= 0 ? p / 65536 : -((-p + 65535) / 65536)));
}
static inline int32_t __smlawb(int32_t a, int32_t b, int32_t c) { return tt_emul_smlaw(a, tt_emul_lo(b), c); }
static inline int32_t __smlawt(int32_t a, int32_t b, int32_t c) { return tt_emul_smlaw(a, tt_emul_hi(b), c); }

/* The Q flag (sticky saturation), set by QADD/QSUB and SSAT/SSAT16 (the guard below). */
static int tt_emul_q;

/** QADD: sat_s32(a + b), setting the Q flag when it saturates. */
static inline int32_t __qadd(int32_t a, int32_t b)
{
    const int64_t v = (int64_t)a + b;
    if (v > INT32_MAX || v < INT32_MIN) tt_emul_q = 1;
    return (int32_t)(v > INT32_MAX ? INT32_MAX : v < INT32_MIN ? INT32_MIN : v);
}

/** QSUB: sat_s32(a - b), setting the Q flag when it saturates. */
static inline int32_t __qsub(int32_t a, int32_t b)
{
    const int64_t v = (int64_t)a - b;
    if (v > INT32_MAX || v < INT32_MIN) tt_emul_q = 1;
    return (int32_t)(v > INT32_MAX ? INT32_MAX : v < INT32_MIN ? INT32_MIN : v);
}

/** SSUB16: lane-wise a - b, each modulo 2^16. */
static inline int32_t __ssub16(int32_t a, int32_t b)
{
    const uint32_t lo = (uint32_t)(tt_emul_lo(a) - tt_emul_lo(b)) & 0xFFFFu;
    const uint32_t hi = (uint32_t)(tt_emul_hi(a) - tt_emul_hi(b)) & 0xFFFFu;
    return (int32_t)(lo | (hi << 16));
}

/** SXTB16: bytes 0 and 2 of a, sign-extended into the low and high halves. */
static inline int32_t __sxtb16(int32_t a)
{
    const uint32_t u = (uint32_t)a;
    const uint32_t lo = (uint32_t)(int32_t)(int8_t)(uint8_t)(u & 0xFFu) & 0xFFFFu;
    const uint32_t hi = (uint32_t)(int32_t)(int8_t)(uint8_t)((u >> 16) & 0xFFu) & 0xFFFFu;
    return (int32_t)(lo | (hi << 16));
}

/** SADD16: lane-wise a + b, each modulo 2^16. */
static inline int32_t __sadd16(int32_t a, int32_t b)
{
    const uint32_t lo = (uint32_t)(tt_emul_lo(a) + tt_emul_lo(b)) & 0xFFFFu;
    const uint32_t hi = (uint32_t)(tt_emul_hi(a) + tt_emul_hi(b)) & 0xFFFFu;
    return (int32_t)(lo | (hi << 16));
}

/** SXTAB16: a plus bytes 0 and 2 of b sign-extended, lane-wise modulo 2^16. */
static inline int32_t __sxtab16(int32_t a, int32_t b)
{
    return __sadd16(a, __sxtb16(b));
}


static inline int32_t tt_emul_sat16(int32_t v) { return v > 32767 ? 32767 : v < -32768 ? -32768 : v; }

/** QADD16: lane-wise sat_s16(a + b) (the Q flag is not touched). */
static inline int32_t __qadd16(int32_t a, int32_t b)
{
    const uint32_t lo = (uint32_t)tt_emul_sat16(tt_emul_lo(a) + tt_emul_lo(b)) & 0xFFFFu;
    const uint32_t hi = (uint32_t)tt_emul_sat16(tt_emul_hi(a) + tt_emul_hi(b)) & 0xFFFFu;
    return (int32_t)(lo | (hi << 16));
}

/** QSUB16: lane-wise sat_s16(a - b) (the Q flag is not touched). */
static inline int32_t __qsub16(int32_t a, int32_t b)
{
    const uint32_t lo = (uint32_t)tt_emul_sat16(tt_emul_lo(a) - tt_emul_lo(b)) & 0xFFFFu;
    const uint32_t hi = (uint32_t)tt_emul_sat16(tt_emul_hi(a) - tt_emul_hi(b)) & 0xFFFFu;
    return (int32_t)(lo | (hi << 16));
}

/** SHADD16: lane-wise floor((a + b) / 2), exact (no wrap). */
static inline int32_t __shadd16(int32_t a, int32_t b)
{
    const int32_t sl = tt_emul_lo(a) + tt_emul_lo(b), sh = tt_emul_hi(a) + tt_emul_hi(b);
    const uint32_t lo = (uint32_t)(sl >= 0 ? sl / 2 : -((-sl + 1) / 2)) & 0xFFFFu;
    const uint32_t hi = (uint32_t)(sh >= 0 ? sh / 2 : -((-sh + 1) / 2)) & 0xFFFFu;
    return (int32_t)(lo | (hi << 16));
}

/** SHSUB16: lane-wise floor((a - b) / 2), exact (no wrap). */
static inline int32_t __shsub16(int32_t a, int32_t b)
{
    const int32_t dl = tt_emul_lo(a) - tt_emul_lo(b), dh = tt_emul_hi(a) - tt_emul_hi(b);
    const uint32_t lo = (uint32_t)(dl >= 0 ? dl / 2 : -((-dl + 1) / 2)) & 0xFFFFu;
    const uint32_t hi = (uint32_t)(dh >= 0 ? dh / 2 : -((-dh + 1) / 2)) & 0xFFFFu;
    return (int32_t)(lo | (hi << 16));
}

/* The GE flags as SSUB8 sets them (bit i: lane i of the exact a - b is >= 0), read by SEL.
 * One per translation unit, like the Q flag below. */
static int tt_emul_ge;

/** SSUB8: lane-wise a - b, each modulo 2^8; sets the GE flags. */
static inline int32_t __ssub8(int32_t a, int32_t b)
{
    uint32_t r = 0;
    int i;
    tt_emul_ge = 0;
    for (i = 0; i < 4; i++) {
        const int32_t d = (int8_t)(uint8_t)((uint32_t)a >> (8 * i)) - (int8_t)(uint8_t)((uint32_t)b >> (8 * i));
        r |= ((uint32_t)d & 0xFFu) << (8 * i);
        if (d >= 0) tt_emul_ge |= 1 << i;
    }
    return (int32_t)r;
}

/** SEL: lane i from a where GE bit i is set, else from b. */
static inline uint32_t __sel(uint32_t a, uint32_t b)
{
    uint32_t r = 0;
    int i;
    for (i = 0; i < 4; i++) r |= ((tt_emul_ge >> i) & 1 ? a : b) & (0xFFu << (8 * i));
    return r;
}

/* The Q flag as SSAT16 #15 sets it (tt_dsp.h's saturation guard); tt_emul_q is declared above. */
static inline void tt_guard_clear(void) { tt_emul_q = 0; }
static inline void tt_guard_clear_after2(int32_t *a, int32_t *b) { (void)a; (void)b; tt_emul_q = 0; }
static inline void tt_guard_s16x2_15(uint32_t v)
{
    const int32_t lo = tt_emul_lo((int32_t)v), hi = tt_emul_hi((int32_t)v);
    if (lo < -16384 || lo > 16383 || hi < -16384 || hi > 16383) tt_emul_q = 1;
}
static inline void tt_guard_s32_15(int32_t v)
{
    if (v < -16384 || v > 16383) tt_emul_q = 1;
}
static inline int32_t tt_ssat15_asr8(int32_t t)
{
    const int32_t v = t >> 8;
    if (v < -16384 || v > 16383) tt_emul_q = 1;
    return v < -16384 ? -16384 : v > 16383 ? 16383 : v;
}
static inline int tt_guard_hit(void) { return tt_emul_q; }
static inline int tt_guard_hit_after(int32_t a, int32_t b, int32_t c, int32_t d)
{
    (void)a; (void)b; (void)c; (void)d;
    return tt_emul_q;
}

#endif /* TT_DSP_EMUL_H */
