/* tests/test_state.py under AddressSanitizer and UBSan: every read and write of the fixture's
 * blob with off, n in [0, size + 1] (and two ranges whose end overflows uint32), printed as
 * "<op> <off> <n> <rc> <blob or bytes read, hex>" for the test to compare with its model. */
#include <stdio.h>
#include <stdint.h>
#include "tt_state.h"

extern const tt_spans tts_state;

static void hex(const uint8_t *p, uint32_t n)
{
    uint32_t i;
    for (i = 0; i < n; i++) printf("%02x", p[i]);
    printf("\n");
}

int main(void)
{
    const uint32_t size = tt_state_size(&tts_state);
    uint8_t blob[64], buf[64], flip[64];
    uint32_t off, n, i;
    static const uint32_t big[2][2] = {{1u, 0xFFFFFFFFu}, {0xFFFFFFFFu, 2u}};
    if (size > sizeof blob - 2 || tt_state_read(&tts_state, 0, blob, size) != 0) return 1;
    printf("size %u hash %08x\n", (unsigned)size, (unsigned)tt_state_hash(&tts_state));
    for (off = 0; off <= size + 1; off++)
        for (n = 0; off + n <= size + 1; n++) {
            int rc = tt_state_read(&tts_state, off, buf, n);
            printf("r %u %u %d ", (unsigned)off, (unsigned)n, rc);
            hex(buf, rc == 0 ? n : 0);
            /* the same bytes back: accepted even over the read-only span */
            for (i = 0; i < n && off + i < size; i++) flip[i] = blob[off + i];
            rc = tt_state_write(&tts_state, off, flip, n);
            tt_state_read(&tts_state, 0, buf, size);
            printf("w= %u %u %d ", (unsigned)off, (unsigned)n, rc);
            hex(buf, size);
            /* different bytes: refused when they cover the read-only span (nothing written) */
            for (i = 0; i < n && off + i < size; i++) flip[i] = (uint8_t)~blob[off + i];
            rc = tt_state_write(&tts_state, off, flip, n);
            tt_state_read(&tts_state, 0, buf, size);
            printf("w~ %u %u %d ", (unsigned)off, (unsigned)n, rc);
            hex(buf, size);
            if (tt_state_write(&tts_state, 0, blob, size) != 0) return 2;  /* restore */
        }
    for (i = 0; i < 2; i++)
        printf("r %u %u %d\n", (unsigned)big[i][0], (unsigned)big[i][1],
               tt_state_read(&tts_state, big[i][0], buf, big[i][1]));
    return 0;
}
