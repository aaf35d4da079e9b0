/* A minimal host implementation of tt_port.h (stdout, no counter) so the float apps can be
 * compiled and checked with the host gcc: see check_host.py. Not part of any firmware. */
#include <stdio.h>
#include <stdlib.h>

#include "tt_port.h"

void tt_port_init(void) {}
void tt_port_putc(uint8_t c) { putchar(c); }
int tt_port_getc(void) { return getchar() & 0xff; }
int tt_port_trygetc(void) { return -1; }
uint32_t tt_port_cycles(void) { return 0; }
uint32_t tt_port_cycles_resolution(void) { return 0; }
void tt_port_exit(int code)
{
    fflush(stdout);
    exit(code);
}
void tt_port_puts(const char *s) { fputs(s, stdout); }
void tt_port_putu32(uint32_t v) { printf("%lu", (unsigned long)v); }
