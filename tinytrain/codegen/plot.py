"""The memory picture: a board's RAM and flash as bars split by role against the board's limits,
and per-layer RAM, flash and MACs (``tinytrain codegen/info --plot FILE``).

``memory_bars(bd)`` is the data the picture draws (tested against the breakdown, not pixels);
``plot_memory(bd, path)`` renders it with matplotlib (the ``plot`` extra) and writes the PNG
atomically (tinytrain.graph.io.atomic_write).
"""
from __future__ import annotations

from tinytrain.codegen.memory import FLASH_ROLES, RAM_ROLES, Breakdown

#: one colour per role, the same in both bars
COLOURS = {"parameters": "#4e79a7", "optimizer state": "#f28e2b", "activations": "#59a14f",
           "scratch": "#76b7b2", "protocol": "#edc948", "update codec": "#b07aa1", "shadow": "#ff9da7",
           "stack": "#9c755f", "code": "#bab0ac"}


def memory_bars(bd: Breakdown) -> dict:
    """What the picture shows: per bar the (role, bytes) segments in stacking order (zero roles
    left out; unknown flash code left out and flagged), its total and the board's limit, and
    the per-layer rows."""
    ram = [(r, int(bd.ram[r])) for r in RAM_ROLES if bd.ram.get(r)]
    flash = [(r, int(bd.flash[r])) for r in FLASH_ROLES if bd.flash.get(r)]
    return {"board": bd.board,
            "ram": {"segments": ram, "total": sum(v for _, v in ram), "limit": bd.ram_limit},
            "flash": {"segments": flash, "total": sum(v for _, v in flash), "limit": bd.flash_limit,
                      "code_known": bd.flash["code"] is not None},
            "layers": [dict(r) for r in bd.layers]}


def _matplotlib():
    try:
        import matplotlib
    except ImportError:
        raise ValueError("--plot needs matplotlib: pip install 'tinytrain-mcu[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_memory(bd: Breakdown, path, title: str | None = None):
    """Write the memory picture of `bd` to the PNG `path` (atomically); returns the path."""
    from tinytrain.graph.io import atomic_write

    plt = _matplotlib()
    data = memory_bars(bd)
    fig, (ax, al) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [1.2, 1]})
    seen = set()
    for y, key in ((1, "ram"), (0, "flash")):
        bar, left = data[key], 0
        for role, v in bar["segments"]:
            ax.barh(y, v / 1024, left=left / 1024, color=COLOURS[role], edgecolor="white",
                    label=None if role in seen else role)
            seen.add(role)
            left += v
        lim = bar["limit"]
        pct = f"{100 * bar['total'] / lim:.1f} % of {lim / 1024:g} KiB" if lim else ""
        note = "" if key == "ram" or bar["code_known"] else ", code unknown"
        ax.text(0, y + 0.42, f"{bar['total']:,} B ({pct}{note})", va="bottom", fontsize=8)
    ax.set_yticks([1, 0], ["RAM", "flash"])
    ax.set_xlabel("KiB")
    biggest = max(data["ram"]["total"], data["flash"]["total"])
    for y, key in ((1, "ram"), (0, "flash")):  # the limit, when it is on the same scale
        lim = data[key]["limit"]
        if lim and lim <= 3 * biggest:
            ax.plot([lim / 1024] * 2, [y - 0.4, y + 0.4], color="red", lw=2,
                    label=None if "limit" in seen else "board limit")
            seen.add("limit")
    near = [d["limit"] * 1.15 for d in (data["ram"], data["flash"]) if d["limit"] <= 3 * biggest]
    ax.set_xlim(0, max([biggest * 1.6, *near]) / 1024)
    ax.set_ylim(-0.7, 1.75)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=4, frameon=False)
    ax.set_title(f"{bd.board}: RAM and flash by role", fontsize=9)
    rows = data["layers"]
    xs = range(len(rows))
    w = 0.4
    al.bar([x - w / 2 for x in xs], [r["ram"] for r in rows], w, label="RAM (B)", color=COLOURS["activations"])
    al.bar([x + w / 2 for x in xs], [r["flash"] for r in rows], w, label="flash (B)", color=COLOURS["code"])
    al.set_xticks(list(xs), [f"{r['layer']} {r['kind']}" for r in rows], rotation=45, ha="right", fontsize=7)
    al.set_ylabel("bytes")
    am = al.twinx()
    am.plot(list(xs), [r["macs"] for r in rows], "k.-", label="MACs/forward")
    am.set_ylabel("MACs per forward")
    h1, l1 = al.get_legend_handles_labels()
    h2, l2 = am.get_legend_handles_labels()
    al.legend(h1 + h2, l1 + l2, fontsize=7, loc="upper right")
    al.set_title("per layer", fontsize=9)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    try:
        return atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=100))
    finally:
        plt.close(fig)
