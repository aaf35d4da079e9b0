/* Reset and vector table for the nRF51822 (Cortex-M0) of the BBC micro:bit (QEMU microbit).
 * Copies .data from its load address, zeroes .bss, enables the FPU in hard-float builds, then
 * calls main(); a return from main() ends in tt_port_exit(). Every exception stops the program. */
#include <stdint.h>

#include "tt_port.h"

extern uint32_t __data_start__, __data_end__, __data_load__, __bss_start__, __bss_end__;
extern uint32_t __stack_top__;
extern int main(void);

void Reset_Handler(void);
void Fault_Handler(void);

#define SCB_CPACR (*(volatile uint32_t *)0xE000ED88u)

void Reset_Handler(void)
{
    uint32_t *src = &__data_load__;
    uint32_t *dst = &__data_start__;
    while (dst < &__data_end__) {
        *dst++ = *src++;
    }
    for (dst = &__bss_start__; dst < &__bss_end__; ++dst) {
        *dst = 0u;
    }
#if defined(__ARM_FP)
    /* Hard-float build: grant full access to CP10/CP11 before any VFP instruction runs. */
    SCB_CPACR |= (0xFu << 20);
    __asm__ volatile("dsb\n\tisb" ::: "memory");
#endif
    tt_port_exit(main());
}

/* Any fault or unexpected interrupt: report on the UART and stop with exit code 3 (QEMU quits
 * when semihosting is on; otherwise the core spins here). */
void Fault_Handler(void)
{
    tt_port_puts("\r\n[tt] fault\r\n");
    tt_port_exit(3);
}

typedef void (*tt_vector_t)(void);

/* 16 system exceptions + 32 interrupts: all stop the program. */
__attribute__((section(".isr_vector"), used))
const tt_vector_t tt_vector_table[16 + 32] = {
    (tt_vector_t)(uintptr_t)&__stack_top__,
    Reset_Handler,
    [2 ... 47] = Fault_Handler,
};
