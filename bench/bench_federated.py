"""Federated W1 (digits-mlp): accuracy next to centralized integer training, bytes on the wire
per codec, the cost of 1,000 simulated clients in one round, and (with QEMU) 4 emulated boards
against simulated devices.

    python bench/bench_federated.py            # all, QEMU part if qemu-system-arm is present
    python bench/bench_federated.py --no-qemu

Writes bench/results/federated.json and the `federated` section of BENCHMARKS.md.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import report  # noqa: E402

from tinytrain.federated import federate, resolve  # noqa: E402
from tinytrain.train import fit  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--qemu", action=argparse.BooleanOptionalAction, default=shutil.which("qemu-system-arm") is not None)
    ap.add_argument("--clients", type=int, default=1000)
    a = ap.parse_args(argv)
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
    for c in ("none", "int8", "int4", "sign"):
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


if __name__ == "__main__":
    sys.exit(main())
