/* Exported wrappers around the static inline primitives so tests can call them via cffi. */
#include "tt_fixedpoint.h"

int64_t tt_t_rshift_round_s64(int64_t x, int32_t s) { return tt_rshift_round_s64(x, s); }
int32_t tt_t_rshift_round_s32(int32_t x, int32_t s) { return tt_rshift_round_s32(x, s); }
int64_t tt_t_rshift_stoch_s64(int64_t x, int32_t s, uint32_t r) { return tt_rshift_stoch_s64(x, s, r); }
int8_t tt_t_sat_s8(int64_t x) { return tt_sat_s8(x); }
int16_t tt_t_sat_s16(int64_t x) { return tt_sat_s16(x); }
int32_t tt_t_sat_s32(int64_t x) { return tt_sat_s32(x); }
int32_t tt_t_bitwidth_u64(uint64_t v) { return tt_bitwidth_u64(v); }
int32_t tt_t_requant_shift(uint64_t m, int32_t bits) { return tt_requant_shift(m, bits); }
int64_t tt_t_align(int32_t v, int32_t ef, int32_t et) { return tt_align(v, ef, et); }
int32_t tt_t_div_trunc_s32(int32_t a, int32_t b) { return tt_div_trunc_s32(a, b); }
uint32_t tt_t_prng_next(uint32_t s) { tt_prng_next(&s); return s; }
