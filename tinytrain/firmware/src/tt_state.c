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

uint32_t tt_state_hash(const tt_spans *t)
{
    uint32_t i, crc = 0;
    for (i = 0; i < t->n; i++)
        crc = tt_crc32_update(crc, (const uint8_t *)t->span[i].p, t->span[i].bytes);
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
            if (!write) {
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
