/* A fixed state table for tests/test_state.py: spans of several widths, an empty span and a
 * read-only (flash) span between writable ones, a symmetric int16 span (a write must not leave
 * -32768 in it), a zero span last (no storage: reads as zeros, a write must give zeros), and a
 * reset table that copies and zeroes. */
#include "tt_state.h"

static int16_t tts_a[3] = {1, -2, 3};                 /* 6 bytes, symmetric int16 */
static uint8_t tts_empty[1];                           /* a span of 0 bytes */
static const int8_t tts_frozen[5] = {5, 6, 7, 8, 9};   /* read-only */
static int32_t tts_c[2] = {0x01020304, -1};           /* 8 bytes */
static uint32_t tts_meta[1] = {42};                    /* 4 bytes */
static const int16_t tts_a_init[3] = {10, 20, 30};

static const tt_span tts_spans[6] = {
    {tts_a, sizeof tts_a, 0, 0, 0u, 0u, 0u, 0, 0u, 2u},
    {tts_empty, 0, 0, 0, 0u, 0u, 0u, 0, 0u, 0u},
    {(void *)tts_frozen, sizeof tts_frozen, 1, 0, 0u, 0u, 0u, 0, 0u, 0u},
    {tts_c, sizeof tts_c, 0, 0, 0u, 0u, 0u, 0, 0u, 0u},
    {tts_meta, sizeof tts_meta, 0, 0, 0u, 0u, 0u, 0, 0u, 0u},
    {0, 6u, 0, 0, 0u, 0u, 0u, 0, 0u, 0u},                /* a zero span: 6 bytes, no storage */
};
const tt_spans tts_state = {tts_spans, 6u};

static const tt_init tts_inits[2] = {
    {tts_a, tts_a_init, sizeof tts_a},
    {tts_c, 0, sizeof tts_c},
};

/** The table (for cffi, which cannot take the address of a const global). */
const tt_spans *tts_table(void) { return &tts_state; }

/** Restore a from its init values and zero c (the others keep their bytes). */
void tts_reset(void) { tt_state_reset(tts_inits, 2u); }
