/**
 * Fuzz target for the device's frame parser and dispatcher (tt_protocol.c + tt_cobs.c) with the
 * fake model. Every reply the device emits is checked: well-formed COBS, valid CRC, protocol
 * version 1, a reply / LOG / ERROR type, and known error codes. A violation aborts.
 *
 * libFuzzer (clang):
 *   clang -std=c99 -g -O1 -fsanitize=fuzzer,address,undefined -Ifirmware/include -Itests/c \
 *     tests/fuzz/fuzz_frame_parser.c tests/c/tt_fake_model.c firmware/src/tt_protocol.c \
 *     firmware/src/tt_cobs.c firmware/src/tt_crc32.c firmware/src/tt_fedcodec.c -o /tmp/fuzz_frames
 *   /tmp/fuzz_frames -max_total_time=60
 * Standalone (gcc, seeded random and mutated frames; used by tests/test_protocol.py):
 *   add -DTT_FUZZ_STANDALONE and -fsanitize=address,undefined instead of fuzzer, then
 *   /tmp/fuzz_frames SEED ITERATIONS
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tt_cobs.h"
#include "tt_crc32.h"
#include "tt_fake_model.h"
#include "tt_protocol.h"

static tt_proto fz_proto;
static tt_cobs_decoder fz_out_dec;
static uint8_t fz_out_buf[TT_FRAME_MAX + 8];
static unsigned long fz_frames_out;
static unsigned long fz_replies, fz_errors[TT_ERR_MODEL + 1];

static uint32_t fz_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static void fz_check_frame(const uint8_t *f, uint32_t n)
{
    uint32_t type, plen;
    if (n < TT_HDR_LEN + TT_CRC_LEN || n > TT_FRAME_MAX) {
        abort();
    }
    if (tt_crc32_update(0, f, n - TT_CRC_LEN) != fz_u32(f + n - TT_CRC_LEN) || f[0] != 1) {
        abort();
    }
    type = f[1];
    plen = (uint32_t)f[6] | ((uint32_t)f[7] << 8);
    if (plen != n - TT_HDR_LEN - TT_CRC_LEN || fz_u32(f + 8) != TT_FAKE_SCHEMA) {
        abort();
    }
    if (type == TT_MSG_ERROR) {
        uint32_t code = (uint32_t)f[TT_HDR_LEN] | ((uint32_t)f[TT_HDR_LEN + 1] << 8);
        if (plen < 8 || code == 0 || code > TT_ERR_MODEL) {
            abort();
        }
        fz_errors[code]++;
    } else if (type != TT_MSG_LOG && (type < (TT_MSG_REPLY | TT_MSG_HELLO) ||
                                      type > (TT_MSG_REPLY | TT_MSG_FED_PROX))) {
        abort();
    } else {
        fz_replies++;
    }
    fz_frames_out++;
}

static void fz_put(void *ctx, uint8_t c)
{
    int rc;
    (void)ctx;
    rc = tt_cobs_decode_byte(&fz_out_dec, c);
    if (rc == TT_COBS_FRAME) {
        fz_check_frame(fz_out_buf, fz_out_dec.len);
    } else if (rc < 0) {
        abort(); /* the device itself emitted bad COBS */
    }
}

static void fz_power_on(void)
{
    tt_proto_io io;
    io.put = fz_put;
    io.cycles = NULL;
    io.ctx = NULL;
    tt_cobs_decoder_init(&fz_out_dec, fz_out_buf, sizeof fz_out_buf);
    tt_fake_power_on();
    tt_proto_init(&fz_proto, &tt_fake_model, &io);
    tt_proto_send_boot(&fz_proto);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    size_t i;
    static int powered;
    if (!powered) {
        fz_power_on();
        powered = 1;
    }
    for (i = 0; i < size; i++) {
        tt_proto_feed(&fz_proto, data[i]);
    }
    tt_proto_feed(&fz_proto, 0); /* end any partial frame so the next input starts clean */
    return 0;
}

#ifdef TT_FUZZ_STANDALONE
#include <stdio.h>

static uint32_t fz_rng;

static uint32_t fz_rand(void)
{
    fz_rng ^= fz_rng << 13;
    fz_rng ^= fz_rng >> 17;
    fz_rng ^= fz_rng << 5;
    return fz_rng;
}

/* A valid request of a random type (sometimes an unknown one) with a plausible payload. */
static uint32_t fz_valid_frame(uint8_t *f)
{
    static const uint32_t sizes[] = {0, 0, 12, 4 + 64, 8, 2 + TT_FAKE_INPUT,
                                     2 + 3 * (2 + TT_FAKE_INPUT), TT_FAKE_INPUT, 0, 8, 4, 0,
                                     12, 12, 12};
    uint32_t type = 1 + fz_rand() % 15, plen, i, crc;
    plen = type < 15 ? sizes[type] : fz_rand() % 40;
    if (type == TT_MSG_LOAD_PARAMS) {
        plen = 4 + 1 + fz_rand() % (TT_MAX_PAYLOAD - 4);
    }
    f[0] = 1;
    f[1] = (uint8_t)type;
    f[2] = (uint8_t)fz_rand();
    f[3] = (uint8_t)fz_rand();
    f[4] = 0;
    f[5] = 0;
    f[6] = (uint8_t)plen;
    f[7] = (uint8_t)(plen >> 8);
    crc = (fz_rand() & 3) ? TT_FAKE_SCHEMA : fz_rand() & 1 ? 0 : fz_rand();
    for (i = 0; i < 4; i++) {
        f[8 + i] = (uint8_t)(crc >> (8 * i));
    }
    for (i = 0; i < plen; i++) {
        f[TT_HDR_LEN + i] = (uint8_t)(fz_rand() % 7 == 0 ? 0 : fz_rand() % 12);
    }
    if (type == TT_MSG_LOAD_PARAMS) { /* offsets near the staging frontier */
        uint32_t off = (fz_rand() & 1) ? 0 : fz_rand() % (TT_FAKE_PARAMS + 64);
        for (i = 0; i < 4; i++) {
            f[TT_HDR_LEN + i] = (uint8_t)(off >> (8 * i));
        }
    }
    if (type == TT_MSG_GET_UPDATE) { /* offset 0 (encode) or inside a short message */
        uint32_t off = (fz_rand() & 1) ? 0 : fz_rand() % 600;
        for (i = 0; i < 4; i++) {
            f[TT_HDR_LEN + 4 + i] = (uint8_t)(off >> (8 * i));
        }
    }
    crc = tt_crc32_update(0, f, TT_HDR_LEN + plen);
    for (i = 0; i < 4; i++) {
        f[TT_HDR_LEN + plen + i] = (uint8_t)(crc >> (8 * i));
    }
    return TT_HDR_LEN + plen + TT_CRC_LEN;
}

typedef struct { uint8_t *p; uint32_t n; } fz_buf;

static void fz_buf_put(void *ctx, uint8_t c)
{
    fz_buf *b = (fz_buf *)ctx;
    b->p[b->n++] = c;
}

int main(int argc, char **argv)
{
    static uint8_t raw[2 * TT_FRAME_MAX], wire[4 * TT_FRAME_MAX];
    unsigned long iters = argc > 2 ? strtoul(argv[2], NULL, 10) : 200000ul, it;
    fz_rng = argc > 1 ? (uint32_t)strtoul(argv[1], NULL, 10) | 1u : 1u;
    for (it = 0; it < iters; it++) {
        uint32_t n = fz_valid_frame(raw), mode = fz_rand() % 8, k;
        fz_buf w;
        w.p = wire;
        w.n = 0;
        if (mode == 0) { /* flip bits */
            for (k = 1 + fz_rand() % 3; k > 0; k--) {
                raw[fz_rand() % n] ^= (uint8_t)(1u << (fz_rand() % 8));
            }
        } else if (mode == 1) { /* truncate */
            n = fz_rand() % n;
        } else if (mode == 2) { /* overlong: extend with junk past the receive buffer */
            uint32_t extra = fz_rand() % (TT_FRAME_MAX + 8);
            for (k = 0; k < extra && n < sizeof raw; k++) {
                raw[n++] = (uint8_t)fz_rand();
            }
        }
        if (mode == 3) { /* raw junk, delimiters included */
            for (k = fz_rand() % 300; k > 0; k--) {
                wire[w.n++] = (uint8_t)(fz_rand() % 5 == 0 ? 0 : fz_rand());
            }
        } else {
            tt_cobs_encode(raw, n, fz_buf_put, &w);
            if (mode == 4 && w.n > 0) { /* corrupt the encoding itself */
                wire[fz_rand() % w.n] = (uint8_t)fz_rand();
            }
        }
        (void)LLVMFuzzerTestOneInput(wire, w.n);
    }
    printf("fuzz ok: %lu inputs, %lu device frames checked, %lu replies; errors by code:", iters,
           fz_frames_out, fz_replies);
    for (it = 1; it <= TT_ERR_MODEL; it++) {
        printf(" %lu", fz_errors[it]);
    }
    printf("\n");
    return 0;
}
#endif
