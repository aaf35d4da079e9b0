/** The training state of a generated model as a byte blob, model-independent: the generated
 * file holds only its tables (tt_span, tt_init) and one-line wrappers (<prefix>_state_hash...).
 *
 * The state blob is the concatenation of the spans of a table in table order (the model's
 * schema order), each span's bytes as they are in memory (little-endian on every supported
 * target). Offsets and lengths are in bytes; a range is valid when off + n <= the blob size,
 * computed without overflow. */
#ifndef TT_STATE_H
#define TT_STATE_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** One tensor: bytes at p. ro != 0: a read-only tensor (a frozen parameter in flash): it reads
 *  like the others, and a write must leave it unchanged.
 *  mask != NULL: a tensor stored sparse (tt_sparse.h) shown in its dense, row-major view of
 *  bytes bytes: w[rows][cols] whose kept elements (mask bit n % 32 of word k * ceil(rows / 32)
 *  + n / 32 clear) are at p, elem bytes each, in column-major order, the pruned ones reading as zero bytes (a write
 *  must give zeros there); or, elem == 0, the mask itself (p == mask) shown as tt_prune.h's
 *  row-major bitmap (ro: a write must give the same bits).
 *  code != NULL: the same for a tensor stored by rows (tt_sparse_rows.h: code gives the kept
 *  elements, packed at p in row-major order; mask is NULL); elem == 0: the mask (p == code).
 *  blocks != 0: code is a block code (tt_sparse_blocks.h), the kept elements packed the same way.
 *  sym = 1 or 2: the span holds int8 / int16 values (sym bytes each) kept in the symmetric range
 *  [-127, 127] / [-32767, 32767]: a write that would leave -128 / -32768 in it is refused (the
 *  kernels skip updates that round to zero, where the reference clamps the minimum). 0: no check.
 *  p == NULL (mask and code NULL): a zero span, bytes bytes that are always 0 and take no RAM (the
 *  weights' accumulators of momentum slots at batch size 1, formed row by row in the scratch:
 *  tt_sgd.h tt_sgd_dense_rows): it reads as zeros, and a write must give zeros. */
typedef struct tt_span {
    void *p;
    uint32_t bytes;
    int32_t ro;
    const uint32_t *mask;
    uint32_t elem;
    uint32_t rows, cols;
    const uint8_t *code;
    uint32_t blocks;
    uint32_t sym;
} tt_span;

/** A table of n spans: the state blob, or the inspectable tensors (by index). */
typedef struct tt_spans {
    const tt_span *span;
    uint32_t n;
} tt_spans;

/** What a reset restores: bytes at dst copied from src, or zeroed when src is NULL. */
typedef struct tt_init {
    void *dst;
    const void *src;
    uint32_t bytes;
} tt_init;

/** Size of the blob in bytes (the sum of the spans' sizes, < 2^32). */
uint32_t tt_state_size(const tt_spans *t);

/** CRC-32 of the blob (zlib.crc32 of its bytes; the state hash). */
uint32_t tt_state_hash(const tt_spans *t);

/** Copy blob bytes [off, off + n) to dst. 0 on success, -1 if the range is out of the blob
 *  (nothing copied). n == 0 is valid for any off <= size. */
int tt_state_read(const tt_spans *t, uint32_t off, uint8_t *dst, uint32_t n);

/** Overwrite blob bytes [off, off + n) from src. 0 on success; -1, with nothing written, if the
 *  range is out of the blob, if src differs from a read-only span it covers, has a nonzero byte
 *  for a pruned element of a sparse span, or would leave -128 / -32768 in a symmetric span (an
 *  element split by off or off + n is judged with the bytes the span holds). */
int tt_state_write(const tt_spans *t, uint32_t off, const uint8_t *src, uint32_t n);

/** Copy bytes [off, off + n) of span id to dst; *total receives the span's size when id is
 *  valid. 0 on success, -1 for a bad id or an out-of-range [off, off + n). */
int tt_state_get_tensor(const tt_spans *t, uint32_t id, uint32_t off, uint8_t *dst, uint32_t n,
                        uint32_t *total);

/** Apply the n entries of init in order (copy or zero fill). */
void tt_state_reset(const tt_init *init, uint32_t n);

#ifdef __cplusplus
}
#endif

#endif /* TT_STATE_H */
