/**
 * tt_port.h — the board interface the tinytrain firmware runs on.
 *
 * One implementation per port (firmware/ports/<port>/): mps2 (QEMU MPS2 AN385/AN386/AN500, CMSDK
 * UART0), nrf51 (QEMU micro:bit, Cortex-M0) and arduino (real boards, Arduino `Serial`).
 * C99, no heap, no floating point.
 *
 * The application provides `int main(void)` and calls tt_port_init() first. On bare-metal ports
 * the reset handler calls main() and a return from it calls tt_port_exit(return value); on the
 * arduino port main() is renamed tt_app_main() at compile time and called once from setup()
 * (ports/arduino/tt_arduino_main.cpp), whose loop() then polls the link (tt_device_poll). A
 * user's own sketch keeps its setup()/loop() and uses only ports/arduino/tt_port_arduino.cpp.
 */
#ifndef TT_PORT_H
#define TT_PORT_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** Bring up the serial link (8N1, 115200 baud on real boards) and the cycle counter. */
void tt_port_init(void);

/** Send one byte; blocks while the transmitter is full. */
void tt_port_putc(uint8_t c);

/** Receive one byte; blocks until one arrives. Returns 0..255. */
int tt_port_getc(void);

/** Receive one byte if one is waiting: 0..255, or -1 at once if none. */
int tt_port_trygetc(void);

/**
 * Free-running 32-bit counter of executed work, wrapping modulo 2^32 (subtract as uint32_t; an
 * interval must be shorter than 2^32 units). Units:
 *  - QEMU boards (run with -icount shift=7, see tt_qemu_instructions): instructions executed,
 *    exact and deterministic (resolution 1);
 *  - real Cortex-M3/M4/M7 boards: CPU clock cycles (DWT CYCCNT), resolution 1;
 *  - boards without a counter (Cortex-M0/M0+): always 0.
 */
uint32_t tt_port_cycles(void);

/** Granularity of tt_port_cycles() in its own units; 0 if tt_port_cycles() is unavailable. */
uint32_t tt_port_cycles_resolution(void);

/**
 * For the QEMU ports: QEMU runs the emulated boards with `-icount shift=TT_QEMU_ICOUNT_SHIFT`, so
 * its virtual clock advances 2^shift = 128 ns per guest instruction, exactly. A board timer that
 * ticks every ns_per_tick <= 128 ns (MPS2 40, AN505 50, micro:bit 125) then reads, I instructions
 * after it started, T = floor(128 I / ns_per_tick), and T * ns_per_tick / 128 lies in
 * (I - 1, I]: its ceiling is I itself, the exact instruction count, whatever the phase of the
 * timer (at shift 0 a reading was exact only to within a tick, 40 or 125 instructions, and the
 * phase depended on how long the firmware had polled the UART). The 32-bit tick count is
 * extended by counting its wraps between readings (*last, *wraps): a missed wrap (a wait of
 * several wraps between two readings) shifts every later reading by the same whole number of
 * instructions (2^32 ticks are 2^25 * ns_per_tick instructions), so differences stay exact as
 * long as one interval spans at most one wrap (2^32 ticks: 171 s of virtual time on MPS2, over
 * 10^9 instructions). Returns the count modulo 2^32.
 */
#define TT_QEMU_ICOUNT_SHIFT 7
static inline uint32_t tt_qemu_instructions(uint32_t ticks, uint32_t ns_per_tick, uint32_t *last, uint32_t *wraps)
{
    uint64_t t;
    if (ticks < *last) (*wraps)++;
    *last = ticks;
    t = ((uint64_t)*wraps << 32) | ticks;
    return (uint32_t)((t * ns_per_tick + ((1u << TT_QEMU_ICOUNT_SHIFT) - 1u)) >> TT_QEMU_ICOUNT_SHIFT);
}

/** Flush the serial link and stop. Under QEMU (with -semihosting) QEMU exits with `code`. */
void tt_port_exit(int code);

/** Write a NUL-terminated string (no newline added). */
void tt_port_puts(const char *s);

/** Write an unsigned number in decimal. */
void tt_port_putu32(uint32_t v);

#ifdef __cplusplus
}
#endif

#endif /* TT_PORT_H */
