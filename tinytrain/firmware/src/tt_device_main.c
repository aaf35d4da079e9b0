/** The device side of the serial link over the board's port (tt_port.h): blocking
 *  (tt_device_run) or polled from the application's own loop (tt_device_begin + tt_device_poll). */
#include "tt_device.h"
#include "tt_port.h"
#include "tt_protocol.h"

static tt_proto tt_device_proto;
static uint8_t tt_device_running;

static void tt_device_put(void *ctx, uint8_t c)
{
    (void)ctx;
    tt_port_putc(c);
}

static uint32_t tt_device_cycles(void *ctx)
{
    (void)ctx;
    return tt_port_cycles();
}

void tt_device_begin(const tt_device_model *m)
{
    tt_proto_io io;
    io.put = tt_device_put;
    io.cycles = tt_device_cycles;
    io.ctx = 0;
    tt_proto_init(&tt_device_proto, m, &io);
    tt_device_running = 1;
    tt_proto_send_boot(&tt_device_proto);
}

int tt_device_poll(void)
{
    int c;
    if (!tt_device_running) {
        return -1;
    }
    while ((c = tt_port_trygetc()) >= 0) {
        if (tt_proto_feed(&tt_device_proto, (uint8_t)c)) {
            return 1;
        }
    }
    return 0;
}

int tt_device_run(const tt_device_model *m)
{
    tt_device_begin(m);
    for (;;) {
        int c = tt_port_getc();
        if (c < 0) {
            break;
        }
        (void)tt_proto_feed(&tt_device_proto, (uint8_t)c);
    }
    tt_device_running = 0;
    return 0;
}

void tt_device_log(const char *text)
{
    if (tt_device_running) {
        tt_proto_log(&tt_device_proto, text);
    }
}
