/* tt_port for the nRF51822 of the BBC micro:bit under QEMU (machine `microbit`, Cortex-M0):
 * UART0 at 0x40002000 (serial link), TIMER0 at 0x40008000 (instruction counter), semihosting exit.
 *
 * Instruction counting: QEMU is run with `-icount shift=7` (128 virtual ns per instruction).
 * TIMER0 runs from the 16 MHz HFCLK with prescaler 1, i.e. 8 MHz: one tick per 125 ns, finer
 * than an instruction. tt_port_cycles() turns ticks into the exact number of instructions
 * executed (tt_qemu_instructions in tt_port.h), deterministic, resolution 1. The Cortex-M0 has
 * no DWT, and this is the only counter; on a real micro:bit the same figure is 125/128 of a
 * timer tick of 8 MHz, i.e. time, not instructions. */
#include <stdint.h>

#include "tt_port.h"

#define REG(addr) (*(volatile uint32_t *)(addr))

#define UART0_BASE 0x40002000u
#define UART_STARTRX REG(UART0_BASE + 0x000u)
#define UART_STARTTX REG(UART0_BASE + 0x008u)
#define UART_EV_RXDRDY REG(UART0_BASE + 0x108u)
#define UART_EV_TXDRDY REG(UART0_BASE + 0x11Cu)
#define UART_ENABLE REG(UART0_BASE + 0x500u)
#define UART_PSELTXD REG(UART0_BASE + 0x50Cu)
#define UART_PSELRXD REG(UART0_BASE + 0x514u)
#define UART_RXD REG(UART0_BASE + 0x518u)
#define UART_TXD REG(UART0_BASE + 0x51Cu)
#define UART_BAUDRATE REG(UART0_BASE + 0x524u)

#define TIMER0_BASE 0x40008000u
#define TIMER_START REG(TIMER0_BASE + 0x000u)
#define TIMER_STOP REG(TIMER0_BASE + 0x004u)
#define TIMER_CLEAR REG(TIMER0_BASE + 0x00Cu)
#define TIMER_CAPTURE0 REG(TIMER0_BASE + 0x040u)
#define TIMER_MODE REG(TIMER0_BASE + 0x504u)
#define TIMER_BITMODE REG(TIMER0_BASE + 0x508u)
#define TIMER_PRESCALER REG(TIMER0_BASE + 0x510u)
#define TIMER_CC0 REG(TIMER0_BASE + 0x540u)

#define NS_PER_TICK 125u /* 1e9 ns / (16 MHz >> 1) */

static uint32_t tx_started;

void tt_port_init(void)
{
    UART_PSELTXD = 24u; /* micro:bit USB interface chip pins: TX P0.24, RX P0.25 */
    UART_PSELRXD = 25u;
    UART_BAUDRATE = 0x01D7E000u; /* 115200 */
    UART_ENABLE = 4u;
    UART_EV_RXDRDY = 0u;
    UART_EV_TXDRDY = 0u;
    UART_STARTRX = 1u;
    UART_STARTTX = 1u;
    tx_started = 0u;

    TIMER_STOP = 1u;
    TIMER_MODE = 0u;    /* timer */
    TIMER_BITMODE = 3u; /* 32 bit */
    TIMER_PRESCALER = 1u;
    TIMER_CLEAR = 1u;
    TIMER_START = 1u;
}

void tt_port_putc(uint8_t c)
{
    if (tx_started != 0u) {
        while (UART_EV_TXDRDY == 0u) {
        }
    }
    UART_EV_TXDRDY = 0u;
    UART_TXD = c;
    tx_started = 1u;
}

int tt_port_trygetc(void)
{
    if (UART_EV_RXDRDY == 0u) {
        return -1;
    }
    UART_EV_RXDRDY = 0u;
    return (int)(UART_RXD & 0xFFu);
}

int tt_port_getc(void)
{
    int c;
    do {
        c = tt_port_trygetc();
    } while (c < 0);
    return c;
}

static uint32_t last_ticks, tick_wraps;

uint32_t tt_port_cycles(void)
{
    TIMER_CAPTURE0 = 1u;
    return tt_qemu_instructions(TIMER_CC0, NS_PER_TICK, &last_ticks, &tick_wraps);
}

uint32_t tt_port_cycles_resolution(void)
{
    return 1;
}

/* ARM semihosting SYS_EXIT_EXTENDED: QEMU (with -semihosting) exits with `code`. */
void tt_port_exit(int code)
{
    static volatile uint32_t block[2];
    block[0] = 0x20026u;
    block[1] = (uint32_t)code;
    if (tx_started != 0u) {
        while (UART_EV_TXDRDY == 0u) {
        }
    }
    for (;;) {
        register uint32_t r0 __asm__("r0") = 0x20u;
        register volatile uint32_t *r1 __asm__("r1") = block;
        __asm__ volatile("bkpt 0xab" : "+r"(r0) : "r"(r1) : "memory");
    }
}
