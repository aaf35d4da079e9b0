/**
 * The federated update codec on the device (tt_fedcodec.h): bit-identical to
 * tinytrain/federated/codec.py. Values are processed in chunks of TT_FED_CHUNK elements read
 * from the live state blob, so the only RAM is the caller's snapshot, residual and shifts.
 */
#include <string.h>

#include "tt_crc32.h"
#include "tt_device.h"
#include "tt_fedcodec.h"

#define TT_FED_CHUNK 16u /* elements per pass step; a multiple of 8 (one sign byte) */

/* Little-endian two's-complement element of width 1, 2 or 4, sign-extended without relying on
 * implementation-defined conversions. */
static int64_t tt_fed_get(const uint8_t *p, uint32_t w)
{
    uint32_t u = p[0], i;
    for (i = 1; i < w; i++) {
        u |= (uint32_t)p[i] << (8u * i);
    }
    if (w < 4u) {
        uint32_t top = 1u << (8u * w - 1u);
        return (int64_t)(u & (top - 1u)) - (int64_t)(u & top);
    }
    return (int64_t)(u & 0x7FFFFFFFu) - (int64_t)(u & 0x80000000u);
}

static void tt_fed_put(uint8_t *p, uint32_t w, int64_t v)
{
    uint64_t u = (uint64_t)v;
    uint32_t i;
    for (i = 0; i < w; i++) {
        p[i] = (uint8_t)(u >> (8u * i));
    }
}

/* floor(v / 2^s): arithmetic shift written without right-shifting a negative value. */
static int64_t tt_fed_asr(int64_t v, uint32_t s)
{
    return v >= 0 ? v >> s : ~(~v >> s);
}

/* fixedpoint.rshift_round: nearest, ties toward +inf; s == 0 returns v. */
static int64_t tt_fed_rshift_round(int64_t v, uint32_t s)
{
    if (s == 0u) {
        return v;
    }
    return tt_fed_asr(v, s) + (tt_fed_asr(v, s - 1u) & 1);
}

static uint64_t tt_fed_abs(int64_t v)
{
    return v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
}

/* fixedpoint.bitwidth: bits of x (0 for 0). */
static uint32_t tt_fed_bitwidth(uint64_t x)
{
    uint32_t n = 0;
    while (x != 0u) {
        x >>= 1;
        n++;
    }
    return n;
}

/* codec._bounds: int8 and int16 are symmetric (±127, ±32767), int32 the full range. */
static int64_t tt_fed_sat(int64_t y, uint32_t w)
{
    int64_t hi = w == 1u ? 127 : w == 2u ? 32767 : (int64_t)INT32_MAX;
    int64_t lo = w == 4u ? (int64_t)INT32_MIN : -hi;
    return y < lo ? lo : y > hi ? hi : y;
}

/* sign and signmv encode alike (signmv differs only in the coordinator's aggregation) */
static int tt_fed_is_sign(uint32_t codec)
{
    return codec == TT_FED_SIGN || codec == TT_FED_SIGNMV;
}

static uint32_t tt_fed_per_byte(uint32_t codec)
{
    return codec == TT_FED_INT8 ? 1u : codec == TT_FED_INT4 ? 2u : 8u;
}

static uint32_t tt_fed_data_bytes(const tt_fedcodec *c, uint32_t ti)
{
    uint32_t epb = tt_fed_per_byte(c->codec);
    if (tt_fed_is_sign(c->codec) && c->shift[ti] == TT_FED_ZERO_SHIFT) {
        return 0u;
    }
    return (c->t[ti].count + epb - 1u) / epb;
}

uint32_t tt_fedcodec_store_bytes(const tt_fed_tensor *t, uint32_t n_tensors)
{
    uint32_t i, s = 0;
    for (i = 0; i < n_tensors; i++) {
        s += t[i].count * t[i].width;
    }
    return s;
}

uint32_t tt_fedcodec_n_params(const tt_fed_tensor *t, uint32_t n_tensors)
{
    uint32_t i, s = 0;
    for (i = 0; i < n_tensors; i++) {
        s += t[i].count;
    }
    return s;
}

/* Residual element i, kept in res_width bytes (8, 4 or 2). */
static int64_t tt_fed_res_get(const tt_fedcodec *c, uint32_t i)
{
    if (c->res_width == 8u) {
        return ((const int64_t *)c->residual)[i];
    }
    if (c->res_width == 4u) {
        return ((const int32_t *)c->residual)[i];
    }
    return ((const int16_t *)c->residual)[i];
}

/* Store residual element i, saturated to the width's two's-complement range (counted). */
static void tt_fed_res_set(tt_fedcodec *c, uint32_t i, int64_t v)
{
    if (c->res_width == 8u) {
        ((int64_t *)c->residual)[i] = v;
        return;
    }
    {
        int64_t hi = c->res_width == 4u ? (int64_t)INT32_MAX : (int64_t)INT16_MAX;
        int64_t lo = -hi - 1;
        if (v > hi || v < lo) {
            v = v > hi ? hi : lo;
            c->res_saturated++;
        }
    }
    if (c->res_width == 4u) {
        ((int32_t *)c->residual)[i] = (int32_t)v;
    } else {
        ((int16_t *)c->residual)[i] = (int16_t)v;
    }
}

static void tt_fed_res_zero(tt_fedcodec *c)
{
    memset(c->residual, 0, (size_t)tt_fedcodec_n_params(c->t, c->n_tensors) * c->res_width);
}

/* Where tensor ti starts in the snapshot (bytes) and in the residual (elements). */
static void tt_fed_base(const tt_fedcodec *c, uint32_t ti, uint32_t *gbyte, uint32_t *relem)
{
    uint32_t i;
    *gbyte = 0;
    *relem = 0;
    for (i = 0; i < ti; i++) {
        *gbyte += c->t[i].count * c->t[i].width;
        *relem += c->t[i].count;
    }
}

/* v = (x - g) + r and g for elements [e, e + n) of tensor ti (n <= TT_FED_CHUNK). */
static int tt_fed_load(const tt_fedcodec *c, uint32_t ti, uint32_t e, uint32_t n, int64_t *v, int64_t *g)
{
    const tt_fed_tensor *t = &c->t[ti];
    uint8_t buf[TT_FED_CHUNK * 4u];
    uint32_t gb, rb, i, w = t->width;
    tt_fed_base(c, ti, &gb, &rb);
    if (c->read(t->offset + e * w, buf, n * w) != 0) {
        return TT_ERR_RANGE;
    }
    for (i = 0; i < n; i++) {
        g[i] = tt_fed_get(c->global + gb + (e + i) * w, w);
        v[i] = tt_fed_get(buf + i * w, w) - g[i] + tt_fed_res_get(c, rb + e + i);
    }
    return TT_OK;
}

/* The quantized value of v under shift s (0 for a zero sign tensor). */
static int64_t tt_fed_q(uint32_t codec, uint32_t s, int64_t v)
{
    int64_t q, qmax;
    if (tt_fed_is_sign(codec)) {
        return s == TT_FED_ZERO_SHIFT ? 0 : (v >= 0 ? 1 : -1);
    }
    qmax = codec == TT_FED_INT8 ? 127 : 7;
    q = tt_fed_rshift_round(v, s);
    return q > qmax ? qmax : q < -qmax ? -qmax : q;
}

/* The reconstructed value sat(g + q * 2^s). */
static int64_t tt_fed_y(uint32_t s, int64_t q, int64_t g, uint32_t w)
{
    return tt_fed_sat(g + q * ((int64_t)1 << (s == TT_FED_ZERO_SHIFT ? 0u : s)), w);
}

/* Pass 1: the shift of every tensor. */
static int tt_fed_shifts(tt_fedcodec *c)
{
    int64_t v[TT_FED_CHUNK], g[TT_FED_CHUNK];
    uint32_t ti, e, i, n;
    for (ti = 0; ti < c->n_tensors; ti++) {
        uint64_t acc = 0; /* int8/int4: max |v|; sign: sum |v| */
        uint32_t count = c->t[ti].count;
        for (e = 0; e < count; e += n) {
            int rc;
            n = count - e < TT_FED_CHUNK ? count - e : TT_FED_CHUNK;
            rc = tt_fed_load(c, ti, e, n, v, g);
            if (rc != TT_OK) {
                return rc;
            }
            for (i = 0; i < n; i++) {
                uint64_t a = tt_fed_abs(v[i]);
                if (tt_fed_is_sign(c->codec)) {
                    acc += a;
                } else if (a > acc) {
                    acc = a;
                }
            }
        }
        if (tt_fed_is_sign(c->codec)) {
            uint64_t mean = acc / (count > 0u ? count : 1u);
            c->shift[ti] = (uint8_t)(mean == 0u ? TT_FED_ZERO_SHIFT : tt_fed_bitwidth(mean) - 1u);
        } else {
            uint32_t bw = tt_fed_bitwidth(acc), keep = c->codec == TT_FED_INT8 ? 7u : 3u;
            c->shift[ti] = (uint8_t)(bw > keep ? bw - keep : 0u);
        }
    }
    return TT_OK;
}

/* Pass 2 (hash = 1): CRC-32 of the reconstructed store. Commit (hash = 0): r = v - (y - g). */
static int tt_fed_reconstruct(tt_fedcodec *c, int hash, uint32_t *crc)
{
    int64_t v[TT_FED_CHUNK], g[TT_FED_CHUNK];
    uint8_t buf[TT_FED_CHUNK * 4u];
    uint32_t ti, e, i, n, gb, rb;
    *crc = 0;
    for (ti = 0; ti < c->n_tensors; ti++) {
        uint32_t count = c->t[ti].count, w = c->t[ti].width, s = c->shift[ti];
        tt_fed_base(c, ti, &gb, &rb);
        for (e = 0; e < count; e += n) {
            int rc;
            n = count - e < TT_FED_CHUNK ? count - e : TT_FED_CHUNK;
            rc = tt_fed_load(c, ti, e, n, v, g);
            if (rc != TT_OK) {
                return rc;
            }
            for (i = 0; i < n; i++) {
                int64_t y = tt_fed_y(s, tt_fed_q(c->codec, s, v[i]), g[i], w);
                if (hash) {
                    tt_fed_put(buf + i * w, w, y);
                } else {
                    tt_fed_res_set(c, rb + e + i, v[i] - (y - g[i]));
                }
            }
            if (hash) {
                *crc = tt_crc32_update(*crc, buf, n * w);
            }
        }
    }
    return TT_OK;
}

/* Data bytes [k0, k1) of tensor ti. */
static int tt_fed_data(const tt_fedcodec *c, uint32_t ti, uint32_t k0, uint32_t k1, uint8_t *dst)
{
    int64_t v[TT_FED_CHUNK], g[TT_FED_CHUNK];
    uint32_t epb = tt_fed_per_byte(c->codec), count = c->t[ti].count, s = c->shift[ti];
    uint32_t k = k0, b, j;
    while (k < k1) {
        uint32_t e = k * epb, nb = k1 - k, ne;
        int rc;
        if (nb > TT_FED_CHUNK / epb) {
            nb = TT_FED_CHUNK / epb;
        }
        ne = count - e < nb * epb ? count - e : nb * epb;
        rc = tt_fed_load(c, ti, e, ne, v, g);
        if (rc != TT_OK) {
            return rc;
        }
        for (b = 0; b < nb; b++) {
            uint32_t byte = 0;
            for (j = 0; j < epb && b * epb + j < ne; j++) {
                int64_t q = tt_fed_q(c->codec, s, v[b * epb + j]);
                if (c->codec == TT_FED_INT8) {
                    byte = (uint32_t)((uint64_t)q & 0xFFu);
                } else if (c->codec == TT_FED_INT4) {
                    byte |= (uint32_t)((uint64_t)q & 0xFu) << (4u * j);
                } else {
                    byte |= (uint32_t)(q > 0) << j;
                }
            }
            dst[k - k0 + b] = (uint8_t)byte;
        }
        k += nb;
    }
    return TT_OK;
}

/* Copy the overlap of the message range [off, end) with region [a, a + len) of `src`. */
static void tt_fed_overlap(uint8_t *dst, uint32_t off, uint32_t end, uint32_t a, const uint8_t *src,
                           uint32_t len)
{
    uint32_t lo = off > a ? off : a, hi = end < a + len ? end : a + len;
    if (lo < hi) {
        memcpy(dst + (lo - off), src + (lo - a), hi - lo);
    }
}

/* Message bytes [off, off + n), header and body only (the caller handles the trailing CRC). */
static int tt_fed_emit(const tt_fedcodec *c, uint32_t off, uint8_t *dst, uint32_t n)
{
    uint8_t h[TT_FED_HEADER_BYTES];
    uint32_t end = off + n, pos = TT_FED_HEADER_BYTES, ti;
    h[0] = (uint8_t)TT_FED_VERSION;
    h[1] = (uint8_t)c->codec;
    h[2] = h[3] = 0;
    tt_fed_put(h + 4, 4, c->device);
    tt_fed_put(h + 8, 4, c->round);
    tt_fed_put(h + 12, 4, c->n_samples);
    tt_fed_put(h + 16, 4, c->hash);
    tt_fed_put(h + 20, 4, c->step);
    tt_fed_put(h + 24, 2, c->n_tensors);
    tt_fed_overlap(dst, off, end, 0, h, TT_FED_HEADER_BYTES);
    for (ti = 0; ti < c->n_tensors && pos < end; ti++) {
        uint8_t s = c->shift[ti];
        uint32_t db = tt_fed_data_bytes(c, ti), lo, hi;
        tt_fed_overlap(dst, off, end, pos, &s, 1);
        pos += 1u;
        lo = off > pos ? off - pos : 0u;
        hi = end - pos < db ? end - pos : db;
        if (end > pos && lo < hi) {
            int rc = tt_fed_data(c, ti, lo, hi, dst + (pos + lo - off));
            if (rc != TT_OK) {
                return rc;
            }
        }
        pos += db;
    }
    return TT_OK;
}

/* Shifts, hash, length and CRC of the message for the live state. */
static int tt_fed_encode(tt_fedcodec *c, uint32_t *len, uint32_t *crc)
{
    uint8_t buf[32];
    uint32_t ti, body = 0, off;
    int rc = tt_fed_shifts(c);
    if (rc == TT_OK) {
        rc = tt_fed_reconstruct(c, 1, &c->hash);
    }
    if (rc != TT_OK) {
        return rc;
    }
    for (ti = 0; ti < c->n_tensors; ti++) {
        body += 1u + tt_fed_data_bytes(c, ti);
    }
    *len = TT_FED_HEADER_BYTES + body + 4u;
    *crc = 0;
    for (off = 0; off < *len - 4u; off += sizeof buf) {
        uint32_t n = *len - 4u - off < sizeof buf ? *len - 4u - off : (uint32_t)sizeof buf;
        rc = tt_fed_emit(c, off, buf, n);
        if (rc != TT_OK) {
            return rc;
        }
        *crc = tt_crc32_update(*crc, buf, n);
    }
    return TT_OK;
}

void tt_fedcodec_init(tt_fedcodec *c, const tt_fed_tensor *t, uint32_t n_tensors, tt_fed_read_fn read,
                      uint8_t *global, void *residual, uint32_t residual_width, uint8_t *shift)
{
    memset(c, 0, sizeof *c);
    c->t = t;
    c->n_tensors = n_tensors;
    c->read = read;
    c->global = global;
    c->residual = residual;
    c->shift = shift;
    c->res_width = residual_width == 4u || residual_width == 2u ? residual_width : 8u;
    tt_fed_res_zero(c);
    memset(shift, 0, n_tensors);
}

int tt_fedcodec_begin(tt_fedcodec *c, uint32_t codec, uint32_t round, uint32_t device)
{
    uint32_t ti, gb = 0;
    if (codec > TT_FED_SIGN && codec != TT_FED_SIGNMV) {
        return TT_ERR_RANGE;
    }
    for (ti = 0; ti < c->n_tensors; ti++) {
        uint32_t bytes = c->t[ti].count * c->t[ti].width;
        if (c->read(c->t[ti].offset, c->global + gb, bytes) != 0) {
            c->open = 0; /* the snapshot is partial: no update until a successful begin */
            c->prepared = 0;
            return TT_ERR_RANGE;
        }
        gb += bytes;
    }
    if (codec != c->res_codec) {
        tt_fed_res_zero(c);
        c->res_codec = codec;
    }
    c->codec = codec;
    c->round = round;
    c->device = device;
    c->open = 1;
    c->prepared = 0;
    return TT_OK;
}

uint32_t tt_fedcodec_global_hash(const tt_fedcodec *c)
{
    return tt_crc32_update(0, c->global, tt_fedcodec_store_bytes(c->t, c->n_tensors));
}

uint32_t tt_fedcodec_residual_crc(const tt_fedcodec *c)
{
    uint8_t b[8];
    uint32_t i, n = tt_fedcodec_n_params(c->t, c->n_tensors), crc = 0;
    for (i = 0; i < n; i++) {
        tt_fed_put(b, 8, tt_fed_res_get(c, i));
        crc = tt_crc32_update(crc, b, 8);
    }
    return crc;
}

int tt_fedcodec_prepare(tt_fedcodec *c, uint32_t n_samples, uint32_t step, uint32_t *len, uint32_t *crc)
{
    int rc;
    if (!c->open || c->codec == TT_FED_NONE) {
        return TT_ERR_SEQUENCE;
    }
    c->n_samples = n_samples;
    c->step = step;
    c->prepared = 0;
    rc = tt_fed_encode(c, &c->msg_len, &c->crc);
    if (rc != TT_OK) {
        return rc;
    }
    c->prepared = 1;
    *len = c->msg_len;
    *crc = c->crc;
    return TT_OK;
}

int tt_fedcodec_read(const tt_fedcodec *c, uint32_t off, uint8_t *dst, uint32_t n)
{
    uint8_t tail[4];
    uint32_t body_end;
    int rc;
    if (!c->prepared) {
        return TT_ERR_SEQUENCE;
    }
    if (off > c->msg_len || n > c->msg_len - off) {
        return TT_ERR_RANGE;
    }
    body_end = c->msg_len - 4u;
    if (off < body_end) {
        rc = tt_fed_emit(c, off, dst, (off + n < body_end ? off + n : body_end) - off);
        if (rc != TT_OK) {
            return rc;
        }
    }
    tt_fed_put(tail, 4, c->crc);
    tt_fed_overlap(dst, off, off + n, body_end, tail, 4);
    return TT_OK;
}

int tt_fedcodec_ack(tt_fedcodec *c, uint32_t round, uint32_t crc, uint32_t accepted, uint32_t *status)
{
    uint32_t len, now, unused;
    int rc;
    if (round != c->round) {
        return TT_ERR_RANGE;
    }
    if (!c->open) {
        *status = TT_FED_CLOSED;
        return TT_OK;
    }
    if (!accepted) {
        c->open = 0;
        c->prepared = 0;
        *status = TT_FED_KEPT;
        return TT_OK;
    }
    if (!c->prepared) {
        return TT_ERR_SEQUENCE;
    }
    /* the residual must belong to the message the coordinator used: encode the live state again */
    rc = tt_fed_encode(c, &len, &now);
    if (rc != TT_OK) {
        return rc;
    }
    if (now != crc || now != c->crc || len != c->msg_len) {
        c->prepared = 0; /* the shifts now describe the live state, not the message sent */
        return TT_ERR_BLOB_CRC;
    }
    rc = tt_fed_reconstruct(c, 0, &unused);
    if (rc != TT_OK) {
        return rc;
    }
    c->open = 0;
    c->prepared = 0;
    *status = TT_FED_COMMITTED;
    return TT_OK;
}

int tt_fedcodec_prox(tt_fedcodec *c, tt_fed_write_fn write, uint32_t mult, uint32_t shift)
{
    uint8_t buf[TT_FED_CHUNK * 4u];
    uint32_t ti, e, i, n, gb, rb;
    if (!c->open) {
        return TT_ERR_SEQUENCE;
    }
    if (mult >= 32768u || shift > 62u) {
        return TT_ERR_RANGE;
    }
    c->prepared = 0;
    for (ti = 0; ti < c->n_tensors; ti++) {
        const tt_fed_tensor *t = &c->t[ti];
        uint32_t w = t->width;
        tt_fed_base(c, ti, &gb, &rb);
        for (e = 0; e < t->count; e += n) {
            int moved = 0;
            n = t->count - e < TT_FED_CHUNK ? t->count - e : TT_FED_CHUNK;
            if (c->read(t->offset + e * w, buf, n * w) != 0) {
                return TT_ERR_RANGE;
            }
            for (i = 0; i < n; i++) {
                int64_t x = tt_fed_get(buf + i * w, w);
                int64_t d = x - tt_fed_get(c->global + gb + (e + i) * w, w);
                int64_t pull = tt_fed_rshift_round(d * (int64_t)mult, shift);
                if (pull != 0) {
                    tt_fed_put(buf + i * w, w, x - pull);
                    moved = 1;
                }
            }
            if (moved && write(t->offset + e * w, buf, n * w) != 0) {
                return TT_ERR_RANGE;
            }
        }
    }
    return TT_OK;
}

uint32_t tt_fedcodec_residual_saturations(const tt_fedcodec *c)
{
    return c->res_saturated;
}
