"""The fixed-point report: every tensor's Q-format, the range it actually uses, its headroom,
its saturation and underflow counts, and every accumulator's worst case against its width.

The counts come from replaying one epoch of training with the numpy reference (the
specification) on a *copy* of the model, in the training split's order: the saved model is not
changed. The replay starts from the saved state, so it measures the epoch that would come next,
which for a trained model is a close stand-in for its last one.

Q-format: a b-bit tensor at exponent e holds q * 2^e, written Qm.n with n = -e fractional bits
and m = b - 1 - n integer bits (the sign bit excluded; m < 0 when every value is below 2^m).
Headroom: the bits between the largest |q| seen and the type's limit (b - 1 - bitwidth(max|q|)).
Activations and errors have a per-step exponent chosen so that the largest value fills the
int8 range, so their headroom is ~0 by design; their saturations are the values clipped by that
requantization. A parameter's update underflow is a nonzero gradient whose step rounded to zero
(the optimizer's stats[2]); its fraction is over the nonzero gradient entries of the epoch.
"""
from __future__ import annotations

from collections import Counter

import numpy as np

from tinytrain.graph.optable import op_for


def qformat(bits: int, exp: int) -> str:
    n = -int(exp)
    return f"Q{bits - 1 - n}.{n}"


def _bitwidth(v: int) -> int:
    return int(v).bit_length()


class _Tensor:
    """Running record of one dynamically scaled tensor (activation or error)."""

    def __init__(self, size):
        self.size, self.exps, self.max_abs, self.sat, self.steps = size, Counter(), 0, 0, 0

    bits = 8  # the tensor's width: int8, or int16 under "activations": "int16"

    def add(self, a, e, nsat):
        self.sat += int(nsat)  # a backward that produces no input error may still saturate inside
        if a is None:
            return
        self.bits = 8 * np.asarray(a).dtype.itemsize
        self.exps[int(e)] += 1
        self.max_abs = max(self.max_abs, int(np.abs(np.asarray(a, np.int64)).max(initial=0)))
        self.steps += 1

    def as_dict(self):
        if not self.steps:
            return {"saturations": self.sat} if self.sat else None
        common = self.exps.most_common(1)[0][0]
        return {"dtype": f"int{self.bits}", "exp_range": [min(self.exps), max(self.exps)], "qformat": qformat(self.bits, common),
                "max_abs": self.max_abs, "headroom_bits": self.bits - 1 - _bitwidth(self.max_abs), "saturations": self.sat,
                "saturation_fraction": self.sat / (self.size * self.steps)}


def _bounds(layer) -> list:
    """The accumulator bounds of a layer's op; a composite's are its inner layers', named by
    their position in the block (``1 conv2d: forward sum``)."""
    op = op_for(layer)
    if op.composite:
        return [(f"{k} {l.kind}: {w}", b, bits) for k, l in enumerate(layer.inner) for w, b, bits in _bounds(l)]
    return op.bounds(layer)


def fixed_point_report(model, dataset, samples: int | None = None, progress=None) -> dict:
    """Replay ``samples`` (default: all) training samples on a copy of ``model`` with the
    reference and return the report (a JSON-able dict; ``format_report`` prints it)."""
    m = model.copy()
    sc0 = m.scaler.copy()
    x, y = dataset.x_train, dataset.y_train
    n = len(x) if samples is None else min(int(samples), len(x))
    flat = [(li, l) for li, l in enumerate(m.layers)]
    acts = {li: _Tensor(l.out_size) for li, l in flat}
    errs = {li: _Tensor(l.in_size) for li, l in flat}
    keys = [(li, pi) for li, l in flat for pi in range(len(l.params))]
    prange = {k: [None, None] for k in keys}
    psat, punder, pupd = Counter(), Counter(), Counter()

    for li, l in flat:
        fwd, bwd = l.ref_forward, l.ref_backward

        def rf(x_, ex, train, fwd=fwd, li=li):
            out = fwd(x_, ex, train)
            acts[li].add(out[0], out[1], out[2])
            return out

        def rb(e, ee, saved, need_dx, bwd=bwd, li=li):
            out = bwd(e, ee, saved, need_dx)
            errs[li].add(out[0], out[1], out[2])
            return out
        l.ref_forward, l.ref_backward = rf, rb

    apply_grad, apply_acc = m._apply_grad, m._apply_accumulated

    def ag(li, pi, g, eg, m_t, prng):
        s1, s2 = int(m.stats[1]), int(m.stats[2])
        apply_grad(li, pi, g, eg, m_t, prng)
        psat[(li, pi)] += int(m.stats[1]) - s1
        punder[(li, pi)] += int(m.stats[2]) - s2
        pupd[(li, pi)] += int(np.count_nonzero(g))

    def aa(li, pi, prng):
        s1 = int(m.stats[1])
        apply_acc(li, pi, prng)
        psat[(li, pi)] += int(m.stats[1]) - s1
    m._apply_grad, m._apply_accumulated = ag, aa

    for i in range(n):
        m.ref_train_step(x[i], y[i])
        for li, pi in keys:
            d = m.layers[li].params[pi].data
            lo, hi = int(d.min()), int(d.max())
            r = prange[(li, pi)]
            r[0] = lo if r[0] is None else min(r[0], lo)
            r[1] = hi if r[1] is None else max(r[1], hi)
        if progress is not None:
            progress.update(1)

    layers = []
    for li, l in flat:
        params = []
        for pi, p in enumerate(l.params):
            bits = p.data.dtype.itemsize * 8
            lo, hi = prange[(li, pi)]
            mx = max(abs(lo), abs(hi))
            learns = m.learns(li, pi)
            entry = {"name": p.name, "dtype": str(p.data.dtype), "exp": int(p.exp), "qformat": qformat(bits, p.exp),
                     "role": p.role if (learns or p.role == "state") else "frozen", "range": [lo, hi],
                     "headroom_bits": bits - 1 - _bitwidth(mx), "saturations": psat[(li, pi)]}
            if (li, pi) in m.master:
                ms = m.master[(li, pi)]
                entry["master"] = {"dtype": str(ms.dtype), "qformat": qformat(ms.dtype.itemsize * 8, m.master_exp((li, pi)))}
            if learns:
                upd = pupd[(li, pi)]
                entry.update({"gradient_entries": upd, "underflows": punder[(li, pi)],
                              "underflow_fraction": punder[(li, pi)] / upd if upd else 0.0})
            params.append(entry)
        bounds = [{"what": w, "bound": int(b), "width": int(bits), "bound_bits": _bitwidth(b) + 1,
                   "fits": _bitwidth(b) + 1 <= bits, "margin_bits": bits - 1 - _bitwidth(b)}
                  for w, b, bits in _bounds(l)]
        layers.append({"index": li, "layer": repr(l), "kind": l.kind, "params": params,
                       "activation": acts[li].as_dict(), "input_error": errs[li].as_dict(), "accumulators": bounds})
    under = sum(punder.values())
    upd = sum(pupd.values())
    return {"model": model.name, "samples": n, "replay": "one epoch of the training split, in order, "
            "with the reference on a copy of the model (the saved model is unchanged)",
            "layers": layers,
            "totals": {"act_saturations": int(m.stats[0] - model.stats[0]), "weight_saturations": sum(psat.values()),
                       "update_underflows": under, "gradient_entries": upd,
                       "underflow_fraction": under / upd if upd else 0.0},
            **_loss_scale(model, m, sc0, n)}


def _loss_scale(model, m, sc0, n) -> dict:
    """The loss scaler (graph/loss_scale.py): the saved model's state and what the replay saw."""
    ls = model.loss_scale
    if not ls.enabled:
        return {}
    return {"loss_scale": {"policy": str(ls), "mode": ls.mode, "exponent": int(model.scaler[0]),
                           "clean_steps": int(model.scaler[1]), "overflow_steps_total": int(model.scaler[2]),
                           "replay_overflow_steps": int(m.scaler[2] - sc0[2]),
                           "replay_overflow_fraction": int(m.scaler[2] - sc0[2]) / n if n else 0.0,
                           "replay_final_exponent": int(m.scaler[0]),
                           "overflow_means": "step skipped" if ls.mode == "global" else "error saturated, step applied"}}


def format_report(r: dict) -> str:
    """The report as a table: one row per tensor, then the accumulators."""
    rows = [f"fixed-point report of {r['model']}: {r['samples']} samples replayed ({r['replay']})",
            f"{'layer':<28} {'tensor':<14} {'dtype':<6} {'format':<9} {'range / max|q|':<18} {'headroom':>8} "
            f"{'saturated':>10} {'underflow':>10}"]
    for L in r["layers"]:
        name = f"{L['index']} {L['layer']}"[:28]
        for p in L["params"]:
            uf = f"{p['underflow_fraction']:.1%}" if "underflow_fraction" in p else "-"
            rng = f"[{p['range'][0]}, {p['range'][1]}]"
            rows.append(f"{name:<28} {p['name'] + ('' if p['role'] != 'frozen' else ' (frozen)'):<14} {p['dtype']:<6} "
                        f"{p['qformat']:<9} {rng:<18} {p['headroom_bits']:>8} {p['saturations']:>10} {uf:>10}")
            name = ""
        for what, t in (("activation", L["activation"]), ("input error", L["input_error"])):
            if t is None:
                continue
            if "qformat" not in t:  # no tensor, saturations inside (a composite's inner backward)
                rows.append(f"{name:<28} {what + ' (none)':<14} {'':<6} {'':<9} {'':<18} {'':>8} {t['saturations']:>10} {'-':>10}")
                name = ""
                continue
            fmt = t["qformat"] if t["exp_range"][0] == t["exp_range"][1] else f"{t['qformat']}*"
            rows.append(f"{name:<28} {what:<14} {t['dtype']:<6} {fmt:<9} {t['max_abs']:<18} {t['headroom_bits']:>8} "
                        f"{t['saturations']:>10} {'-':>10}")
            name = ""
        for a in L["accumulators"]:
            rows.append(f"{name:<28} {'acc: ' + a['what']:<34} bound 2^{a['bound_bits'] - 1:<3} in int{a['width']} "
                        f"({'fits, ' + str(a['margin_bits']) + ' bits spare' if a['fits'] else 'DOES NOT FIT'})")
            name = ""
    t = r["totals"]
    rows.append(f"totals: {t['act_saturations']} activation/error saturations, {t['weight_saturations']} weight "
                f"saturations, {t['update_underflows']} update underflows = {t['underflow_fraction']:.1%} of "
                f"{t['gradient_entries']} nonzero gradient entries")
    rows.append("* the exponent varies per step (dynamic): the most frequent format is shown, exp_range in --json")
    if "loss_scale" in r:
        s = r["loss_scale"]
        what = "skipped" if s["mode"] == "global" else "saturated"
        rows.append(f"loss scale {s['policy']}: exponent {s['exponent']} (2^{s['exponent']}), {s['clean_steps']} clean steps "
                    f"in a row, {s['overflow_steps_total']} steps {what} so far; the replay {what} "
                    f"{s['replay_overflow_steps']} of {r['samples']} ({s['replay_overflow_fraction']:.1%}) and ended at "
                    f"exponent {s['replay_final_exponent']}")
    return "\n".join(rows)
