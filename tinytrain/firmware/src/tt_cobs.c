/** COBS encoder (streaming) and byte-at-a-time decoder; see tt_cobs.h for the contract. */
#include "tt_cobs.h"

uint32_t tt_cobs_encode(const uint8_t *src, uint32_t n, tt_cobs_put_fn put, void *ctx)
{
    uint32_t i = 0, out = 0;
    for (;;) {
        uint32_t j = i, k;
        while (j < n && src[j] != 0 && j - i < 254u) {
            j++;
        }
        put(ctx, (uint8_t)(j - i + 1u));
        for (k = i; k < j; k++) {
            put(ctx, src[k]);
        }
        out += j - i + 1u;
        if (j >= n) {
            return out;
        }
        /* a full 254-byte block implies no zero; otherwise src[j] is the zero the code stood for */
        i = (j - i == 254u) ? j : j + 1u;
    }
}

static void tt_cobs_restart(tt_cobs_decoder *d)
{
    d->len = 0;
    d->raw = 0;
    d->left = 0;
    d->zero = 0;
    d->overflow = 0;
}

void tt_cobs_decoder_init(tt_cobs_decoder *d, uint8_t *buf, uint32_t cap)
{
    d->buf = buf;
    d->cap = cap;
    tt_cobs_restart(d);
}

static void tt_cobs_emit(tt_cobs_decoder *d, uint8_t b)
{
    if (d->len < d->cap) {
        d->buf[d->len++] = b;
    } else {
        d->overflow = 1;
    }
}

int tt_cobs_decode_byte(tt_cobs_decoder *d, uint8_t b)
{
    if (b == 0) {
        int rc;
        if (d->raw == 0) {
            rc = TT_COBS_MORE; /* back-to-back delimiters: an empty frame, used to resync */
        } else if (d->overflow) {
            rc = TT_COBS_ERR_OVERFLOW;
        } else if (d->left != 0) {
            rc = TT_COBS_ERR_TRUNCATED;
        } else {
            rc = TT_COBS_FRAME; /* the zero owed by the last block is the implicit trailing one */
        }
        {
            uint32_t len = d->len;
            tt_cobs_restart(d);
            d->len = (rc == TT_COBS_FRAME) ? len : 0;
        }
        return rc;
    }
    if (d->raw == 0) {
        d->len = 0; /* first byte of a new frame: the previous frame's length was kept until now */
    }
    d->raw++;
    if (d->left == 0) { /* b is a code byte */
        if (d->zero) {
            tt_cobs_emit(d, 0);
        }
        d->left = (uint8_t)(b - 1u);
        d->zero = (uint8_t)(b != 0xFFu);
    } else {
        tt_cobs_emit(d, b);
        d->left--;
    }
    return TT_COBS_MORE;
}
