"""`tinytrain shrink`: a model trained with structured pruning, without its pruned units
(tinytrain.graph.convert.shrink; docs/pruning.md, "Structured pruning")."""
from __future__ import annotations

import argparse
import os

from tinytrain import cli


def _args(p):
    p.add_argument("--model", required=True, help="a saved model (.tt) trained with structured pruning "
                   "(structure \"neurons\" or \"channels\"), its schedule finished")
    p.add_argument("--out", required=True, help="the smaller model (.tt) to write")
    p.add_argument("--data", default=None, help="check on this dataset's test split that the two models predict "
                   "the same class for every sample (default: the dataset the model records; 'none' skips it)")
    p.add_argument("--force", action="store_true", help="replace --out if it exists")
    p.add_argument("--json", action="store_true", help="print only a JSON summary on stdout")
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = ("examples:\n"
                "  tinytrain train --data digits-image --model digits-cnn --epochs 20 --out runs/w3-c50.tt \\\n"
                "      --prune '{\"schedule\": \"polynomial\", \"final_sparsity\": 0.5, \"end_step\": 14370, "
                "\"structure\": \"channels\"}'\n"
                "  tinytrain shrink --model runs/w3-c50.tt --out runs/w3-c50-small.tt\n"
                "  tinytrain verify --board mps2_an386 --model runs/w3-c50-small.tt   # like any model\n"
                "  tinytrain shrink --model runs/w3-c50.tt --out small.tt --force --json")


def summary(model, small) -> dict:
    """What shrink removed: per shrunk layer its units before and after; parameters."""
    from tinytrain.graph import prune_groups as pg

    layers = {str(li): {"kind": model.layers[li].kind, "units": int(p.size), "kept": int((~p).sum())}
              for li, p in pg.pruned_units(model).items()}
    return {"layers": layers, "params": model.param_count(), "params_after": small.param_count()}


def _run(args) -> int:
    from tinytrain import data
    from tinytrain.graph import io as tio
    from tinytrain.graph.convert import shrink

    tio.check_writable(args.out)
    if os.path.exists(args.out) and not args.force:
        raise ValueError(f"--out {args.out} exists: pass --force to replace it, or choose another --out")
    model, extra = tio.load(args.model)
    small = shrink(model)
    out = {"model": args.model, "out": args.out, **summary(model, small)}
    name = args.data or extra.get("dataset")
    if name and name != "none":
        from tinytrain.sim.simulator import Simulator
        from tinytrain.train import prepare_inputs

        ds = data.load(name)
        _, _, xt, _ = prepare_inputs(model, ds)
        a, b = Simulator(model).predict(xt), Simulator(small).predict(xt)
        if list(a) != list(b):  # the contract: a bug, never bad input
            raise RuntimeError(f"shrink changed the prediction of test sample {int((a != b).argmax())}")
        out["checked"] = {"data": ds.name, "samples": int(len(xt)), "same_predictions": True}
    tio.save(small, args.out, extra)
    if args.json:
        cli._emit_json(out)
        return 0
    for li, d in out["layers"].items():
        print(f"layer {li} ({d['kind']}): {d['kept']} of {d['units']} units kept")
    print(f"parameters: {out['params']} -> {out['params_after']}; saved to {args.out}")
    if "checked" in out:
        print(f"the same prediction as {args.model} on all {out['checked']['samples']} test samples of "
              f"{out['checked']['data']}")
    return 0


cli.register("shrink", "delete the pruned units of a model trained with structured pruning (smaller layers)",
             _args, _run)
