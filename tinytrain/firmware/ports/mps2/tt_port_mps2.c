/* tt_port for the MPS2 images under QEMU: CMSDK APB UART0 (serial link), CMSDK APB timer 0
 * (instruction counter), semihosting SYS_EXIT_EXTENDED (exit code to QEMU).
 *
 * Two memory maps: AN385/AN386/AN500 (Cortex-M3/M4/M7, hw/arm/mps2.c: UART0 0x40004000, timer 0
 * 0x40000000, SYSCLK 25 MHz) and AN505 (Cortex-M33 in an SSE-200 subsystem, hw/arm/mps2-tz.c,
 * TT_BOARD_MPS2_AN505 from the platform's builder: the core runs in Secure state, so UART0 and
 * timer 0 are used through their Secure aliases 0x50200000 and 0x50000000; SYSCLK 20 MHz).
 *
 * Instruction counting: QEMU is run with `-icount shift=7` (128 virtual ns per guest instruction).
 * Timer 0 is clocked from SYSCLK, one tick every 10^9 / SYSCLK ns (40 on AN385/6/500, 50 on
 * AN505), finer than an instruction: tt_port_cycles() turns its ticks into the exact number of
 * instructions executed since tt_port_init() (tt_qemu_instructions in tt_port.h), deterministic
 * from run to run. tests/test_boards_qemu.py checks it against a loop of known length. */
#include <stdint.h>

#include "tt_port.h"

#if defined(TT_BOARD_MPS2_AN505)
#define MPS2_SYSCLK_HZ 20000000u
#define MPS2_UART0_BASE 0x50200000u
#define MPS2_TIMER0_BASE 0x50000000u
#elif defined(__ARM_ARCH_8M_MAIN__) || defined(__ARM_ARCH_8M_BASE__)
#error "Armv8-M build of the mps2 port for an unknown image: only the AN505 map is known"
#else
#define MPS2_SYSCLK_HZ 25000000u
#define MPS2_UART0_BASE 0x40004000u
#define MPS2_TIMER0_BASE 0x40000000u
#endif
#define NS_PER_TICK (1000000000u / MPS2_SYSCLK_HZ)
#define TT_BAUD 115200u

/* CMSDK APB UART (ARM DDI 0479C, 4.3) */
typedef struct {
    volatile uint32_t DATA;      /* 0x00 [7:0] rx/tx byte */
    volatile uint32_t STATE;     /* 0x04 bit0 TX buffer full, bit1 RX buffer full */
    volatile uint32_t CTRL;      /* 0x08 bit0 TX enable, bit1 RX enable */
    volatile uint32_t INTSTATUS; /* 0x0C */
    volatile uint32_t BAUDDIV;   /* 0x10 >= 16 */
} cmsdk_uart_t;

/* CMSDK APB timer (ARM DDI 0479C, 4.4): 32-bit down counter, reloads on reaching 0. */
typedef struct {
    volatile uint32_t CTRL;      /* 0x00 bit0 enable */
    volatile uint32_t VALUE;     /* 0x04 */
    volatile uint32_t RELOAD;    /* 0x08 */
    volatile uint32_t INTSTATUS; /* 0x0C */
} cmsdk_timer_t;

#define UART0 ((cmsdk_uart_t *)MPS2_UART0_BASE)
#define TIMER0 ((cmsdk_timer_t *)MPS2_TIMER0_BASE)

#define UART_STATE_TXFULL 0x1u
#define UART_STATE_RXFULL 0x2u

void tt_port_init(void)
{
    UART0->BAUDDIV = MPS2_SYSCLK_HZ / TT_BAUD; /* QEMU ignores the rate but checks >= 16 */
    UART0->CTRL = 0x3u;

    TIMER0->CTRL = 0u;
    TIMER0->RELOAD = 0xFFFFFFFFu;
    TIMER0->VALUE = 0xFFFFFFFFu;
    TIMER0->CTRL = 0x1u;
}

void tt_port_putc(uint8_t c)
{
    while ((UART0->STATE & UART_STATE_TXFULL) != 0u) {
    }
    UART0->DATA = c;
}

int tt_port_trygetc(void)
{
    if ((UART0->STATE & UART_STATE_RXFULL) == 0u) {
        return -1;
    }
    return (int)(UART0->DATA & 0xFFu);
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
    /* elapsed ticks modulo 2^32 (the timer counts down from 0xFFFFFFFF) */
    return tt_qemu_instructions(0xFFFFFFFFu - TIMER0->VALUE, NS_PER_TICK, &last_ticks, &tick_wraps);
}

uint32_t tt_port_cycles_resolution(void)
{
    return 1;
}

/* ARM semihosting, SYS_EXIT_EXTENDED (0x20): QEMU exits with `code` when started with
 * -semihosting; on hardware without a debugger the BKPT faults and the core stops. */
void tt_port_exit(int code)
{
    static volatile uint32_t block[2];
    block[0] = 0x20026u; /* ADP_Stopped_ApplicationExit */
    block[1] = (uint32_t)code;
    while ((UART0->STATE & UART_STATE_TXFULL) != 0u) {
    }
    for (;;) {
        register uint32_t r0 __asm__("r0") = 0x20u;
        register volatile uint32_t *r1 __asm__("r1") = block;
        __asm__ volatile("bkpt 0xab" : "+r"(r0) : "r"(r1) : "memory");
    }
}
