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

/* ---- sparse spans (tt_span.mask, tt_span.code): the dense row-major view of a packed tensor ---- */

/* The mask bit of w[n][k] of a sparse span (S = ceil(rows / 32) words per column) and its word. */
static uint32_t tt_state_word(const tt_span *s, uint32_t n, uint32_t k)
{
    return k * ((s->rows + 31u) / 32u) + n / 32u;
}

/* Stored by rows (s->code): whether w[n][k] is pruned, and *rank the kept elements before it in
 * row-major order (its packed index when kept). */
static uint32_t tt_state_blocks_find(const tt_span *s, uint32_t n, uint32_t k, uint32_t *rank);

static uint32_t tt_state_rows_find(const tt_span *s, uint32_t n, uint32_t k, uint32_t *rank)
{
    const uint8_t *st = s->code + 2u * s->rows, *end;
    uint32_t i, r = 0;
    int32_t c = -1;
    if (s->blocks) return tt_state_blocks_find(s, n, k, rank);
    for (i = 0; i < n; i++) {
        st += s->code[2u * i];
        r += s->code[2u * i + 1u];
    }
    for (end = st + s->code[2u * n]; st < end; st++) {
        const uint32_t b = *st, hi = b >> 4;
        if (!b) {
            c += 15;
            continue;
        }
        c += (int32_t)(b & 15u);
        if (c >= (int32_t)k) break;
        r++;
        if (hi) {
            c += (int32_t)hi;
            if (c >= (int32_t)k) break;
            r++;
        }
    }
    *rank = r;
    return c != (int32_t)k;
}

/* Stored by blocks (s->blocks, tt_sparse_blocks.h): the same; the kept weights of a block j,
 * min(4, cols - 4 j). */
static uint32_t tt_state_blocks_find(const tt_span *s, uint32_t n, uint32_t k, uint32_t *rank)
{
    const uint8_t *st = s->code + s->rows;
    const uint32_t C = s->cols;
    uint32_t i, j, r = 0;
    for (i = 0; i <= n; i++)
        for (j = 0; j < s->code[i]; j++, st++) {
            const uint32_t a = 4u * *st, m = C - a < 4u ? C - a : 4u;
            if (i == n && k < a + m) {
                *rank = r + (k >= a ? k - a : 0u);
                return k < a;
            }
            r += m;
        }
    *rank = r;
    return 1;
}

static uint32_t tt_state_bit(const tt_span *s, uint32_t n, uint32_t k)
{
    uint32_t r;
    if (s->code) return tt_state_rows_find(s, n, k, &r);
    return (s->mask[tt_state_word(s, n, k)] >> (n % 32u)) & 1u;
}

/* Kept (clear) bits before that of w[n][k] (the padding bits are set): its packed index. */
static uint32_t tt_state_rank(const tt_span *s, uint32_t n, uint32_t k)
{
    const uint32_t q = tt_state_word(s, n, k);
    uint32_t wi, w, c = 0;
    if (s->code) {
        (void)tt_state_rows_find(s, n, k, &c);
        return c;
    }
    for (wi = 0; wi < q; wi++)
        for (w = ~s->mask[wi]; w; w &= w - 1u) c++;
    for (w = ~s->mask[q] & ((1u << (n % 32u)) - 1u); w; w &= w - 1u) c++;
    return c;
}

/* Byte pos of a sparse span's view; *pruned: it is a byte of a pruned element (elem != 0). */
static uint8_t tt_state_view(const tt_span *s, uint32_t pos, int *pruned)
{
    const uint32_t R = s->rows, C = s->cols;
    *pruned = 0;
    if (s->elem == 0) { /* the mask, row-major: bit i = element (i / C, i % C) */
        uint32_t j, v = 0;
        for (j = 0; j < 8u && pos * 8u + j < R * C; j++) {
            const uint32_t i = pos * 8u + j;
            v |= tt_state_bit(s, i / C, i % C) << j;
        }
        return (uint8_t)v;
    }
    {
        const uint32_t i = pos / s->elem;
        if (tt_state_bit(s, i / C, i % C)) {
            *pruned = 1;
            return 0;
        }
        return ((const uint8_t *)s->p)[tt_state_rank(s, i / C, i % C) * s->elem + pos % s->elem];
    }
}

/* What tt_state_io does: read, check a write (store nothing), or store a checked write. */
enum { TT_STATE_READ = 0, TT_STATE_CHECK = 1, TT_STATE_STORE = 2 };

/* Bytes [off, off + k) of a sparse span's view to dst, or (check, store) from src: 0, or -1 when
 * src differs from the view where it cannot be written (the mask; a pruned element's zeros;
 * every byte of a read-only span: frozen weights packed in flash). */
static int tt_state_sparse_io(const tt_span *s, uint32_t off, uint8_t *dst, const uint8_t *src,
                              uint32_t k, int mode)
{
    uint32_t j;
    for (j = 0; j < k; j++) {
        int pruned;
        const uint8_t v = tt_state_view(s, off + j, &pruned);
        if (mode == TT_STATE_READ) {
            dst[j] = v;
        } else if (s->elem == 0 || pruned || s->ro) { /* the mask, a pruned zero, a frozen value in flash */
            if (src[j] != v) return -1;
        } else if (mode == TT_STATE_STORE) {
            const uint32_t i = (off + j) / s->elem;
            ((uint8_t *)s->p)[tt_state_rank(s, i / s->cols, i % s->cols) * s->elem + (off + j) % s->elem] = src[j];
        }
    }
    return 0;
}

uint32_t tt_state_hash(const tt_spans *t)
{
    uint32_t i, crc = 0;
    for (i = 0; i < t->n; i++) {
        const tt_span *s = &t->span[i];
        uint32_t off;
        if (!s->mask && !s->code && s->p) {
            crc = tt_crc32_update(crc, (const uint8_t *)s->p, s->bytes);
            continue;
        }
        for (off = 0; off < s->bytes; off += 32u) { /* the view (a zero span: zeros), 32 bytes at a time */
            uint8_t buf[32];
            const uint32_t k = s->bytes - off < 32u ? s->bytes - off : 32u;
            if (s->p) (void)tt_state_sparse_io(s, off, buf, 0, k, TT_STATE_READ);
            else memset(buf, 0, k);
            crc = tt_crc32_update(crc, buf, k);
        }
    }
    return crc;
}

/* Whether writing src over bytes [off, off + k) of a symmetric span would leave its minimum
 * (-128 / -32768) in an element: each element the range touches, its bytes from src where the
 * range covers them, else as the span holds them (its view). */
static int tt_state_sym_bad(const tt_span *s, uint32_t off, const uint8_t *src, uint32_t k)
{
    const uint32_t w = s->sym;
    uint32_t i;
    for (i = off / w; i * w < off + k; i++) {
        uint8_t b[2];
        uint32_t j;
        for (j = 0; j < w; j++) {
            const uint32_t pos = i * w + j;
            int pruned;
            b[j] = pos >= off && pos - off < k ? src[pos - off]
                   : (s->mask || s->code) ? tt_state_view(s, pos, &pruned) : ((const uint8_t *)s->p)[pos];
        }
        if (b[w - 1u] == 0x80u && (w == 1u || b[0] == 0u)) return 1;
    }
    return 0;
}

/* Walk the spans covering [off, off + n): copy to dst (read), or check src (a read-only span
 * must already hold src's bytes, a symmetric one must not receive its minimum), or store src. */
static int tt_state_io(const tt_spans *t, uint32_t off, uint8_t *dst, const uint8_t *src,
                       uint32_t n, int mode)
{
    const uint32_t size = tt_state_size(t);
    uint32_t i;
    if (off > size || n > size - off) return -1;
    for (i = 0; i < t->n && n > 0; i++) {
        const tt_span *s = &t->span[i];
        if (off < s->bytes) {
            const uint32_t k = s->bytes - off < n ? s->bytes - off : n;
            if (mode == TT_STATE_CHECK && s->sym && tt_state_sym_bad(s, off, src, k)) return -1;
            if (s->mask || s->code) {
                if (tt_state_sparse_io(s, off, dst, src, k, mode) != 0) return -1;
                if (mode == TT_STATE_READ) dst += k; else src += k;
            } else if (!s->p) { /* a zero span: reads zeros, a write must give zeros */
                uint32_t j;
                if (mode == TT_STATE_READ) {
                    memset(dst, 0, k);
                    dst += k;
                } else {
                    for (j = 0; j < k; j++)
                        if (src[j]) return -1;
                    src += k;
                }
            } else if (mode == TT_STATE_READ) {
                memcpy(dst, (const uint8_t *)s->p + off, k);
                dst += k;
            } else {
                if (s->ro) {
                    if (memcmp((const uint8_t *)s->p + off, src, k) != 0) return -1;
                } else if (mode == TT_STATE_STORE) {
                    memcpy((uint8_t *)s->p + off, src, k);
                }
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
    return tt_state_io(t, off, dst, 0, n, TT_STATE_READ);
}

int tt_state_write(const tt_spans *t, uint32_t off, const uint8_t *src, uint32_t n)
{
    if (tt_state_io(t, off, 0, src, n, TT_STATE_CHECK) != 0) return -1; /* nothing written */
    return tt_state_io(t, off, 0, src, n, TT_STATE_STORE);
}

int tt_state_get_tensor(const tt_spans *t, uint32_t id, uint32_t off, uint8_t *dst, uint32_t n,
                        uint32_t *total)
{
    if (id >= t->n) return -1;
    *total = t->span[id].bytes;
    if (off > *total || n > *total - off) return -1;
    if (t->span[id].mask || t->span[id].code) return tt_state_sparse_io(&t->span[id], off, dst, 0, n, TT_STATE_READ);
    if (!t->span[id].p) memset(dst, 0, n); /* a zero span */
    else if (n) memcpy(dst, (const uint8_t *)t->span[id].p + off, n);
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
