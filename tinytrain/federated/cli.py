"""``tinytrain federate``: federated rounds over simulated devices, emulated boards or real
boards on serial ports (registered in tinytrain.cli's plugin list).

    tinytrain federate --simulated 4 --rounds 10 --model digits-mlp --partition dirichlet:0.5
    tinytrain federate --board mps2_an386 --devices 4 --rounds 5 --model digits-mlp --compress int8
    tinytrain federate --ports /dev/ttyACM0 /dev/ttyACM1 --rounds 5 --model digits-mlp --out runs/fed
"""
from __future__ import annotations

import sys
from pathlib import Path

from tinytrain import cli
from tinytrain.cli_device import _user_errors
from tinytrain.progress import progress_bar


def _round_logger(bar, logf):
    """log(line) for the round engine: the line (through tqdm when its bar is drawn) and one
    step of the bar per finished round."""
    def log(line):
        if line.startswith("round") and "accuracy" in line:
            bar.update(1)
        if bar.disable:
            print(line, file=logf, flush=True)
        else:
            bar.write(line, file=logf)
    return log


def _args(p):
    who = p.add_mutually_exclusive_group(required=True)
    who.add_argument("--simulated", type=int, metavar="K", help="K in-process simulated devices")
    who.add_argument("--board", help="an emulated board (QEMU), e.g. mps2_an386; with --devices K")
    who.add_argument("--ports", nargs="+", metavar="P", help="serial ports / pyserial URLs of boards "
                     "running this model's firmware")
    p.add_argument("--devices", type=int, default=4, help="number of emulated boards (with --board; default 4)")
    p.add_argument("--rounds", type=int, required=True)
    p.add_argument("--model", required=True, help="digits-mlp (built-in), a model file (.json/.toml) or a saved .tt")
    p.add_argument("--data", default=None, help="dataset (default: the model's)")
    cli.add_precision_arg(p)
    p.add_argument("--partition", default="iid", help="iid or dirichlet:ALPHA (default iid)")
    p.add_argument("--local-epochs", type=int, default=1, help="local epochs per round (default 1)")
    p.add_argument("--local-steps", type=int, default=None, help="cap on samples per device per round")
    from tinytrain.federated.codec import CODECS

    p.add_argument("--compress", choices=CODECS, default="none",
                   help="update (and broadcast) compression, with error feedback")
    p.add_argument("--compress-down", choices=CODECS, default=None,
                   help="broadcast compression (default: as --compress)")
    p.add_argument("--preloaded", action="store_true", help="the devices already hold the initial "
                   "model (flashed with it, or built from the same model and seed): round 1's "
                   "compressed broadcast is a delta against it instead of the model whole")
    p.add_argument("--residual-bits", type=int, default=32, metavar="64|32|16", help="width of the "
                   "devices' error-feedback residual, saturating below 64 (default 32; boards are built "
                   "with it: 16 lets smaller boards keep it)")
    p.add_argument("--quorum", type=float, default=0.5, help="valid updates a round needs: a fraction "
                   "of the devices (< 1) or a count (default 0.5)")
    p.add_argument("--server-momentum", type=float, default=0.0, metavar="BETA", help="FedAvgM: "
                   "server momentum on the mean update, in [0, 0.99] (default 0: plain FedAvg)")
    p.add_argument("--server-lr", type=float, default=1.0, metavar="ETA", help="FedAvgM: server "
                   "learning rate, in (0, 4] (default 1)")
    p.add_argument("--prox-mu", type=float, default=0.0, metavar="MU", help="FedProx: proximal term "
                   "mu/2 |w - w_global|^2 on the devices (default 0: none)")
    p.add_argument("--prox-every", type=int, default=16, metavar="N", help="FedProx: samples between "
                   "two pulls toward the global model (default 16; 1: every step)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=1, metavar="W", help="processes that run the "
                   "simulated devices (with --simulated; default 1; 0: one per core)")
    from tinytrain.cli_device import add_link_args

    add_link_args(p, "10 s", "10 with --ports, 0 on emulated boards: their local socket loses no bytes")
    p.add_argument("--out", default=None, help="directory: global model after every round "
                   "(global.tt), rounds/, federated.png")
    p.add_argument("--resume", action="store_true", help="continue from --out/global.tt")
    p.add_argument("--plot", nargs="?", const=True, default=None, metavar="FILE", help="write the "
                   "accuracy/bytes PNG: to FILE, or with no FILE to OUT/federated.png (written there "
                   "by default whenever --out is given)")
    p.add_argument("--json", action="store_true", help="print a JSON summary as the last line")


def _run(args) -> int:
    import json

    from tinytrain.federated.api import federate

    for opt, v in (("--rounds", args.rounds), ("--simulated", args.simulated), ("--local-epochs", args.local_epochs),
                   ("--local-steps", args.local_steps), ("--devices", args.devices)):
        if v is not None and v < 1:
            raise ValueError(f"{opt} must be >= 1, got {v}")
    if args.workers < 0 or (args.workers != 1 and args.simulated is None):
        raise ValueError(f"--workers {args.workers}: give a count >= 1 (0: one per core), "
                         "and only with --simulated (boards already run in parallel)")
    if args.workers == 0:
        import os

        args.workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    k = args.simulated if args.simulated is not None else len(args.ports) if args.ports else args.devices
    if not 0 < args.quorum <= k:
        raise ValueError(f"--quorum must be a fraction in (0, 1) or a count 1..{k} of the {k} devices, "
                         f"got {args.quorum:g}")
    if args.resume and not args.out:
        raise ValueError("--resume needs --out")
    from tinytrain.graph import io as tio

    if args.plot is True:
        if not args.out:
            raise ValueError("--plot without a FILE writes OUT/federated.png: give --out DIR or --plot FILE")
        args.plot = str(Path(args.out) / "federated.png")
    for path, folder in ((args.out, True), (args.plot, False)):
        if path:
            tio.check_writable(path, folder)
    logf = sys.stderr if args.json else sys.stdout
    with progress_bar(total=args.rounds, desc="federate", unit="round", json=args.json) as bar:
        r = federate(args.model, args.data, simulated=args.simulated, board=args.board,
                     devices=args.devices if args.board else None, ports=args.ports, rounds=args.rounds,
                     partition=args.partition, local_epochs=args.local_epochs, local_steps=args.local_steps,
                     compress=args.compress, compress_down=args.compress_down, seed=args.seed, quorum=args.quorum, out=args.out,
                     resume=args.resume, plot=args.plot,
                     timeout=10.0 if args.timeout is None else args.timeout, retries=args.retries,
                     log=_round_logger(bar, logf), workers=args.workers,
                     server_momentum=args.server_momentum, server_lr=args.server_lr,
                     prox_mu=args.prox_mu, prox_every=args.prox_every, preloaded=args.preloaded,
                     residual_bits=args.residual_bits, precision=cli.precision_arg(args.precision))
    r["compress_down"] = args.compress_down or args.compress
    if args.json:
        hist = r.pop("history")
        r["seconds_per_round"] = [e["seconds"] for e in hist]
        r["history"] = [{k: e[k] for k in ("round", "accuracy", "accepted", "bytes_up", "bytes_down")}
                        | {"dropped": [d["device"] for d in e["dropped"]]} for e in hist]
        print(json.dumps(r, sort_keys=True))
    else:
        print(f"done: {r['rounds']} rounds, final accuracy {r['final_accuracy']:.4f}, "
              f"{r['bytes_on_wire']} bytes on the wire, {r['dropped_updates']} dropped updates"
              + (f", global model {r['global_model']}" if r.get("global_model") else ""))
    return 0


cli.register("federate", "federated training over simulated devices, emulated or real boards",
             _args, _user_errors(_run))


# ------------------------------------------------------------------ federate-gateway

def _gateway_args(p):
    who = p.add_mutually_exclusive_group(required=True)
    who.add_argument("--board", help="emulated board (QEMU), one instance per device the node serves")
    who.add_argument("--ports", nargs="+", metavar="P", help="serial ports / pyserial URLs of the boards "
                     "on this host, running the run's model firmware, in device order")
    p.add_argument("--listen", default="127.0.0.1:7801", metavar="HOST:PORT",
                   help="address for the SuperNode's ClientApp (default 127.0.0.1:7801; keep it local)")
    from tinytrain.cli_device import add_link_args

    add_link_args(p, "10 s", "10 with --ports, 0 on emulated boards")


def _gateway_run(args) -> int:
    from tinytrain.federated.gateway import Gateway, serve

    host, _, port = args.listen.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--listen {args.listen!r}: give HOST:PORT, e.g. 127.0.0.1:7801")
    if args.board:
        from tinytrain.device.boards import get_board

        if not get_board(args.board).is_emulated:
            raise ValueError(f"{args.board} is a real board: flash it and give its serial ports (--ports)")
    gw = Gateway(board=args.board, ports=args.ports, timeout=10.0 if args.timeout is None else args.timeout,
                 retries=args.retries)
    try:
        serve(gw, host, int(port), ready=lambda srv: print(
            f"tinytrain gateway listening on {host}:{srv.server_address[1]}", file=sys.stderr, flush=True))
    except OSError as e:
        raise ValueError(f"--listen {args.listen}: {e.strerror or e}: choose a free port") from None
    return 0


cli.register("federate-gateway", "serve this host's boards to the Flower SuperNode on it (deployment)",
             _gateway_args, _user_errors(_gateway_run))
