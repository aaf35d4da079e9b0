/**
 * tt_cobs.h — Consistent Overhead Byte Stuffing: frames on the wire contain no 0x00 except the
 * delimiter that ends each frame. Encoder streams to a byte sink (no output buffer needed);
 * decoder takes one byte at a time into a caller-owned buffer and never writes past its capacity.
 */
#ifndef TT_COBS_H
#define TT_COBS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** Upper bound of the encoded size of n bytes (without the 0x00 delimiter). */
#define TT_COBS_MAX_ENCODED(n) ((n) + (n) / 254u + 1u)

/** Byte sink: receives the encoded bytes in order. */
typedef void (*tt_cobs_put_fn)(void *ctx, uint8_t c);

/**
 * Encode src[0..n) and hand each encoded byte to put (no delimiter is written). A block of 254
 * non-zero bytes that ends the data is not followed by an extra 0x01 code (the usual convention;
 * the decoder accepts both forms). Returns the number of bytes emitted.
 */
uint32_t tt_cobs_encode(const uint8_t *src, uint32_t n, tt_cobs_put_fn put, void *ctx);

/** Decoder state; fields are private. */
typedef struct tt_cobs_decoder {
    uint8_t *buf;      /* decoded bytes of the current frame */
    uint32_t cap;      /* capacity of buf */
    uint32_t len;      /* decoded bytes so far */
    uint32_t raw;      /* encoded bytes seen in the current frame */
    uint8_t left;      /* data bytes still expected in the current block */
    uint8_t zero;      /* 1: a 0x00 is owed before the next block */
    uint8_t overflow;  /* 1: frame exceeded cap; bytes are dropped until the delimiter */
} tt_cobs_decoder;

enum {
    TT_COBS_MORE = 0,          /* byte consumed, frame not finished (also: empty frame ignored) */
    TT_COBS_FRAME = 1,         /* delimiter seen: buf[0..len) holds a complete decoded frame */
    TT_COBS_ERR_OVERFLOW = -1, /* delimiter seen: the frame was longer than cap, discarded */
    TT_COBS_ERR_TRUNCATED = -2 /* delimiter seen inside a block: malformed frame, discarded */
};

/** Start decoding into buf[0..cap). */
void tt_cobs_decoder_init(tt_cobs_decoder *d, uint8_t *buf, uint32_t cap);

/** Feed one byte from the wire; returns one of the TT_COBS_* codes. Total on every input. */
int tt_cobs_decode_byte(tt_cobs_decoder *d, uint8_t b);

#ifdef __cplusplus
}
#endif

#endif /* TT_COBS_H */
