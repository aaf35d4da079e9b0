"""The Flower App's run_config: its keys, types and defaults, checked in one place (used by
the ServerApp, the ClientApp and the board gateway; no Flower import here). docs/federated.md
lists the keys."""
from __future__ import annotations

from tinytrain.federated.engine import FedConfig

__all__ = ["RUN_CONFIG", "settings"]

#: run_config keys of the Flower App, their types and defaults (docs/federated.md)
RUN_CONFIG = {
    "model": (str, "digits-mlp"), "data": (str, "digits"), "partition": (str, "iid"),
    "compress": (str, "int8"), "num-server-rounds": (int, 3), "local-epochs": (int, 1),
    "local-steps": (int, 0), "seed": (int, 0), "quorum": (float, 0.5), "clients": (int, 0),
    "fraction-train": (float, 1.0), "min-available-nodes": (int, 0), "out-dir": (str, ""),
    "round-timeout": (float, 3600.0), "server-momentum": (float, 0.0), "server-lr": (float, 1.0),
    "prox-mu": (float, 0.0), "prox-every": (int, 16), "residual-bits": (int, 32),
    "devices-per-node": (int, 1),
}


def settings(run_config) -> dict:
    """The app's settings from Flower's run_config, type-checked: ValueError naming the key."""
    from tinytrain.federated.codec import CODECS
    from tinytrain.federated.partition import parse_partition

    unknown = sorted(set(run_config) - set(RUN_CONFIG))
    if unknown:
        raise ValueError(f"run_config: unknown key(s) {unknown}: known are {sorted(RUN_CONFIG)}")
    s = {}
    for k, (typ, default) in RUN_CONFIG.items():
        v = run_config.get(k, default)
        if typ is float and isinstance(v, int) and not isinstance(v, bool):
            v = float(v)
        if not isinstance(v, typ) or isinstance(v, bool):
            raise ValueError(f"run_config {k}={v!r}: must be {typ.__name__} (e.g. {k}={default!r})")
        s[k] = v
    parse_partition(s["partition"])
    if s["compress"] not in CODECS:
        raise ValueError(f"run_config compress={s['compress']!r}: use one of {', '.join(CODECS)}")
    for k in ("num-server-rounds", "local-epochs", "devices-per-node"):
        if s[k] < 1:
            raise ValueError(f"run_config {k}={s[k]}: must be >= 1")
    for k in ("local-steps", "clients", "min-available-nodes"):
        if s[k] < 0:
            raise ValueError(f"run_config {k}={s[k]}: must be >= 0 (0: {'no cap' if k == 'local-steps' else 'one per node'})")
    if not 0 < s["fraction-train"] <= 1 or not s["quorum"] > 0:
        raise ValueError("run_config fraction-train must be in (0, 1] and quorum > 0")
    from tinytrain.federated.prox import prox_config
    from tinytrain.federated.server import server_opt

    from tinytrain.federated.codec import residual_bounds

    try:
        residual_bounds(s["residual-bits"])
        server_opt(s["server-momentum"], s["server-lr"])
        prox_config(s["prox-mu"], s["prox-every"], None)  # the model's lr is checked where it is known
    except ValueError as e:
        raise ValueError(f"run_config: {str(e).replace('--', '')}") from None
    s["run"] = {k: s[k] for k in RUN_CONFIG}
    s["config"] = FedConfig(rounds=s["num-server-rounds"], local_epochs=s["local-epochs"],
                            local_steps=s["local-steps"] or None, partition=s["partition"],
                            compress=s["compress"], compress_down="none", seed=s["seed"],
                            quorum=s["quorum"], server_momentum=s["server-momentum"],
                            server_lr=s["server-lr"], prox_mu=s["prox-mu"], prox_every=s["prox-every"],
                            residual_bits=s["residual-bits"])
    return s
