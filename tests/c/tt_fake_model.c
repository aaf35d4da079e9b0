/** See tt_fake_model.h. Training on a sample whose first value is -128 fails with error 99
 *  (not a TT_ERR_* code) without touching the state, to test error propagation. */
#include <string.h>

#include "tt_crc32.h"
#include "tt_fake_model.h"
#include "tt_fedcodec.h"

static uint8_t fake_params[TT_FAKE_PARAMS];
static uint8_t fake_shadow[TT_FAKE_PARAMS];
static uint32_t fake_step;
static uint32_t fake_seed;

/* The on-device update codec over the fake parameter store: bytes [0, 600) as 300 int16,
 * [600, 1000) as 100 int32 (see tt_fake_model.h). */
static const tt_fed_tensor fake_store[2] = {{0u, 300u, 2u}, {600u, 100u, 4u}};
static uint8_t fake_global[TT_FAKE_PARAMS];
static int64_t fake_residual[400];
static uint8_t fake_shift[2];
static tt_fedcodec fake_codec;
static int fake_read_params(uint32_t offset, uint8_t *dst, uint32_t n);

void tt_fake_power_on(void)
{
    uint32_t i;
    for (i = 0; i < TT_FAKE_PARAMS; i++) {
        fake_params[i] = (uint8_t)(i * 7u + 1u);
    }
    memset(fake_shadow, 0xEE, sizeof fake_shadow);
    fake_step = 0;
    fake_seed = 1;
    tt_fedcodec_init(&fake_codec, fake_store, 2u, fake_read_params, fake_global, fake_residual,
                     (uint32_t)sizeof fake_residual[0], fake_shift);
}

static int fake_train(const int8_t *x, int32_t label, int32_t *loss)
{
    uint32_t i;
    int32_t s = 0;
    if (label < 0 || label >= (int32_t)TT_FAKE_CLASSES) {
        return TT_ERR_RANGE;
    }
    if (x[0] == -128) {
        return 99;
    }
    for (i = 0; i < TT_FAKE_INPUT; i++) {
        fake_params[(i + fake_step) % TT_FAKE_PARAMS] += (uint8_t)x[i];
        s += x[i];
    }
    fake_params[TT_FAKE_PARAMS - 1u - (uint32_t)label] ^= 0x5Au;
    fake_step++;
    fake_seed = fake_seed * 1664525u + 1013904223u;
    *loss = s * 3 - label;
    return 0;
}

static int32_t fake_predict(const int8_t *x)
{
    uint32_t i, s = 0;
    for (i = 0; i < TT_FAKE_PARAMS; i++) {
        s += fake_params[i];
    }
    for (i = 0; i < TT_FAKE_INPUT; i++) {
        s += (uint8_t)x[i];
    }
    return (int32_t)(s % TT_FAKE_CLASSES);
}

static uint32_t fake_state_hash(void)
{
    uint8_t tail[8];
    uint32_t i;
    for (i = 0; i < 4; i++) {
        tail[i] = (uint8_t)(fake_step >> (8 * i));
        tail[4 + i] = (uint8_t)(fake_seed >> (8 * i));
    }
    return tt_crc32_update(tt_crc32_update(0, fake_params, TT_FAKE_PARAMS), tail, 8);
}

static uint32_t fake_step_count(void)
{
    return fake_step;
}

static int fake_read_params(uint32_t offset, uint8_t *dst, uint32_t n)
{
    memcpy(dst, fake_params + offset, n);
    return 0;
}

static int fake_stage(uint32_t offset, const uint8_t *src, uint32_t n)
{
    memcpy(fake_shadow + offset, src, n);
    return 0;
}

static int fake_commit(void)
{
    memcpy(fake_params, fake_shadow, sizeof fake_params);
    return 0;
}

/* tensor 0: params[0..600), tensor 1: params[600..1000), tensor 2: the seed (4 bytes LE) */
static int fake_get_tensor(uint16_t id, uint32_t offset, uint8_t *dst, uint32_t n, uint32_t *total)
{
    uint8_t seed[4];
    const uint8_t *base;
    uint32_t i;
    switch (id) {
    case 0: base = fake_params; *total = 600; break;
    case 1: base = fake_params + 600; *total = 400; break;
    case 2:
        for (i = 0; i < 4; i++) {
            seed[i] = (uint8_t)(fake_seed >> (8 * i));
        }
        base = seed;
        *total = 4;
        break;
    default: return TT_ERR_RANGE;
    }
    if (offset > *total) {
        return TT_ERR_RANGE;
    }
    memcpy(dst, base + offset, *total - offset < n ? *total - offset : n);
    return 0;
}

static void fake_set_seed(uint32_t seed)
{
    fake_seed = seed;
}

static void fake_reset(void)
{
    tt_fake_power_on();
}

static int fake_round_begin(uint32_t round, uint32_t device, uint32_t codec, uint32_t *gh, uint32_t *rcrc)
{
    int rc = tt_fedcodec_begin(&fake_codec, codec, round, device);
    *gh = tt_fedcodec_global_hash(&fake_codec);
    *rcrc = tt_fedcodec_residual_crc(&fake_codec);
    return rc;
}

static int fake_update_prepare(uint32_t n_samples, uint32_t *len, uint32_t *crc)
{
    return tt_fedcodec_prepare(&fake_codec, n_samples, fake_step, len, crc);
}

static int fake_update_read(uint32_t offset, uint8_t *dst, uint32_t n, uint32_t *len, uint32_t *crc)
{
    if (!fake_codec.prepared) {
        return TT_ERR_SEQUENCE;
    }
    *len = fake_codec.msg_len;
    *crc = fake_codec.crc;
    if (offset > *len) {
        return TT_ERR_RANGE;
    }
    return tt_fedcodec_read(&fake_codec, offset, dst, *len - offset < n ? *len - offset : n);
}

static int fake_update_ack(uint32_t round, uint32_t crc, uint32_t accepted, uint32_t *status, uint32_t *rcrc)
{
    int rc = tt_fedcodec_ack(&fake_codec, round, crc, accepted, status);
    *rcrc = tt_fedcodec_residual_crc(&fake_codec);
    return rc;
}

static int fake_write_params(uint32_t offset, const uint8_t *src, uint32_t n)
{
    if (offset > TT_FAKE_PARAMS || n > TT_FAKE_PARAMS - offset) {
        return -1;
    }
    memcpy(fake_params + offset, src, n);
    return 0;
}

static int fake_fed_prox(uint32_t mult, uint32_t shift)
{
    return tt_fedcodec_prox(&fake_codec, fake_write_params, mult, shift);
}

const tt_device_model tt_fake_model = {
    TT_FAKE_SCHEMA, 2u * TT_FAKE_PARAMS + 8u, TT_FAKE_PARAMS, TT_FAKE_INPUT, TT_FAKE_CLASSES,
    fake_train, fake_predict, fake_state_hash, fake_step_count, fake_read_params, fake_stage,
    fake_commit, fake_get_tensor, fake_set_seed, fake_reset,
    fake_round_begin, fake_update_prepare, fake_update_read, fake_update_ack, fake_fed_prox, 64u,
};
