/** tt_crc32.h — CRC-32/IEEE (poly 0xEDB88320 reflected), bit-identical to Python's zlib.crc32. */
#ifndef TT_CRC32_H
#define TT_CRC32_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/**
 * Continue a CRC-32 over n more bytes. Same contract as zlib.crc32(data, crc): start with crc = 0,
 * pass the previous return value to continue, so update(update(0, a), b) == crc32(a + b).
 * Nibble table (64 bytes of flash), no heap, p may be NULL when n == 0.
 */
uint32_t tt_crc32_update(uint32_t crc, const uint8_t *p, uint32_t n);

#ifdef __cplusplus
}
#endif

#endif /* TT_CRC32_H */
