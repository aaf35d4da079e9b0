/** The state blob of a generated model: size, hash, read, write, tensors, reset (tt_state.h). */
#include "tt_state.h"

#include <string.h>

#include "tt_crc32.h"

uint32_t tt_state_size(const tt_spans *t)
{
    uint32_t i, s = 0;
    for (i = 0; i < t->n; i++) s += t->span[i].bytes;
    return s;
}

/* Kept elements of a packed span before element i. */
static uint32_t tt_state_rank(const uint32_t *mask, uint32_t i)
{
    uint32_t wi, w, c = 0;
    for (wi = 0; wi < i / 32u; wi++)
        for (w = ~mask[wi]; w; w &= w - 1u) c++;
    if (i % 32u)
        for (w = ~mask[i / 32u] & ((1u << (i % 32u)) - 1u); w; w &= w - 1u) c++;
    return c;
}

/* Bytes [off, off + k) of a packed span's dense view: copied to dst (write == 0), or from src
 * into the kept elements (a pruned element's bytes must be 0: else -1). */
static int tt_state_sparse_io(const tt_span *s, uint32_t off, uint8_t *dst, const uint8_t *src,
                              uint32_t k, int write)
{
    const uint32_t eb = s->elem;
    uint32_t i = off / eb, j = off % eb, rank = tt_state_rank(s->mask, i);
    uint8_t *packed = (uint8_t *)s->p;
    while (k > 0) {
        const uint32_t pruned = (s->mask[i / 32u] >> (i % 32u)) & 1u;
        for (; j < eb && k > 0; j++, k--) {
            if (!write) *dst++ = pruned ? 0 : packed[rank * eb + j];
            else if (!pruned) packed[rank * eb + j] = *src++;
            else if (*src++ != 0) return -1;
        }
        rank += !pruned;
        i++;
        j = 0;
    }
    return 0;
}

/* The CRC of a packed span's dense view, run by run: a run of kept elements is contiguous in p,
 * a run of pruned ones is zero bytes. */
static uint32_t tt_state_sparse_hash(uint32_t crc, const tt_span *s)
{
    static const uint8_t zeros[16] = {0};
    const uint32_t n = s->bytes / s->elem;
    const uint8_t *packed = (const uint8_t *)s->p;
    uint32_t i = 0, e, z;
    while (i < n) {
        const uint32_t bit = (s->mask[i / 32u] >> (i % 32u)) & 1u;
        for (e = i + 1u; e < n && ((s->mask[e / 32u] >> (e % 32u)) & 1u) == bit; e++) {}
        if (!bit) {
            crc = tt_crc32_update(crc, packed, (e - i) * s->elem);
            packed += (e - i) * s->elem;
        } else {
            for (z = (e - i) * s->elem; z > 0; z -= z < 16u ? z : 16u)
                crc = tt_crc32_update(crc, zeros, z < 16u ? z : 16u);
        }
        i = e;
    }
    return crc;
}

uint32_t tt_state_hash(const tt_spans *t)
{
    uint32_t i, crc = 0;
    for (i = 0; i < t->n; i++) {
        const tt_span *s = &t->span[i];
        crc = s->mask ? tt_state_sparse_hash(crc, s) : tt_crc32_update(crc, (const uint8_t *)s->p, s->bytes);
    }
    return crc;
}

/* Walk the spans covering [off, off + n): copy to dst (write == 0), or from src (write != 0;
 * a read-only span must already hold src's bytes). */
static int tt_state_io(const tt_spans *t, uint32_t off, uint8_t *dst, const uint8_t *src,
                       uint32_t n, int write)
{
    const uint32_t size = tt_state_size(t);
    uint32_t i;
    if (off > size || n > size - off) return -1;
    for (i = 0; i < t->n && n > 0; i++) {
        const tt_span *s = &t->span[i];
        if (off < s->bytes) {
            const uint32_t k = s->bytes - off < n ? s->bytes - off : n;
            if (s->mask) {
                if (tt_state_sparse_io(s, off, dst, src, k, write) != 0) return -1;
                if (write) src += k; else dst += k;
            } else if (!write) {
                memcpy(dst, (const uint8_t *)s->p + off, k);
                dst += k;
            } else {
                if (!s->ro) memcpy((uint8_t *)s->p + off, src, k);
                else if (memcmp((const uint8_t *)s->p + off, src, k) != 0) return -1;
                src += k;
            }
            n -= k;
            off = 0;
        } else {
            off -= s->bytes;
        }
    }
    return 0;
}

int tt_state_read(const tt_spans *t, uint32_t off, uint8_t *dst, uint32_t n)
{
    return tt_state_io(t, off, dst, 0, n, 0);
}

int tt_state_write(const tt_spans *t, uint32_t off, const uint8_t *src, uint32_t n)
{
    return tt_state_io(t, off, 0, src, n, 1);
}

int tt_state_get_tensor(const tt_spans *t, uint32_t id, uint32_t off, uint8_t *dst, uint32_t n,
                        uint32_t *total)
{
    if (id >= t->n) return -1;
    *total = t->span[id].bytes;
    if (off > *total || n > *total - off) return -1;
    if (t->span[id].mask) return tt_state_sparse_io(&t->span[id], off, dst, 0, n, 0);
    if (n) memcpy(dst, (const uint8_t *)t->span[id].p + off, n);
    return 0;
}

void tt_state_reset(const tt_init *init, uint32_t n)
{
    uint32_t i;
    for (i = 0; i < n; i++) {
        if (init[i].src) memcpy(init[i].dst, init[i].src, init[i].bytes);
        else memset(init[i].dst, 0, init[i].bytes);
    }
}
