"""Federated learning with tinytrain devices: integer FedAvg rounds over simulated devices,
emulated boards (QEMU) and real boards, with compressed updates and fault handling.

See docs/federated.md. Modules: ``fedavg`` (the aggregation rule), ``server`` (FedAvgM's
server rule after it), ``prox`` (FedProx's proximal pull on the devices), ``codec`` (update
messages, compression, error feedback), ``partition`` (IID / Dirichlet splits), ``devices``
(the device kinds), ``engine`` (rounds, quorum, checkpoints), ``api`` (``federate``),
``cli`` (``tinytrain federate``), ``flower`` (optional Flower apps).
"""
from tinytrain.federated.api import federate, make_devices, resolve
from tinytrain.federated.codec import CODECS, CorruptUpdate, Schema
from tinytrain.federated.devices import DeviceFault, FaultyDevice, LinkDevice, SimBackend, SimDevice, local_order
from tinytrain.federated.engine import DevicesUnreachable, FedConfig, Federation, QuorumError
from tinytrain.federated.fedavg import fedavg
from tinytrain.federated.partition import partition

__all__ = ["federate", "make_devices", "resolve", "CODECS", "CorruptUpdate", "Schema", "DeviceFault",
           "FaultyDevice", "LinkDevice", "SimBackend", "SimDevice", "local_order", "FedConfig",
           "Federation", "QuorumError", "DevicesUnreachable", "fedavg", "partition"]
