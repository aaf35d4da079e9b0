/* tt_port for real boards through the official PlatformIO Arduino frameworks:
 * nucleo_f446re, bluepill_f103c8, disco_f746ng, nucleo_u575zi_q (ststm32, STM32duino core),
 * nano33ble and pico (nordicnrf52 / raspberrypi, ArduinoCore-mbed), pico2 (RP2350, the
 * community raspberrypi platform with the arduino-pico core).
 *
 * Only the tt_port functions: a sketch of the user's own (the exported library,
 * docs/embedding.md) keeps its setup() and loop(); tinytrain's generated projects add
 * tt_arduino_main.cpp for those. Serial is the board's console (ST-LINK virtual COM port on
 * the ST boards, USB CDC on nano33ble / pico; pins and rates in boards/targets.json), 115200
 * baud 8N1.
 *
 * tt_port_cycles(): DWT CYCCNT (CPU clock cycles) on Cortex-M3/M4/M7/M33; the Cortex-M0+ of the
 * pico has no cycle counter, so it returns 0 and tt_port_cycles_resolution() returns 0.
 *
 * Not built offline: the official platforms must be downloaded by PlatformIO (needs internet).
 * Empty outside an Arduino build, so an exported library (tinytrain.codegen.library) can carry
 * it into projects of any framework. */
#if defined(ARDUINO)
#include <Arduino.h>

#include "tt_port.h"

#if defined(__ARM_ARCH_7M__) || defined(__ARM_ARCH_7EM__) || defined(__ARM_ARCH_8M_MAIN__)
#define TT_HAVE_DWT 1 /* same DEMCR/DWT addresses on Armv7-M and Armv8-M Mainline */
#define TT_DEMCR (*(volatile uint32_t *)0xE000EDFCu)
#define TT_DWT_CTRL (*(volatile uint32_t *)0xE0001000u)
#define TT_DWT_CYCCNT (*(volatile uint32_t *)0xE0001004u)
#else
#define TT_HAVE_DWT 0
#endif

extern "C" void tt_port_init(void)
{
    Serial.begin(115200);
    while (!Serial) {
        /* USB CDC boards: wait for the host to open the port so no output is lost */
    }
#if TT_HAVE_DWT
    TT_DEMCR |= (1u << 24);  /* TRCENA */
    TT_DWT_CYCCNT = 0u;
    TT_DWT_CTRL |= 1u;       /* CYCCNTENA */
#endif
}

extern "C" void tt_port_putc(uint8_t c) { Serial.write(c); }

extern "C" int tt_port_trygetc(void)
{
    int c = Serial.read();
    return c < 0 ? -1 : (c & 0xFF);
}

extern "C" int tt_port_getc(void)
{
    int c;
    do {
        c = tt_port_trygetc();
    } while (c < 0);
    return c;
}

extern "C" uint32_t tt_port_cycles(void)
{
#if TT_HAVE_DWT
    return TT_DWT_CYCCNT;
#else
    return 0u;
#endif
}

extern "C" uint32_t tt_port_cycles_resolution(void) { return TT_HAVE_DWT ? 1u : 0u; }

extern "C" void tt_port_exit(int code)
{
    (void)code;
    Serial.flush();
    for (;;) {
        delay(1000);
    }
}

#endif /* ARDUINO */
