"""The per-stage report of a compress run as a table and a picture."""
from __future__ import annotations


def table(r: dict) -> str:
    board = r.get("board")
    head = f"{'stage':>5s} {'name':14s} {'kind':9s} {'epochs':>6s} {'val acc':>8s} {'test acc':>8s} " \
           f"{'sparsity':>8s} {'precision':14s}"
    if board:
        head += f" {'RAM B':>7s} {'flash B':>8s} {'instr/sample':>12s}"
    lines = [f"compress {r['schedule']} -> {r['out']} (validation: {r['inputs']['validation_samples']} of the "
             f"training samples; test: the test split)", head]
    for s in r["stages"]:
        line = (f"{s['stage']:5d} {s['name']:14s} {s['kind']:9s} {s['epochs']:6d} {100 * s['validation_accuracy']:7.2f}% "
                f"{100 * s['test_accuracy']:7.2f}% {100 * s['sparsity']:7.1f}% {s['precision']:14s}")
        if board:
            d = s.get("device", {}).get(board, {})
            ins = d.get("instructions_per_sample")
            line += (f" {d.get('ram_total', 0):7d} {d.get('flash_total') or 0:8d} "
                     f"{'' if ins is None else f'{ins:,.0f}':>12s}" + ("" if d.get("fits", True) else f"  ({d['why']})"))
        lines.append(line)
        ad = s.get("adaptive")
        if ad:
            lines.append(f"      adaptive: {len(ad['levels'])} levels, {ad['epochs']} epochs, budget "
                         f"{'met' if ad['budget_met'] else 'NOT met'} (>= {ad['tolerable_correct']:.1f} of "
                         f"{ad['validation_samples']} correct), stopped: {ad['stopped']}")
    return "\n".join(lines)


def plot(r: dict, path) -> None:
    """Accuracy and sparsity per stage; with a board, RAM and flash beside them."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tinytrain.graph.io import atomic_write

    st = r["stages"]
    labels = [f"{s['stage']}\n{s['name']}" for s in st]
    x = range(len(st))
    board = r.get("board")
    fig, axes = plt.subplots(1, 2 if board else 1, figsize=(11 if board else 6.5, 3.8), squeeze=False)
    a = axes[0][0]
    a.plot(x, [100 * s["validation_accuracy"] for s in st], marker="o", label="validation")
    a.plot(x, [100 * s["test_accuracy"] for s in st], marker="s", label="test")
    a.set_ylabel("accuracy (%)")
    a.set_xticks(list(x), labels, fontsize=7)
    b = a.twinx()
    b.bar(x, [100 * s["sparsity"] for s in st], alpha=0.2, color="gray", label="sparsity")
    b.set_ylabel("sparsity (%)")
    a.legend(loc="lower left", fontsize=8)
    a.grid(alpha=0.3)
    if board:
        c = axes[0][1]
        devs = [s.get("device", {}).get(board, {}) for s in st]
        c.bar([i - 0.2 for i in x], [d.get("ram_total", 0) for d in devs], width=0.4, label="RAM")
        c.bar([i + 0.2 for i in x], [d.get("flash_total") or 0 for d in devs], width=0.4, label="flash")
        c.set_ylabel(f"bytes on {board}")
        c.set_xticks(list(x), labels, fontsize=7)
        c.legend(fontsize=8)
    fig.suptitle(f"compress {r['schedule']}", fontsize=9)
    fig.tight_layout()
    try:
        atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=100))
    finally:
        plt.close(fig)
