/** Host harness for protocol tests: the device side (tt_protocol.c) with the fake model, fed and
 *  drained from Python through cffi, plus a pipe/pty port so tt_device_run itself can run in a
 *  thread. */
#define _POSIX_C_SOURCE 200809L
#include <poll.h>
#include <string.h>
#include <unistd.h>

#include "tt_cobs.h"
#include "tt_fake_model.h"
#include "tt_port.h"
#include "tt_protocol.h"

static tt_proto h_proto;
static uint8_t h_out[1u << 16];
static uint32_t h_out_len;
static uint32_t h_cycles;

static void h_put(void *ctx, uint8_t c)
{
    (void)ctx;
    if (h_out_len < sizeof h_out) {
        h_out[h_out_len++] = c;
    }
}

static uint32_t h_cyc(void *ctx)
{
    (void)ctx;
    h_cycles += 1234u;
    return h_cycles;
}

/** Power the fake device on: model to defaults, protocol reset, boot HELLO queued. */
void tth_power_on(void)
{
    tt_proto_io io;
    io.put = h_put;
    io.cycles = h_cyc;
    io.ctx = 0;
    tt_fake_power_on();
    tt_proto_init(&h_proto, &tt_fake_model, &io);
    tt_proto_send_boot(&h_proto);
}

void tth_feed(const uint8_t *p, uint32_t n)
{
    uint32_t i;
    for (i = 0; i < n; i++) {
        tt_proto_feed(&h_proto, p[i]);
    }
}

uint32_t tth_drain(uint8_t *dst, uint32_t cap)
{
    uint32_t n = h_out_len < cap ? h_out_len : cap;
    memcpy(dst, h_out, n);
    memmove(h_out, h_out + n, h_out_len - n);
    h_out_len -= n;
    return n;
}

void tth_log(const char *s)
{
    tt_proto_log(&h_proto, s);
}

typedef struct { uint8_t *dst; uint32_t cap, n; } tth_sink;

static void tth_sink_put(void *ctx, uint8_t c)
{
    tth_sink *s = (tth_sink *)ctx;
    if (s->n < s->cap) {
        s->dst[s->n] = c;
    }
    s->n++;
}

uint32_t tth_cobs_encode(const uint8_t *src, uint32_t n, uint8_t *dst, uint32_t cap)
{
    tth_sink s;
    s.dst = dst;
    s.cap = cap;
    s.n = 0;
    return tt_cobs_encode(src, n, tth_sink_put, &s) == s.n ? s.n : 0xFFFFFFFFu;
}

/** Feed src to a fresh decoder; returns the code of the last byte, *len the decoded length. */
int tth_cobs_decode(const uint8_t *src, uint32_t n, uint8_t *dst, uint32_t cap, uint32_t *len)
{
    tt_cobs_decoder d;
    int rc = TT_COBS_MORE;
    uint32_t i;
    tt_cobs_decoder_init(&d, dst, cap);
    for (i = 0; i < n; i++) {
        rc = tt_cobs_decode_byte(&d, src[i]);
    }
    *len = d.len;
    return rc;
}

/* ---- a tt_port over a file descriptor (pty master), for tt_device_run in a thread ---- */

static int h_fd = -1;
static volatile int h_stop;

void tt_port_init(void) {}

void tt_port_putc(uint8_t c)
{
    while (write(h_fd, &c, 1) != 1 && !h_stop) {
    }
}

int tt_port_getc(void)
{
    for (;;) {
        struct pollfd pf;
        uint8_t c;
        if (h_stop) {
            return -1;
        }
        pf.fd = h_fd;
        pf.events = POLLIN;
        pf.revents = 0;
        if (poll(&pf, 1, 20) > 0) {
            return read(h_fd, &c, 1) == 1 ? c : -1;
        }
    }
}

int tt_port_trygetc(void)
{
    struct pollfd pf;
    uint8_t c;
    pf.fd = h_fd;
    pf.events = POLLIN;
    pf.revents = 0;
    if (h_stop || poll(&pf, 1, 0) <= 0) {
        return -1;
    }
    return read(h_fd, &c, 1) == 1 ? c : -1;
}

uint32_t tt_port_cycles(void)
{
    return h_cyc(0);
}

/** Run the real device main loop on fd until tth_port_stop(); returns tt_device_run's value. */
int tth_run_device(int fd)
{
    h_fd = fd;
    h_stop = 0;
    tt_fake_power_on();
    return tt_device_run(&tt_fake_model);
}

/** The polled device (tt_device_begin + tt_device_poll) on fd until tth_port_stop(), as an
 *  application's loop would run it; between polls it "works" (waits up to 1 ms for input).
 *  Returns the polls that answered a frame; *idle = the polls that found no complete frame. */
uint32_t tth_poll_device(int fd, uint32_t *idle)
{
    uint32_t answered = 0;
    h_fd = fd;
    h_stop = 0;
    *idle = 0;
    tt_fake_power_on();
    tt_device_begin(&tt_fake_model);
    while (!h_stop) {
        struct pollfd pf;
        int r = tt_device_poll();
        if (r == 1) {
            answered++;
        } else {
            (*idle)++;
        }
        pf.fd = h_fd;
        pf.events = POLLIN;
        pf.revents = 0;
        (void)poll(&pf, 1, 1);
    }
    return answered;
}

void tth_port_stop(void)
{
    h_stop = 1;
}

