"""Federated W1 through Flower's simulation engine: 100 tinytrain clients, integer FedAvg on
the ServerApp, int8 updates with error feedback; then the same federation with tinytrain's own
engine, which must end in the same global model bit for bit.

    pip install 'tinytrain-mcu[flower]'
    python examples/federated_flower.py [--clients 100] [--rounds 3]

Flower users run the Flower App instead (``flwr run examples/flower-app``, docs/federated.md);
boards join through a SuperNode and ``tinytrain federate-gateway`` on their host.
"""
import argparse

from tinytrain.federated import federate
from tinytrain.federated.flower import run


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--partition", default="dirichlet:0.5")
    a = ap.parse_args()
    r = run("digits-mlp", "digits", clients=a.clients, rounds=a.rounds, partition=a.partition,
            compress="int8")
    print(f"Flower: {r['clients']} clients, accuracy per round "
          + ", ".join(f"{x:.3f}" for x in r["accuracy_per_round"])
          + f", {r['bytes_on_wire']} bytes on the wire, global state hash {r['state_hash']}")
    e = federate("digits-mlp", "digits", simulated=a.clients, rounds=a.rounds, partition=a.partition,
                 compress="int8", compress_down="none")
    print(f"tinytrain engine: state hash {e['state_hash']} "
          f"({'identical' if e['state_hash'] == r['state_hash'] else 'DIFFERENT'})")


if __name__ == "__main__":
    main()
