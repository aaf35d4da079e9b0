"""Device glue for a generated model, and the complete PlatformIO firmware around it.

``device_source(model, emitted)`` emits ``<prefix>_device.c``: a ``tt_device_model`` (see
tinytrain/firmware/include/tt_device.h) wired to the generated ``<prefix>_*`` functions, a shadow buffer
for atomic parameter loads, and ``main()`` = ``tt_port_init(); tt_device_run(&model)``.
With ``fedcodec`` (federation builds; off by default so training-RAM figures are the model's
own) the glue also carries the federated update codec (``tinytrain/firmware/src/tt_fedcodec.c``:
ROUND_BEGIN / GET_UPDATE / UPDATE_ACK, compile-time ``TT_FEDCODEC``, RAM =
``fedcodec_bytes(model)``). On bare-metal ports main() first paints the stack; GET_TENSOR id 0xFFFE (``TENSOR_STACK``)
then answers the peak stack bytes used so far (4 bytes LE), so peak RAM = .data + .bss + that.

``build_firmware(model, board, out_dir)`` writes a self-contained PlatformIO project into
``out_dir`` and builds it (offline for emulated boards)::

    out_dir/platformio.ini
    out_dir/include/tt_*.h              tinytrain/firmware/include (PlatformIO puts include/ on the path)
    out_dir/src/app/<prefix>.[ch]       the generated model
    out_dir/src/app/<prefix>_device.c   this module's glue + main()
    out_dir/src/app/src/tt_*.c          tinytrain/firmware/src (kernels, protocol, device loop)
    out_dir/src/port_<port>/            the board port (and its linker script)

No path leads outside ``out_dir``: emulated boards name the offline platform by name and version
(``platform = qemu-cortexm@0.1.0``, installed by ``python -m tinytrain.device.toolchain setup``), so the
project builds wherever it is moved.
"""
from __future__ import annotations

import numpy as np

from tinytrain.codegen.emit import Emitted, generate

TENSOR_STACK = 0xFFFE  # GET_TENSOR id of the glue's stack high-water reading


def state_bytes(model) -> int:
    """Size of the state blob (the LOAD_PARAMS / read_state layout)."""
    return int(sum(np.asarray(a).nbytes for a in model.state_tensors()))


def static_ram_bytes(em: Emitted, model, shadow: bool = True, fedcodec: bool = False) -> int:
    """Static RAM of the generated model: its RAM tensors plus the glue's load shadow (and,
    with fedcodec, the on-device update codec's buffers)."""
    return (int(sum(t.bytes for t in em.tensors)) + (state_bytes(model) if shadow else 0)
            + (fedcodec_bytes(model) if fedcodec else 0))


#: sizeof(tt_fedcodec) on a 32-bit target, rounded up (pointers, round fields, flags)
FEDCODEC_STATE = 64


def fedcodec_store(model) -> list[tuple[int, int, int]]:
    """The parameter store as the update codec sees it: (blob offset, elements, bytes per
    element) per tensor, schema order (tinytrain.federated.codec.Schema)."""
    from tinytrain.federated.codec import Schema

    sc = Schema.of(model)
    out = []
    for i in sc.store_slots:
        sl = sc.slots[i]
        out.append((int(sl.offset), int(np.prod(sl.shape)), int(np.dtype(sl.dtype).itemsize)))
    return out


#: width of the on-device error-feedback residual unless the build sets -DTT_FED_RESIDUAL_BITS
FEDCODEC_RESIDUAL_BITS = 32


def fedcodec_bytes(model, residual_bits: int = FEDCODEC_RESIDUAL_BITS) -> int:
    """RAM of the on-device update codec: the global store snapshot, a residual of
    residual_bits per stored element, a shift per tensor and the codec state."""
    st = fedcodec_store(model)
    return sum(n * w + residual_bits // 8 * n + 1 for _, n, w in st) + FEDCODEC_STATE


def _fedcodec_glue(P: str, U: str, model, on: bool) -> str:
    st = fedcodec_store(model)
    rows = ",\n".join(f"    {{{o}u, {n}u, {w}u}}" for o, n, w in st)
    n_el = sum(n for _, n, _ in st)
    store = sum(n * w for _, n, w in st)
    return f"""
/* The federated update codec on the device (tt_fedcodec.h): ROUND_BEGIN snapshots the parameter
 * store, GET_UPDATE encodes the compressed update from the live state, UPDATE_ACK commits the
 * error-feedback residual. RAM: {store} B snapshot + {n_el} x TT_FED_RESIDUAL_BITS / 8 B residual
 * ({4 * n_el} B at the default 32) + {len(st)} B shifts + the codec state. -DTT_FEDCODEC=1 / 0
 * puts it in / leaves it out; without it the commands answer UNSUPPORTED and the host
 * compresses on its side of the serial link. -DTT_FED_RESIDUAL_BITS=64/32/16 sets the width the
 * residual is kept in (saturating below 64; HELLO reports it). */
#ifndef TT_FEDCODEC
#define TT_FEDCODEC {int(bool(on))}
#endif
#ifndef TT_FED_RESIDUAL_BITS
#define TT_FED_RESIDUAL_BITS {FEDCODEC_RESIDUAL_BITS}
#endif
#if TT_FEDCODEC
#include "tt_fedcodec.h"
#if TT_FED_RESIDUAL_BITS == 64
typedef int64_t {P}_fed_res_t;
#elif TT_FED_RESIDUAL_BITS == 32
typedef int32_t {P}_fed_res_t;
#elif TT_FED_RESIDUAL_BITS == 16
typedef int16_t {P}_fed_res_t;
#else
#error "TT_FED_RESIDUAL_BITS must be 64, 32 or 16"
#endif

static const tt_fed_tensor {P}_fed_store[{len(st)}] = {{
{rows}
}};
static uint8_t {P}_fed_global[{store}u];
static {P}_fed_res_t {P}_fed_residual[{n_el}u];
static uint8_t {P}_fed_shift[{len(st)}u];
static tt_fedcodec {P}_fed;
static uint8_t {P}_fed_ready;

static int {P}_fed_read(uint32_t off, uint8_t *dst, uint32_t n)
{{
    return {P}_read_state(off, dst, n);
}}

static tt_fedcodec *{P}_fed_codec(void)
{{
    if (!{P}_fed_ready) {{ /* residual zero from boot */
        tt_fedcodec_init(&{P}_fed, {P}_fed_store, {len(st)}u, {P}_fed_read, {P}_fed_global,
                         {P}_fed_residual, (uint32_t)sizeof({P}_fed_residual[0]), {P}_fed_shift);
        {P}_fed_ready = 1;
    }}
    return &{P}_fed;
}}

static int {P}_dev_round_begin(uint32_t round, uint32_t device, uint32_t codec, uint32_t *gh, uint32_t *rcrc)
{{
    tt_fedcodec *c = {P}_fed_codec();
    int rc = tt_fedcodec_begin(c, codec, round, device);
    *gh = tt_fedcodec_global_hash(c);
    *rcrc = tt_fedcodec_residual_crc(c);
    return rc;
}}

/* The header's step is the optimizer step: meta[1] of the state blob (its last 12 bytes). */
static int {P}_dev_update_prepare(uint32_t n_samples, uint32_t *len, uint32_t *crc)
{{
    uint8_t b[4];
    (void){P}_read_state({U}_STATE_BYTES - 8u, b, 4u);
    return tt_fedcodec_prepare({P}_fed_codec(), n_samples,
                               (uint32_t)b[0] | ((uint32_t)b[1] << 8) | ((uint32_t)b[2] << 16) | ((uint32_t)b[3] << 24),
                               len, crc);
}}

static int {P}_dev_update_read(uint32_t off, uint8_t *dst, uint32_t n, uint32_t *len, uint32_t *crc)
{{
    const tt_fedcodec *c = {P}_fed_codec();
    if (!c->prepared) {{
        return TT_ERR_SEQUENCE;
    }}
    *len = c->msg_len;
    *crc = c->crc;
    if (off > *len) {{
        return TT_ERR_RANGE;
    }}
    return tt_fedcodec_read(c, off, dst, *len - off < n ? *len - off : n);
}}

static int {P}_dev_update_ack(uint32_t round, uint32_t crc, uint32_t accepted, uint32_t *status, uint32_t *rcrc)
{{
    tt_fedcodec *c = {P}_fed_codec();
    int rc = tt_fedcodec_ack(c, round, crc, accepted, status);
    *rcrc = tt_fedcodec_residual_crc(c);
    return rc;
}}

static int {P}_fed_write(uint32_t off, const uint8_t *src, uint32_t n)
{{
    return {P}_write_state(off, src, n);
}}

/* FED_PROX: FedProx's pull toward the ROUND_BEGIN snapshot (tt_fedcodec_prox). */
static int {P}_dev_fed_prox(uint32_t mult, uint32_t shift)
{{
    return tt_fedcodec_prox({P}_fed_codec(), {P}_fed_write, mult, shift);
}}
#else
#define {P}_dev_round_begin 0
#define {P}_dev_update_prepare 0
#define {P}_dev_update_read 0
#define {P}_dev_update_ack 0
#define {P}_dev_fed_prox 0
#endif
#if !TT_FEDCODEC
#define {P}_fed_res_bits 0u
#else
#define {P}_fed_res_bits ((uint32_t)TT_FED_RESIDUAL_BITS)
#endif
"""


def device_source(model, em: Emitted, shadow: bool = True, fedcodec: bool = False,
                  main: bool = True) -> str:
    """C source of the tt_device_model for the generated model `em` and the firmware's main().
    shadow=False leaves out the load shadow (state-sized RAM): LOAD_PARAMS then answers
    UNSUPPORTED and the parameters come from the firmware image. fedcodec=True compiles in the
    on-device update codec (TT_FEDCODEC 1, fedcodec_bytes(model) of RAM); either way the build
    flag -DTT_FEDCODEC=0/1 decides. main=False (a library for the user's own firmware) leaves out
    main() and the stack painting, which needs the bare-metal ports' linker symbols
    (-DTT_STACK_PAINT=1 puts it back; the user then calls <prefix>_stack_paint())."""
    P, U = em.prefix, em.prefix.upper()
    n = state_bytes(model)
    batch = int(model.opt.batch_size) if model.opt.accumulate else 0
    steps_expr = "meta[1] * %du + meta[2]" % batch if batch else "meta[2]"
    return f"""/** {P}_device: the generated model {P} behind the serial protocol (tt_device.h). Generated by
 *  tinytrain.codegen.device; do not edit. */
#include <stdint.h>
#include <string.h>

#include "{P}.h"
#include "tt_device.h"
#include "tt_port.h"

#define {U}_STATE_BYTES {n}u

/* GET_TENSOR id of a 4-byte (LE) reading: peak stack bytes used since boot (bare-metal ports,
 * by stack painting; 0 where unknown). */
#define {U}_TENSOR_STACK 0xFFFEu

#ifndef TT_STACK_PAINT
#define TT_STACK_PAINT {int(bool(main))}
#endif
#if TT_STACK_PAINT && !defined(ARDUINO)
/* Linker symbols of the bare-metal ports (tinytrain/firmware/ports/<port>/<port>.ld). */
extern uint32_t __stack_top__;
extern uint32_t __stack_size;
#define {U}_PAINT 0xA5A5A5A5u

static uint32_t *{P}_stack_low(void)
{{
    return (uint32_t *)((uintptr_t)&__stack_top__ - (uintptr_t)&__stack_size);
}}

/* Fill the unused stack below this frame (minus a margin) with a pattern. */
{"static " if main else ""}void {P}_stack_paint(void)
{{
    volatile uint32_t here = 0;
    uint32_t *lo = {P}_stack_low();
    uint32_t *p = (uint32_t *)(((uintptr_t)&here - 256u) & ~(uintptr_t)3u);
    while (p > lo) {{
        *--p = {U}_PAINT;
    }}
    (void)here;
}}

static uint32_t {P}_stack_used(void)
{{
    const uint32_t *p = {P}_stack_low();
    const uint32_t *top = (const uint32_t *)(uintptr_t)&__stack_top__;
    while (p < top && *p == {U}_PAINT) {{
        p++;
    }}
    return (uint32_t)((uintptr_t)top - (uintptr_t)p);
}}
#else
{"static " if main else ""}void {P}_stack_paint(void) {{ }}
static uint32_t {P}_stack_used(void) {{ return 0u; }}
#endif

/* LOAD_PARAMS stages here; the live state changes only in commit (atomic load). */
#define {U}_ATOMIC_LOAD {int(bool(shadow))}
#if {U}_ATOMIC_LOAD
static uint8_t {P}_shadow[{U}_STATE_BYTES];
#endif

static int {P}_dev_train(const int8_t *x, int32_t label, int32_t *loss_out)
{{
    if (label < 0 || label >= {U}_N_CLASSES) {{
        return TT_ERR_RANGE;
    }}
    (void){P}_train_step(x, label, loss_out);
    return TT_OK;
}}

/* Samples trained: from the meta tensor [prng, optimizer step, samples in batch] (last 12 bytes
 * of the state blob), so a loaded state carries its own step count. */
static uint32_t {P}_dev_steps(void)
{{
    uint8_t b[12];
    uint32_t meta[3], i;
    (void){P}_read_state({U}_STATE_BYTES - 12u, b, 12u);
    for (i = 0; i < 3u; i++) {{
        meta[i] = (uint32_t)b[4 * i] | ((uint32_t)b[4 * i + 1] << 8) | ((uint32_t)b[4 * i + 2] << 16)
                  | ((uint32_t)b[4 * i + 3] << 24);
    }}
    return {steps_expr};
}}

static int {P}_dev_read(uint32_t off, uint8_t *dst, uint32_t n)
{{
    return {P}_read_state(off, dst, n) == 0 ? TT_OK : TT_ERR_RANGE;
}}

#if {U}_ATOMIC_LOAD
static int {P}_dev_stage(uint32_t off, const uint8_t *src, uint32_t n)
{{
    if (off > {U}_STATE_BYTES || n > {U}_STATE_BYTES - off) {{
        return TT_ERR_RANGE;
    }}
    memcpy({P}_shadow + off, src, n);
    return TT_OK;
}}

static int {P}_dev_commit(void)
{{
    return {P}_write_state(0u, {P}_shadow, {U}_STATE_BYTES) == 0 ? TT_OK : TT_ERR_RANGE;
}}
#else
#define {P}_dev_stage 0
#define {P}_dev_commit 0
#endif

{_fedcodec_glue(P, U, model, fedcodec)}
/* The generated getter wants an in-range n; the protocol hook clips it. */
static int {P}_dev_tensor(uint16_t id, uint32_t off, uint8_t *dst, uint32_t n, uint32_t *total)
{{
    uint8_t probe;
    if (id == {U}_TENSOR_STACK) {{
        uint32_t v = {P}_stack_used(), i;
        *total = 4u;
        if (off > 4u) {{
            return TT_ERR_RANGE;
        }}
        for (i = off; i < 4u && i - off < n; i++) {{
            dst[i - off] = (uint8_t)(v >> (8u * i));
        }}
        return TT_OK;
    }}
    if ({P}_get_tensor(id, 0u, &probe, 0u, total) != 0 || off > *total) {{
        return TT_ERR_RANGE;
    }}
    if (n > *total - off) {{
        n = *total - off;
    }}
    return {P}_get_tensor(id, off, dst, n, total) == 0 ? TT_OK : TT_ERR_RANGE;
}}

const tt_device_model {P}_device = {{
    {U}_SCHEMA_HASH ? {U}_SCHEMA_HASH : 1u,
    {static_ram_bytes(em, model, shadow)}u /* model tensors + load shadow */
#if TT_FEDCODEC
        + {fedcodec_bytes(model, 0)}u + {sum(n for _, n, _ in fedcodec_store(model))}u * (TT_FED_RESIDUAL_BITS / 8u) /* + update codec */
#endif
    ,
    {U}_STATE_BYTES,
    {U}_INPUT_LEN,
    {U}_N_CLASSES,
    {P}_dev_train,
    {P}_predict,
    {P}_state_hash,
    {P}_dev_steps,
    {P}_dev_read,
    {P}_dev_stage,
    {P}_dev_commit,
    {P}_dev_tensor,
    {P}_set_seed,
    {P}_reset,
    {P}_dev_round_begin,
    {P}_dev_update_prepare,
    {P}_dev_update_read,
    {P}_dev_update_ack,
    {P}_dev_fed_prox,
    {P}_fed_res_bits,
}};

{_MAIN.format(P=P) if main else ""}"""


_MAIN = """
int main(void)
{{
    {P}_stack_paint();
    tt_port_init();
#if defined(ARDUINO)
    tt_device_begin(&{P}_device); /* loop() polls: ports/arduino/tt_arduino_main.cpp */
    return 0;
#else
    return tt_device_run(&{P}_device);
#endif
}}
"""


def device_header(em: Emitted) -> str:
    """<prefix>_device.h: the tt_device_model of a glue built with main=False."""
    P, U = em.prefix, em.prefix.upper()
    return f"""/** {P}_device: the generated model {P} behind the serial protocol (tt_device.h): pass
 *  &{P}_device to tt_device_begin() or tt_device_run(). Generated by tinytrain.codegen.device. */
#ifndef {U}_DEVICE_H
#define {U}_DEVICE_H

#include "tt_device.h"

#ifdef __cplusplus
extern "C" {{
#endif

extern const tt_device_model {P}_device;
/** Paint the unused stack (bare-metal ports, -DTT_STACK_PAINT=1) so GET_TENSOR 0xFFFE can
 *  report the peak stack; a no-op otherwise. Call first thing in main(). */
void {P}_stack_paint(void);

#ifdef __cplusplus
}}
#endif

#endif /* {U}_DEVICE_H */
"""


#: static RAM of the serial protocol state (sizeof(tt_proto), docs/protocol.md) plus the device loop
PROTOCOL_RAM = 700
