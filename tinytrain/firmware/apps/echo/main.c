/* Echo firmware: proves the build -> boot -> serial chain and the instruction counter.
 *
 * Prints, then echoes every received byte back unchanged:
 *   tinytrain echo board=<name>\r\n
 *   cycles res=<r> t0=<a> t1=<b> t2=<c> loop=<d> known_n=<n> known=<k>\r\n
 *     t1 - t0: two back-to-back counter reads (the cost of one read, within a resolution step);
 *     d: counter delta over a fixed C loop (compiler-dependent length);
 *     k: counter delta over known_loop(n), whose own length is exactly 2n + 2 instructions
 *   ready\r\n
 * A fixed workload between two counter reads gives the same `loop` on every run (QEMU -icount).
 * Byte 0x04 (EOT) ends the program with exit code 0 instead of being echoed. */
#include <stdint.h>

#include "tt_port.h"

#ifndef TT_BOARD_NAME
#define TT_BOARD_NAME "unknown"
#endif

#define LOOP_ITERS 10000u
#define KNOWN_ITERS 100000u

/* Exactly 2 * n + 2 instructions from the first instruction after the caller's counter read to
 * the return: `mov` (1), then n turns of `subs`+`bne` (2 each, the last bne not taken), then
 * `bx lr` (1). Thumb-1 encodings, so the same code runs on Cortex-M0 to M33. A
 * tt_port_cycles() call around it adds its own fixed instructions (call, load, multiply, ...),
 * measured by the t1 - t0 reading of two back-to-back calls. */
__attribute__((naked, noinline)) static uint32_t known_loop(uint32_t n __attribute__((unused)))
{
    __asm__ volatile(
        "    .syntax unified\n"
        "    movs r1, r0\n"
        "1:  subs r1, r1, #1\n"
        "    bne 1b\n"
        "    bx lr\n");
}

/* A fixed amount of integer work that the compiler cannot remove. */
static uint32_t fixed_work(void)
{
    volatile uint32_t acc = 1u;
    uint32_t i;
    for (i = 0u; i < LOOP_ITERS; ++i) {
        acc = acc * 1664525u + 1013904223u;
    }
    return acc;
}

static void put_field(const char *name, uint32_t v)
{
    tt_port_puts(name);
    tt_port_putu32(v);
}

int main(void)
{
    uint32_t t0, t1, t2, t3, t4, sink;
    int c;

    tt_port_init();
    tt_port_puts("tinytrain echo board=" TT_BOARD_NAME "\r\n");

    t0 = tt_port_cycles();
    t1 = tt_port_cycles();
    sink = fixed_work();
    t2 = tt_port_cycles();
    t3 = tt_port_cycles();
    (void)known_loop(KNOWN_ITERS);
    t4 = tt_port_cycles();

    put_field("cycles res=", tt_port_cycles_resolution());
    put_field(" t0=", t0);
    put_field(" t1=", t1);
    put_field(" t2=", t2);
    put_field(" loop=", t2 - t1);
    put_field(" known_n=", KNOWN_ITERS);
    put_field(" known=", t4 - t3);
    put_field(" sink=", sink);
    tt_port_puts("\r\nready\r\n");

    for (;;) {
        c = tt_port_getc();
        if (c == 0x04) {
            return 0;
        }
        tt_port_putc((uint8_t)c);
    }
}
