"""Stochastic rounding of small steps: where the update shift passes 31 bits, and what each rule
of that shift makes of the steps (docs/precision.md, "Stochastic rounding of small steps").

    .venv/bin/python bench/dev/sr_bias.py --workload w3 --precision int8 --after 10 --steps 400
    .venv/bin/python bench/dev/sr_bias.py --workload w3 --precision int8 --trace   # per epoch

Default mode: the workload's model (seed 0) is trained `--after` epochs by the numba simulator,
then `--steps` more samples by the numpy reference with its update hooked (it still trains as
always). For every parameter tensor it prints the share of nonzero gradient entries whose
stochastic shift s = ew + k - eg exceeds 31, and for those entries the mean step in store units:
exact (v / 2^s), under the rule of graph/optim.py (floor by 2^(s - 31), then the 31-bit draw) and
under the rule before it (the 31-bit draw, then the floor), both as expected values over the draw
(computed, not sampled). `--trace`: per epoch of the whole recipe, test accuracy, saturations,
update underflows and the mean |q| of every weight and batch-norm gamma tensor (run it on an
older commit to see the old rule's drift). Float appears only in these reports.
"""
from __future__ import annotations

import argparse
import collections

import numpy as np

import tinytrain.graph.model as gm
from tinytrain.lab.precision import integer_model
from tinytrain.lab.workloads import WORKLOADS, epoch_orders
from tinytrain.sim.simulator import Simulator


def shift_report(wl, ds, precision: str, after: int, steps: int) -> dict:
    m = integer_model(wl, ds, 0, {"precision": precision})
    orders = list(epoch_orders(0, len(ds.x_train), wl.epochs))
    if after:
        sim = Simulator(m)
        for o in orders[:after]:
            sim.train(ds.x_train, ds.y_train, o)
    acc = collections.defaultdict(lambda: np.zeros(5))  # nonzero, nonzero with s > 31, exact, new, old
    orig, cur = gm.r_opt.update_direct_ref, {}

    def hooked(w, ew, g, eg, opt, m_t, prng, stats=None):
        s, v = ew + opt.k - eg, (m_t * g.astype(np.int64)).ravel()
        a = acc[cur["key"]]
        a[0] += np.count_nonzero(v)
        if s > 31 and opt.sr:
            xs = min(s - 31, 63)
            for x in (int(t) for t in v[v != 0]):
                q, f = x >> 31, (x & (2**31 - 1)) / 2**31
                a[1:] += (1, x / 2**s, (x >> xs) / 2**31, (1 - f) * (q >> xs) + f * ((q + 1) >> xs))
        return orig(w, ew, g, eg, opt, m_t, prng, stats)

    def grad(self, li, pi, g, eg, m_t, prng):
        cur["key"] = f"{li}:{type(self.layers[li]).__name__}.{self.layers[li].params[pi].name}"
        return apply_grad(self, li, pi, g, eg, m_t, prng)

    apply_grad = gm.Sequential._apply_grad
    gm.r_opt.update_direct_ref, gm.Sequential._apply_grad = hooked, grad
    try:
        for i in orders[after][:steps]:
            m.ref_train_step(ds.x_train[i], ds.y_train[i])
    finally:
        gm.r_opt.update_direct_ref, gm.Sequential._apply_grad = orig, apply_grad
    return {k: {"share_s_gt_31": a[1] / max(1, a[0]), "exact": a[2] / max(1, a[1]), "rule": a[3] / max(1, a[1]),
                "old_rule": a[4] / max(1, a[1])} for k, a in acc.items()}


def trace(wl, ds, precision: str):
    m = integer_model(wl, ds, 0, {"precision": precision})
    sim = Simulator(m)
    for ep, o in enumerate(epoch_orders(0, len(ds.x_train), wl.epochs)):
        s0 = m.stats.copy()
        sim.train(ds.x_train, ds.y_train, o)
        d = m.stats - s0
        mags = " ".join(f"{li}.{p.name} {np.abs(p.data.astype(np.int64)).mean():.1f}" for li, l in enumerate(m.layers)
                        for p in l.params if p.name in ("w", "gamma"))
        print(f"epoch {ep + 1:2d} test {100 * (sim.predict(ds.x_test) == ds.y_test).mean():6.2f} %  saturations "
              f"{d[1]:5d}  underflows {d[2]:8d}  mean |q|: {mags}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="w3", choices=sorted(WORKLOADS))
    ap.add_argument("--precision", default="int8")
    ap.add_argument("--after", type=int, default=10, help="epochs trained by the simulator first")
    ap.add_argument("--steps", type=int, default=400, help="samples trained by the hooked reference")
    ap.add_argument("--trace", action="store_true", help="per-epoch accuracy, counters and mean |q| instead")
    a = ap.parse_args(argv)
    wl = WORKLOADS[a.workload]
    ds = wl.load()
    if a.trace:
        return trace(wl, ds, a.precision)
    rep = shift_report(wl, ds, a.precision, a.after, a.steps)
    print(f"{a.workload} {a.precision}, seed 0, {a.steps} reference steps after {a.after} epochs; mean step of the "
          f"entries with s > 31, in store steps")
    print(f"{'tensor':24s} {'share s>31':>10s} {'exact':>10s} {'rule':>10s} {'old rule':>10s}")
    for k, r in rep.items():
        print(f"{k:24s} {r['share_s_gt_31']:10.3f} {r['exact']:+10.5f} {r['rule']:+10.5f} {r['old_rule']:+10.5f}")


if __name__ == "__main__":
    main()
