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
 *  - QEMU boards (run with -icount shift=0): instructions executed, exact and deterministic but
 *    quantised to tt_port_cycles_resolution() instructions (1 ns per instruction; 40 on MPS2 with
 *    its 25 MHz timer, 125 on the micro:bit with its 8 MHz timer);
 *  - real Cortex-M3/M4/M7 boards: CPU clock cycles (DWT CYCCNT), resolution 1;
 *  - boards without a counter (Cortex-M0/M0+): always 0.
 */
uint32_t tt_port_cycles(void);

/** Granularity of tt_port_cycles() in its own units; 0 if tt_port_cycles() is unavailable. */
uint32_t tt_port_cycles_resolution(void);

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
