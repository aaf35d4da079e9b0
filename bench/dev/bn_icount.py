"""Batch norm's kernels alone on an emulated board: instructions per element of W3's two layers.

    .venv/bin/python bench/dev/bn_icount.py                    # M4 (mps2_an386), 4 training steps
    .venv/bin/python bench/dev/bn_icount.py --cpu cortex-m3 --steps 8

Captures the batch-norm calls of the first training steps of W3 (digits-cnn, the reference
trainer), writes them into one bare-metal image with tt_batchnorm.c (forward, backward, the
gradients from the backward's sums), runs it under QEMU with -icount and prints instructions per
element of each layer (the port's exact instruction counter), after checking every output
against the reference. A development tool for the kernels (seconds a run), not the benchmark:
bench/bench_device_parts.py measures the same calls inside the whole training step.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

MAIN = r"""
#include <stdint.h>
#include <string.h>
#include "tt_port.h"
#include "tt_batchnorm.h"
#include "bn_calls.h"

static int64_t scratch[BN_MAX_N > 3 * BN_MAX_C ? BN_MAX_N : 3 * BN_MAX_C];
static int32_t saved[5 * BN_MAX_C + 1], rm[BN_MAX_C], rv[BN_MAX_C], gg[BN_MAX_C], gb[BN_MAX_C];
static int8_t y[BN_MAX_N], dx[BN_MAX_N];

int main(void)
{
    uint32_t tot[BN_NLAYERS][3] = {{0}}, cnt[BN_NLAYERS] = {0};
    int32_t k, l, bad = 0;
    tt_port_init();
    for (k = 0; k < BN_NCALLS; k++) {
        const bn_call *t = &bn_calls[k];
        tt_stats st = {0};
        tt_ctx ctx = {scratch, &st};
        tt_batchnorm_params p;
        uint32_t t0, t1, t2, t3;
        memcpy(rm, t->rm, 4 * (size_t)t->C);
        memcpy(rv, t->rv, 4 * (size_t)t->C);
        p.P = t->P; p.C = t->C; p.gamma = t->gamma; p.e_g = t->e_g; p.beta = t->beta; p.e_b = t->e_b;
        p.rmean = rm; p.e_rm = t->e_rm; p.rvar = rv; p.e_rv = t->e_rv; p.eps_m = t->eps_m;
        p.eps_k = t->eps_k; p.mom_k = t->mom_k; p.saved = saved;
        t0 = tt_port_cycles();
        if (tt_batchnorm_fwd_s8(&ctx, &p, t->x, t->ex, y) != t->ey) bad = 1;
        t1 = tt_port_cycles();
        if (tt_batchnorm_bwd_s8(&ctx, &p, t->e, t->ee, t->x, dx) != t->edx) bad = 1;
        t2 = tt_port_cycles();
        tt_batchnorm_grad_saved_s32(&p, gg, gb);
        t3 = tt_port_cycles();
        if (memcmp(y, t->y, (size_t)(t->P * t->C)) || memcmp(dx, t->dx, (size_t)(t->P * t->C)) ||
            memcmp(rm, t->rm2, 4 * (size_t)t->C) || memcmp(rv, t->rv2, 4 * (size_t)t->C) ||
            memcmp(gg, t->gg, 4 * (size_t)t->C) || memcmp(gb, t->gb, 4 * (size_t)t->C)) bad = 1;
        tot[t->layer][0] += t1 - t0; tot[t->layer][1] += t2 - t1; tot[t->layer][2] += t3 - t2;
        cnt[t->layer] += (uint32_t)(t->P * t->C);
    }
    for (l = 0; l < BN_NLAYERS; l++) {
        tt_port_puts("L "); tt_port_putu32((uint32_t)l);
        tt_port_puts(" "); tt_port_putu32(tot[l][0]); tt_port_puts(" "); tt_port_putu32(tot[l][1]);
        tt_port_puts(" "); tt_port_putu32(tot[l][2]); tt_port_puts(" "); tt_port_putu32(cnt[l]); tt_port_puts("\r\n");
    }
    tt_port_puts(bad ? "MISMATCH\r\n" : "OK\r\n");
    return 0;
}
"""

CPUS = {"cortex-m4": (["-mcpu=cortex-m4", "-mthumb", "-mfpu=fpv4-sp-d16", "-mfloat-abi=hard"], "mps2-an386"),
        "cortex-m3": (["-mcpu=cortex-m3", "-mthumb", "-mfloat-abi=soft"], "mps2-an385")}


def capture(steps: int) -> list[dict]:
    """The batch-norm calls (inputs and reference outputs) of the first training steps of W3."""
    from tinytrain import data
    from tinytrain.graph import models
    from tinytrain.ops import batchnorm as rb
    from tinytrain.train import prepare_inputs

    ds = data.load("digits-image")
    model = models.build_model("digits-cnn", ds)
    X, Y, _, _ = prepare_inputs(model, ds)
    calls, fwd0, bwd0 = [], rb.forward, rb.backward

    def fwd(x, ex, gamma, e_g, beta, e_b, rm, e_rm, rv, e_rv, *, train, **cfg):
        out = fwd0(x, ex, gamma, e_g, beta, e_b, rm, e_rm, rv, e_rv, train=train, **cfg)
        calls.append(dict(x=np.array(x), ex=ex, gamma=np.array(gamma), e_g=e_g, beta=np.array(beta), e_b=e_b,
                          rm=np.array(rm), e_rm=e_rm, rv=np.array(rv), e_rv=e_rv, y=out[0], ey=out[1],
                          rm2=out[4], rv2=out[5], **cfg))
        return out

    def bwd(e, ee, x, ex, saved, gamma, e_g, *, train, need_dx=True):
        out = bwd0(e, ee, x, ex, saved, gamma, e_g, train=train, need_dx=need_dx)
        rec = [c for c in calls if c["x"].shape == x.shape and "e" not in c][-1]
        rec.update(e=np.array(e), ee=ee, dx=out[0], edx=out[1], gg=out[3][0][0], gb=out[3][1][0])
        return out

    rb.forward, rb.backward = fwd, bwd
    try:
        for i in np.random.default_rng(0).permutation(len(X))[:steps]:
            model.ref_train_step(X[i], Y[i])
    finally:
        rb.forward, rb.backward = fwd0, bwd0
    return [c for c in calls if "e" in c]


def header(calls: list[dict]) -> tuple[str, list]:
    shapes = sorted({c["x"].shape for c in calls}, key=lambda s: -int(np.prod(s[:-1])))
    arr = lambda n, a, t: f"static const {t} {n}[] = {{{', '.join(str(int(v)) for v in np.ravel(a))}}};\n"  # noqa: E731
    out = ["typedef struct { const int8_t *x, *e, *y, *dx; const int16_t *gamma; const int32_t *beta, *rm, *rv, *rm2,"
           " *rv2, *gg, *gb; int32_t layer, P, C, ex, ee, ey, edx, e_g, e_b, e_rm, e_rv, eps_m, eps_k, mom_k; } bn_call;\n"]
    rows = []
    for i, c in enumerate(calls):
        for n, t in (("x", "int8_t"), ("e", "int8_t"), ("y", "int8_t"), ("dx", "int8_t"), ("gamma", "int16_t"),
                     ("beta", "int32_t"), ("rm", "int32_t"), ("rv", "int32_t"), ("rm2", "int32_t"), ("rv2", "int32_t"),
                     ("gg", "int32_t"), ("gb", "int32_t")):
            out.append(arr(f"{n}{i}", c[n], t))
        C = c["x"].shape[-1]
        rows.append(f"{{x{i}, e{i}, y{i}, dx{i}, gamma{i}, beta{i}, rm{i}, rv{i}, rm2{i}, rv2{i}, gg{i}, gb{i}, "
                    f"{shapes.index(c['x'].shape)}, {c['x'].size // C}, {C}, {c['ex']}, {c['ee']}, {c['ey']}, {c['edx']}, "
                    f"{c['e_g']}, {c['e_b']}, {c['e_rm']}, {c['e_rv']}, {c['eps_m']}, {c['eps_k']}, {c['mom_k']}}}")
    out.append(f"#define BN_NCALLS {len(calls)}\n#define BN_NLAYERS {len(shapes)}\n"
               f"#define BN_MAX_N {max(c['x'].size for c in calls)}\n#define BN_MAX_C {max(c['x'].shape[-1] for c in calls)}\n")
    out.append("static const bn_call bn_calls[] = {\n  " + ",\n  ".join(rows) + "\n};\n")
    return "".join(out), shapes


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu", default="cortex-m4", choices=list(CPUS))
    ap.add_argument("--steps", type=int, default=4)
    a = ap.parse_args(argv)
    import tinytrain

    fw = Path(tinytrain.__file__).parent / "firmware"
    text, shapes = header(capture(a.steps))
    flags, machine = CPUS[a.cpu]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "bn_calls.h").write_text(text)
        (tmp / "main.c").write_text(MAIN)
        port = fw / "ports"
        subprocess.run(["arm-none-eabi-gcc", *flags, "-O2", "-std=c99", "-ffunction-sections", "-fdata-sections",
                        f"-I{fw / 'include'}", f"-I{tmp}", str(tmp / "main.c"), str(fw / "src" / "tt_batchnorm.c"),
                        str(fw / "src" / "tt_fixedpoint.c"), str(port / "mps2" / "startup_mps2.c"),
                        str(port / "mps2" / "tt_port_mps2.c"), str(port / "common" / "tt_port_common.c"),
                        "-T", str(port / "mps2" / "mps2.ld"), "-Wl,--gc-sections", "--specs=nano.specs",
                        "--specs=nosys.specs", "-o", str(tmp / "bn.elf")], check=True)
        r = subprocess.run(["qemu-system-arm", "-M", machine, "-nographic", "-semihosting", "-icount", "shift=7",
                            "-monitor", "none", "-serial", "stdio", "-kernel", str(tmp / "bn.elf")],
                           capture_output=True, text=True, timeout=300)
    lines = r.stdout.split()
    if "OK" not in lines:
        print(r.stdout)
        print("outputs differ from the reference")
        return 1
    print(f"W3 batch norm on {a.cpu} ({machine}), {a.steps} training steps; instructions per element:")
    for ln in r.stdout.splitlines():
        if ln.startswith("L "):
            _, l, f, b, g, n = ln.split()
            P = int(np.prod(shapes[int(l)][:-1]))
            print(f"  P = {P:3d}, C = {shapes[int(l)][-1]:2d}: forward {int(f) / int(n):6.2f}, backward {int(b) / int(n):6.2f}, "
                  f"gradients from its sums {int(g) / int(n):5.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
