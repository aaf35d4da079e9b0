/* Port-independent helpers declared in tt_port.h, built on tt_port_putc(). */
#include "tt_port.h"

void tt_port_puts(const char *s)
{
    while (*s != '\0') {
        tt_port_putc((uint8_t)*s++);
    }
}

void tt_port_putu32(uint32_t v)
{
    char buf[10];
    int n = 0;
    do {
        buf[n++] = (char)('0' + (v % 10u));
        v /= 10u;
    } while (v != 0u);
    while (n > 0) {
        tt_port_putc((uint8_t)buf[--n]);
    }
}
