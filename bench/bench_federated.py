"""Federated W1 (digits-mlp): accuracy next to centralized integer training, bytes on the wire
per codec, the cost of 1,000 simulated clients in one round, and (with QEMU) 4 emulated boards
against simulated devices.

    python bench/bench_federated.py            # all, QEMU part if qemu-system-arm is present
    python bench/bench_federated.py --no-qemu
    python bench/bench_federated.py --only scale [--repeats 5]   # just the 10,000-client round
    python bench/bench_federated.py --only noniid   # FedAvgM / FedProx, Dirichlet 0.5, 10 seeds
    python bench/bench_federated.py --only residual # error-feedback residual in int64/32/16

Writes bench/results/federated.json and the `federated` section of BENCHMARKS.md; the scale
part (10,000 clients of mnist1d:100000, the whole `tinytrain federate` command timed from
process start, 1 and 2 worker processes) writes federated-scale.json and its own section.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import report  # noqa: E402

from tinytrain.federated import CODECS, federate, resolve  # noqa: E402
from tinytrain.train import fit  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--qemu", action=argparse.BooleanOptionalAction, default=shutil.which("qemu-system-arm") is not None)
    ap.add_argument("--clients", type=int, default=1000)
    ap.add_argument("--only", choices=("all", "scale", "flower-scale", "codecs", "noniid", "residual"), default="all")
    ap.add_argument("--repeats", type=int, default=5, help="runs per figure of the scale part (median)")
    ap.add_argument("--flower-clients", type=int, default=10_000)
    a = ap.parse_args(argv)
    if a.only == "flower-scale":
        flower_scale(a.flower_clients)
        return 0
    if a.only == "noniid":
        noniid()
        return 0
    if a.only == "residual":
        residual_widths()
        return 0
    codec_grid()
    if a.only == "codecs":
        return 0
    scale(a.repeats)
    if a.only == "scale":
        return 0
    model, ds = resolve("digits-mlp", "digits")
    res = {"machine": report.machine(), "workload": "W1 digits-mlp, 1437 train / 360 test, seed 0"}

    cen = {}
    for ep in (10, 20):
        m = resolve("digits-mlp", ds)[0]
        cen[ep] = fit(m, ds, ep, seed=0, progress=False).last["test_accuracy"]
    res["centralized"] = cen
    rows = [["centralized integer, 10 epochs", f"{100 * cen[10]:.2f} %", "", ""],
            ["centralized integer, 20 epochs", f"{100 * cen[20]:.2f} %", "", ""]]
    fed = {}
    for part in ("iid", "dirichlet:0.5"):
        for E in (1, 2):
            r = federate(model, ds, simulated=4, rounds=10, partition=part, local_epochs=E)
            fed[f"{part} E={E}"] = r["final_accuracy"]
            rows.append([f"4 devices, 10 rounds, {part}, {E} local epoch(s)", f"{100 * r['final_accuracy']:.2f} %",
                         f"{100 * (r['final_accuracy'] - cen[10 * E]):+.2f}",
                         " ".join(f"{100 * x:.1f}" for x in r["accuracy_per_round"])])
    res["federated_accuracy"] = fed
    acc_table = report.markdown_table(["run", "test accuracy", "vs centralized, same sample visits",
                                       "accuracy per round (%)"], rows)

    codecs, crow = {}, []
    int32 = None
    for c in CODECS:
        r = federate(model, ds, simulated=4, rounds=10, partition="iid", compress=c)
        msgs = 2 * 4 * 10
        int32 = msgs * 4 * r["params"]
        codecs[c] = {k: r[k] for k in ("final_accuracy", "bytes_up", "bytes_down", "bytes_on_wire")}
        crow.append([c, f"{100 * r['final_accuracy']:.2f} %",
                     f"{100 * (r['final_accuracy'] - codecs['none']['final_accuracy']):+.2f}",
                     f"{r['bytes_up']:,}", f"{r['bytes_down']:,}", f"{r['bytes_on_wire']:,}",
                     f"{int32 / r['bytes_on_wire']:.2f}×",
                     f"{codecs['none']['bytes_on_wire'] / r['bytes_on_wire']:.2f}×"])
    res["codecs"] = codecs
    res["int32_params_bytes"] = int32
    codec_table = report.markdown_table(["codec (up and down)", "accuracy", "vs none (points)", "bytes up",
                                         "bytes down", "bytes total", "cut vs int32 params",
                                         "cut vs native (none)"], crow)

    t0 = time.perf_counter()
    r = federate(model, ds, simulated=a.clients, rounds=2, compress="int8")
    per = r["history"][-1]["seconds"]
    res["many_clients"] = {"clients": a.clients, "round_seconds": per, "us_per_client": 1e6 * per / a.clients,
                           "total_seconds_2_rounds": time.perf_counter() - t0}

    if a.qemu:
        kw = dict(rounds=5, partition="dirichlet:0.5", local_steps=60, compress="int8")
        t0 = time.perf_counter()
        b = federate(model, ds, board="mps2_an386", devices=4, **kw)
        tb = time.perf_counter() - t0
        s = federate(model, ds, simulated=4, **kw)
        res["qemu"] = {"boards": 4, "board": "mps2_an386", **kw, "seconds": tb,
                       "serial_bytes": b["serial_bytes"], "bytes_on_wire": b["bytes_on_wire"],
                       "accuracy_per_round": b["accuracy_per_round"], "state_hash_boards": b["state_hash"],
                       "state_hash_simulated": s["state_hash"], "bit_identical": b["state_hash"] == s["state_hash"]}
    path = report.write_json("federated.json", res)

    body = [
        "## Federated W1 (digits-mlp)",
        "",
        f"`python bench/bench_federated.py`. Machine: {report.machine_line(res['machine'])}. "
        "Integer FedAvg (round half up, weighted by samples), optimizer buffers reset each round, "
        "seed 0. Simulated devices share one compiled simulator.",
        "",
        acc_table,
        "",
        "Bytes on the wire, 4 devices × 10 rounds, IID, 1 local epoch: serialized federated "
        "messages (global model down, update up, headers and CRC included). 'int32 params' = "
        f"{int32:,} B, every message carrying all {r['params']} parameters as int32; 'native' = "
        "codec none (int16 weights, int32 biases, full state blob up).",
        "",
        codec_table,
        "",
        f"**{a.clients:,} simulated clients in one round** (IID, int8, ~1.4 samples each): "
        f"{per:.2f} s for the round, {res['many_clients']['us_per_client']:.0f} µs per client "
        "(train, compress, CRC, verify, aggregate).",
    ]
    if "qemu" in res:
        q = res["qemu"]
        body += ["", f"**4 emulated boards** (QEMU {q['board']}, W1 firmware, non-IID dirichlet:0.5, "
                 f"5 rounds × 60 local samples, int8 updates encoded on the boards by tt_fedcodec): "
                 f"{q['seconds']:.1f} s; accuracy per round "
                 + ", ".join(f"{100 * x:.1f}" for x in q["accuracy_per_round"])
                 + f" %; final global model state hash {q['state_hash_boards']} vs simulated devices "
                 f"{q['state_hash_simulated']}: {'bit-identical' if q['bit_identical'] else 'DIFFERENT'}; "
                 f"federated messages {q['bytes_on_wire']:,} B, serial traffic {q['serial_bytes']:,} B "
                 "(full state blob down, compressed update up, framing included)."]
    report.update_section("federated", "\n".join(body))
    print("\n".join(body))
    print(f"wrote {path.relative_to(report.ROOT)} and {report.BENCHMARKS_MD.name}")
    return 0


SCALE = ["federate", "--simulated", "10000", "--rounds", "1", "--model", "digits-mlp",
         "--data", "mnist1d-flat:100000", "--compress", "int8", "--json"]


def _load() -> str:
    return " ".join(open("/proc/loadavg").read().split()[:3]) if os.path.exists("/proc/loadavg") else "?"


def scale(repeats: int) -> dict:
    """Wall time of one round of 10,000 clients x 10 samples, whole command from process start
    (interpreter, imports, cached dataset, cached numba build, round, evaluation on 25,000 test
    samples), median and range of `repeats` runs per worker count, load average beside it."""
    import tempfile

    from tinytrain import data

    data.load("mnist1d-flat:100000")  # in the default cache, for the timed runs
    with tempfile.TemporaryDirectory() as tmp:  # the one-off generation, timed apart
        t0 = time.perf_counter()
        data.load_mnist1d("flat", n_train=100_000, cache=tmp)
        gen = time.perf_counter() - t0
    exe = [sys.executable, "-m", "tinytrain"]
    subprocess.run(exe + SCALE, check=True, capture_output=True)  # warm the numba cache
    res = {"command": "tinytrain " + " ".join(SCALE), "dataset_first_load_seconds": gen, "runs": {}}
    import json

    runs = {w: {"wall_seconds": [], "round_seconds": [], "load_before": [], "state_hashes": set()} for w in (1, 2)}
    for _ in range(repeats):  # interleaved, so that both counts meet the same load
        for w, r in runs.items():
            r["load_before"].append(_load())
            t = time.perf_counter()
            p = subprocess.run(exe + SCALE + ["--workers", str(w)], check=True, capture_output=True, text=True)
            r["wall_seconds"].append(time.perf_counter() - t)
            out = json.loads(p.stdout)
            r["state_hashes"].add(out["state_hash"])
            r["round_seconds"].append(out["seconds_per_round"][-1])
    for w, r in runs.items():
        res["runs"][w] = dict(r, state_hashes=sorted(r["state_hashes"]))
    res["bit_identical"] = len(set().union(*(set(r["state_hashes"]) for r in res["runs"].values()))) == 1
    res["machine"] = report.machine()
    path = report.write_json("federated-scale.json", res)
    med = lambda v: f"{statistics.median(v):.2f} s ({min(v):.2f}–{max(v):.2f})"  # noqa: E731
    rows = [[w, med(r["wall_seconds"]), med(r["round_seconds"]), "; ".join(r["load_before"])]
            for w, r in res["runs"].items()]
    body = "\n".join([
        "## Federated scale: 10,000 simulated clients",
        "",
        f"`python bench/bench_federated.py --only scale --repeats {repeats}`: `{res['command']} "
        "--workers W`, timed from process start to exit (Python start-up, imports, the cached "
        "dataset, the cached numba build, one round of 10,000 clients x 10 samples with int8 updates "
        "verified and aggregated by the coordinator, evaluation on 25,000 test samples). "
        f"Machine: {report.machine_line(res['machine'])}. Median (min–max) of {repeats} runs, 1 and 2 "
        "workers alternating; the "
        "load average before each run is given because other jobs shared the machine. "
        f"Generating mnist1d:100000 the first time: {gen:.0f} s (then cached). Global model "
        f"{'bit-identical' if res['bit_identical'] else 'DIFFERENT'} across worker counts "
        f"(state hash {', '.join(sorted(res['runs'][1]['state_hashes']))}).",
        "",
        report.markdown_table(["workers", "command wall", "round (engine)", "load average (1, 5, 15 min) before each run"], rows),
    ])
    report.update_section("federated-scale", body)
    print(body)
    print(f"wrote {path.relative_to(report.ROOT)} and {report.BENCHMARKS_MD.name}")
    return res


def codec_grid() -> dict:
    """Bytes vs accuracy of every codec (up and down), W1, 10 rounds, 1 local epoch: 4 and 100
    devices, IID and Dirichlet 0.5; bytes against int32 parameters in every message, with round
    1's broadcast whole (the default) and as a delta against the initial model the devices were
    flashed with (--preloaded: the same training, fewer bytes). Then seeds 0-2 for the codecs
    near the target (>= 20x fewer bytes than int32 parameters within 1.0 point of none)."""
    import statistics as stt

    model, ds = resolve("digits-mlp", "digits")
    res, rows = {}, []
    for k in (4, 100):
        for part in ("iid", "dirichlet:0.5"):
            base = None
            for c in CODECS:
                r = federate(model, ds, simulated=k, rounds=10, partition=part, compress=c)
                pre = r if c == "none" else federate(model, ds, simulated=k, rounds=10, partition=part,
                                                     compress=c, preloaded=True)
                assert pre["state_hash"] == r["state_hash"]  # preloading changes bytes only
                int32 = 2 * k * 10 * 4 * r["params"]
                base = r["final_accuracy"] if c == "none" else base
                res[f"{k} {part} {c}"] = {"accuracy": r["final_accuracy"], "bytes_on_wire": r["bytes_on_wire"],
                                          "cut_vs_int32": int32 / r["bytes_on_wire"],
                                          "bytes_on_wire_preloaded": pre["bytes_on_wire"],
                                          "cut_vs_int32_preloaded": int32 / pre["bytes_on_wire"]}
                rows.append([k, part, c, f"{100 * r['final_accuracy']:.2f} %",
                             f"{100 * (r['final_accuracy'] - base):+.2f}", f"{r['bytes_on_wire']:,}",
                             f"{int32 / r['bytes_on_wire']:.1f}×", f"{pre['bytes_on_wire']:,}",
                             f"{int32 / pre['bytes_on_wire']:.1f}×"])
    seeds, srows = (0, 1, 2), []
    for k in (4, 100):
        for part in ("iid", "dirichlet:0.5"):
            acc = {c: [federate(model if s == 0 else resolve("digits-mlp", ds, s)[0], ds, simulated=k, rounds=10,
                                partition=part, compress=c, seed=s)["final_accuracy"] for s in seeds]
                   for c in SEEDED_CODECS}
            for c in SEEDED_CODECS:
                d = stt.mean(acc[c]) - stt.mean(acc["none"])
                res[f"seeds {k} {part} {c}"] = acc[c]
                srows.append([k, part, c, f"{100 * stt.mean(acc[c]):.2f} %", f"{100 * d:+.2f}",
                              " ".join(f"{100 * a:.1f}" for a in acc[c]),
                              f"{res[f'{k} {part} {c}']['cut_vs_int32_preloaded']:.1f}×"])
    res["machine"] = report.machine()
    report.write_json("federated-codecs.json", res)
    body = "\n".join([
        "## Federated update codecs: bytes vs accuracy",
        "",
        "`python bench/bench_federated.py --only codecs`: W1 digits-mlp, 10 rounds, 1 local epoch, "
        "seed 0, the same codec up (updates, error feedback on the device) and down (broadcast "
        "deltas against the previous broadcast). Bytes: every federated message, headers and CRC "
        "included; 'cut' against int32 parameters in every message (2 × devices × rounds × 4 B × "
        "parameters). Round 1 sends the model whole; 'preloaded' (`--preloaded`): the devices were "
        "flashed with the initial model, so round 1's broadcast is a delta against it like every "
        "later one - the same training bit for bit (checked here), fewer bytes. signmv: sign with "
        "majority vote (the devices send signs as for sign; the coordinator moves every element by "
        "the sign of the sample-weighted vote at the devices' mean scale).",
        "",
        report.markdown_table(["devices", "partition", "codec", "accuracy", "vs none (points)",
                               "bytes on the wire", "cut vs int32 params", "bytes, preloaded",
                               "cut, preloaded"], rows),
        "",
        "Seeds 0, 1, 2 (model init, partition, orders), mean test accuracy; 'cut' as above, preloaded:",
        "",
        report.markdown_table(["devices", "partition", "codec", "accuracy (mean)", "vs none (points)",
                               "per seed (%)", "cut vs int32, preloaded"], srows),
    ])
    report.update_section("federated-codecs", body)
    print(body)
    return res


#: codecs run on three seeds in the codec grid (those near the bytes/accuracy target)
SEEDED_CODECS = ("none", "int4", "sign", "signmv", "topk16")


#: the non-IID remedies compared (federate keyword arguments); FedAvgM's (0.5, 0.8) was picked
#: from a grid on seeds 0-4 (docs/federated.md, "Non-IID"); seeds 5-9 are held out from that choice
REMEDIES = {
    "FedAvg": {},
    "FedAvgM beta 0.5, eta 0.8": {"server_momentum": 0.5, "server_lr": 0.8},
    "FedProx mu 0.01, pull every 16": {"prox_mu": 0.01, "prox_every": 16},
    "FedAvgM + FedProx": {"server_momentum": 0.5, "server_lr": 0.8, "prox_mu": 0.01, "prox_every": 16},
}
NONIID_SEEDS = {"selection (seeds 0-4)": [0, 1, 2, 3, 4], "held out (seeds 5-9)": [5, 6, 7, 8, 9]}


def noniid() -> dict:
    """W1, 4 devices x 10 rounds, Dirichlet 0.5, 1 local epoch, against centralized integer
    training for 10 epochs (the same sample visits), per seed (model init, partition, orders)."""
    import statistics as stt

    res = {"machine": report.machine(), "remedies": REMEDIES, "seeds": NONIID_SEEDS, "runs": {}}
    every = [s for v in NONIID_SEEDS.values() for s in v]
    cen = {}
    for s in every:
        m, ds = resolve("digits-mlp", "digits", s)
        cen[s] = fit(m, ds, 10, seed=s, progress=False).last["test_accuracy"]
    res["centralized"] = cen
    for name, kw in REMEDIES.items():
        res["runs"][name] = {s: federate("digits-mlp", "digits", simulated=4, rounds=10, seed=s,
                                         partition="dirichlet:0.5", **kw)["final_accuracy"] for s in every}
    report.write_json("federated-noniid.json", res)
    pct = lambda v: f"{100 * stt.mean(v):.2f} %"  # noqa: E731
    rows = []
    for group, seeds in [*NONIID_SEEDS.items(), ("all 10 seeds", every)]:
        c = [cen[s] for s in seeds]
        rows.append([group, "centralized, 10 epochs", pct(c), "", " ".join(f"{100 * cen[s]:.1f}" for s in seeds)])
        for name in REMEDIES:
            a = [res["runs"][name][s] for s in seeds]
            rows.append([group, name, pct(a), f"{100 * (stt.mean(a) - stt.mean(c)):+.2f}",
                         " ".join(f"{100 * res['runs'][name][s]:.1f}" for s in seeds)])
    body = "\n".join([
        "## Federated non-IID: FedAvgM and FedProx (integer)",
        "",
        "`python bench/bench_federated.py --only noniid`: W1 digits-mlp, 4 simulated devices x 10 rounds, "
        "Dirichlet 0.5, 1 local epoch, no compression, against centralized integer training for 10 epochs "
        "(the same sample visits); each seed sets the model init, the partition and the orders. "
        "FedAvgM: server momentum beta and server learning rate eta on the mean update "
        "(tinytrain/federated/server.py); FedProx: the proximal pull toward the global model on the "
        "devices (tinytrain/federated/prox.py). FedAvgM's (0.5, 0.8) was chosen on seeds 0-4 from a "
        "grid of 9 (beta, eta) pairs on this same test split (no validation split: optimistic); seeds "
        "5-9 were not used for the choice. 360 test samples: one sample is 0.28 points. "
        f"Machine: {report.machine_line(res['machine'])}.",
        "",
        report.markdown_table(["seeds", "run", "test accuracy (mean)", "vs centralized (points)",
                               "per seed (%)"], rows),
    ])
    report.update_section("federated-noniid", body)
    print(body)
    return res


def residual_widths() -> dict:
    """The devices' error-feedback residual kept in int64, int32 (default) or int16: accuracy and
    saturated elements per codec (W1, 10 rounds, seed 0, Dirichlet 0.5, 4 and 100 devices), and
    the codec's RAM on the device with each width, and which boards then keep it."""
    from tinytrain.codegen.device import fedcodec_bytes
    from tinytrain.codegen.memory import breakdown
    from tinytrain.device.boards import load_boards

    model, ds = resolve("digits-mlp", "digits")
    res, rows = {"machine": report.machine(), "runs": {}}, []
    for c in ("int8", "sign", "signmv", "topk32", "int4b32"):
        for k in (4, 100):
            cells = []
            for bits in (64, 32, 16):
                r = federate(model, ds, simulated=k, rounds=10, partition="dirichlet:0.5", compress=c,
                             residual_bits=bits)
                res["runs"][f"{c} {k} {bits}"] = {"accuracy": r["final_accuracy"], "saturated": r["residual_saturated"],
                                                  "state_hash": r["state_hash"]}
                cells.append(f"{100 * r['final_accuracy']:.2f} % ({r['residual_saturated']:,})")
            rows.append([c, k, *cells])
    base = sum(breakdown(model, "mps2_an386", shadow=False, fedcodec=False, link=False).ram.values())
    boards = load_boards()
    mem = []
    for bits in (64, 32, 16):
        fc = fedcodec_bytes(model, bits)
        keep = [n for n, b in boards.items() if b.ram < 2**20 and base + fc <= b.ram]  # not the 4 MB mps2
        mem.append([f"int{bits}", f"{fc:,} B", f"{base + fc:,} B", ", ".join(keep)])
        res[f"ram {bits}"] = {"codec": fc, "total_no_shadow": base + fc, "real_boards": keep}
    report.write_json("federated-residual.json", res)
    body = "\n".join([
        "## Federated: the error-feedback residual in int64, int32, int16",
        "",
        "`python bench/bench_federated.py --only residual`: W1 digits-mlp, 10 rounds, seed 0, Dirichlet 0.5, "
        "the devices' residual kept in each width (saturating below 64; `--residual-bits`). Accuracy of the "
        "final global model and, in brackets, residual elements saturated in the updates used.",
        "",
        report.markdown_table(["codec", "devices", "int64", "int32 (default)", "int16"], rows),
        "",
        f"RAM of the on-device codec for W1 and the W1 training firmware without the load shadow "
        f"({base:,} B by the unlinked estimate) plus the codec; boards below 1 MB of RAM (the mps2 QEMU boards have 4 MB) that hold both:",
        "",
        report.markdown_table(["residual", "codec RAM", "firmware RAM", "boards that keep it"], mem),
        "",
        f"Machine: {report.machine_line(res['machine'])}.",
    ])
    report.update_section("federated-residual", body)
    print(body)
    return res


def _tree_rss(root: int) -> int:
    """Resident bytes of process `root` and all its descendants (Linux /proc)."""
    kids: dict = {}
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open(f"/proc/{p}/stat") as f:
                    kids.setdefault(int(f.read().rsplit(")", 1)[1].split()[1]), []).append(int(p))
            except OSError:
                pass
    todo, total = [root], 0
    while todo:
        q = todo.pop()
        try:
            with open(f"/proc/{q}/status") as f:
                total += next((int(x.split()[1]) * 1024 for x in f if x.startswith("VmRSS:")), 0)
        except OSError:
            pass
        todo += kids.get(q, [])
    return total


def _flower_round(clients: int, per_node: int) -> dict:
    """One `flwr run` of `clients` tinytrain clients on clients / per_node SuperNodes."""
    import json
    import tempfile
    import threading
    from pathlib import Path

    sys.path.insert(0, str(report.ROOT))
    from tests.flowerutil import Flower

    data, nodes = f"mnist1d-flat:{10 * clients}", clients // per_node
    with tempfile.TemporaryDirectory() as tmp:
        f = Flower(Path(tmp) / "home", simulation=True)
        peak, stop = [0], threading.Event()

        def sample():
            while not stop.wait(0.5):
                peak[0] = max(peak[0], _tree_rss(f.superlink.pid))

        threading.Thread(target=sample, daemon=True).start()
        load = _load()
        try:
            t = time.perf_counter()
            rc = f.run(f'out-dir="{tmp}/out" num-server-rounds=1 data="{data}" compress="int8" '
                       f'devices-per-node={per_node}', "--federation-config", f"num-supernodes={nodes}",
                       timeout=3600)
            wall = time.perf_counter() - t
        finally:
            stop.set()
            f.close()
        if rc.returncode != 0 or not (Path(tmp) / "out" / "summary.json").exists():
            raise SystemExit(f"flwr run failed: {rc.stdout[-2000:]} {rc.stderr[-2000:]}")
        s = json.loads((Path(tmp) / "out" / "summary.json").read_text())
    return {"clients": clients, "nodes": nodes, "devices_per_node": per_node, "data": data,
            "round_seconds": s["history"][0]["seconds"], "flwr_run_wall_seconds": wall,
            "peak_rss_bytes": peak[0], "load_before": load, "accepted": s["history"][0]["accepted"],
            "state_hash": s["state_hash"]}


def flower_scale(clients: int, per_node=(1, 10)) -> dict:
    """One round of `clients` simulated clients of mnist1d-flat:10*clients through Flower's
    simulation engine: `flwr run examples/flower-app` against a SuperLink started here
    (tests/flowerutil.py), one tinytrain client per SuperNode and `per_node` clients per
    SuperNode (run_config devices-per-node); round time from the strategy, peak resident memory
    of the SuperLink's whole process tree (SuperExec, simulation, Ray workers) sampled every
    0.5 s, the global model checked against tinytrain's engine."""
    runs = [_flower_round(clients, k) for k in per_node]
    model, ds = resolve("digits-mlp", runs[0]["data"])
    engine = federate(model, ds, simulated=clients, rounds=1, compress="int8", compress_down="none")
    res = {"clients": clients, "runs": runs, "engine_state_hash": engine["state_hash"],
           "bit_identical": all(r["state_hash"] == engine["state_hash"] for r in runs),
           "machine": report.machine()}
    path = report.write_json("federated-flower-scale.json", res)
    rows = [[f"{r['clients']:,}", f"{r['nodes']:,} x {r['devices_per_node']}", f"{r['accepted']:,}",
             f"{r['round_seconds']:.1f} s", f"{r['flwr_run_wall_seconds']:.1f} s",
             f"{r['peak_rss_bytes'] / 2**30:.2f} GiB", r["load_before"], r["state_hash"]] for r in runs]
    body = "\n".join([
        f"## Federated scale through Flower's simulation engine: {clients:,} clients",
        "",
        f"`python bench/bench_federated.py --only flower-scale --flower-clients {clients}`: `flwr run "
        "examples/flower-app` with `num-supernodes` = clients / devices-per-node, data "
        f"`{runs[0]['data']}` (10 samples per client), int8 updates, IntegerFedAvg on the ServerApp, Ray "
        "backend, one CPU per ClientApp actor; one run each, the load average before it beside it (other "
        f"jobs shared the machine: wall-clock figures are indicative). Machine: {report.machine_line(res['machine'])}. "
        f"tinytrain's engine with the same clients: state hash {res['engine_state_hash']}: "
        f"{'bit-identical' if res['bit_identical'] else 'DIFFERENT'}.",
        "",
        report.markdown_table(["clients", "SuperNodes x devices each", "accepted", "round (strategy)",
                               "flwr run wall (start-up, FAB, round, shutdown)",
                               "peak RSS, SuperLink process tree", "load average before", "state hash"], rows),
    ])
    report.update_section("federated-flower-scale", body)
    print(body)
    print(f"wrote {path.relative_to(report.ROOT)} and {report.BENCHMARKS_MD.name}")
    return res


if __name__ == "__main__":
    sys.exit(main())
