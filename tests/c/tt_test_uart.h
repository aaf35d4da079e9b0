/* A signed decimal and a space on the UART: the line format tests/qemu_image.py reads. */
#ifndef TT_TEST_UART_H
#define TT_TEST_UART_H

#include <stdint.h>

#include "tt_port.h"

static void put_i32(int32_t v)
{
    if (v < 0) {
        tt_port_puts("-");
        tt_port_putu32(0u - (uint32_t)v);
    } else {
        tt_port_putu32((uint32_t)v);
    }
    tt_port_puts(" ");
}

#endif
