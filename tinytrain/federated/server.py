"""Server-side rules, integer only, one definition used by tinytrain's engine and the Flower
strategy: the aggregation of a round (integer FedAvg, fedavg.Aggregator, or for ``signmv`` the
majority vote, MajorityVote below) and FedAvgM's server momentum and learning rate after it.

With ``g`` the global store the devices trained from this round and ``a`` their integer FedAvg
(fedavg.Aggregator), per tensor, int64::

    D = a - g                                    (the round's mean update; FedAvg: w = g + D = a)
    M = rshift_round(M * beta_m, beta_k) + D     (server momentum buffer; beta = 0: M = D)
    w = sat(g + rshift_round(M * eta_m, eta_k))  (eta = 1: w = sat(g + M), no multiply)

``(beta_m, beta_k) = to_mult_shift(beta)``, ``(eta_m, eta_k) = to_mult_shift(eta)``: 15-bit
multipliers and shifts, as the local optimizer turns its lr and momentum (graph/optim.py),
computed once at build time; ``rshift_round`` rounds to nearest, ties toward +inf
(fixedpoint.py); ``sat`` is the codec's saturation per dtype (int16: +-32767, int32: full range,
codec._sat). beta = 0 and eta = 1 is plain FedAvg, bit for bit.

Ranges: |D| < 2^32 (int32 stores); beta <= 0.99 keeps |M| <= |D|max / (1 - beta) < 2^39, and
the products with a 15-bit multiplier stay below 2^55 (eta <= 4). ``M`` starts at zero, is part
of the server's state (checkpointed with the round, restored by resume), and is not touched by
a round without quorum.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tinytrain import fixedpoint as fp
from tinytrain.federated.codec import _sat
from tinytrain.federated.fedavg import add_count

__all__ = ["ServerOpt", "server_opt", "ServerMomentum", "MajorityVote", "aggregator", "MAX_BETA",
           "MAX_ETA"]

MAX_BETA = 0.99
MAX_ETA = 4.0


@dataclass(frozen=True)
class ServerOpt:
    beta: float
    eta: float
    beta_m: int
    beta_k: int
    eta_m: int
    eta_k: int

    @property
    def plain(self) -> bool:
        """True for plain FedAvg (beta 0, eta 1)."""
        return self.beta_m == 0 and self.eta_k == 0 and self.eta_m == 1


def server_opt(momentum: float = 0.0, lr: float = 1.0) -> ServerOpt:
    """Compile FedAvgM's server momentum beta and server learning rate eta; ValueError naming the
    option for values outside [0, 0.99] and (0, 4]."""
    if not 0 <= momentum <= MAX_BETA:
        raise ValueError(f"--server-momentum {momentum!r}: must be in [0, {MAX_BETA}] (0: plain FedAvg)")
    if not 0 < lr <= MAX_ETA:
        raise ValueError(f"--server-lr {lr!r}: must be in (0, {MAX_ETA:g}] (1: the mean update as it is)")
    bm, bk = fp.to_mult_shift(momentum) if momentum > 0 else (0, 0)
    em, ek = (1, 0) if lr == 1 else fp.to_mult_shift(lr)
    return ServerOpt(float(momentum), float(lr), bm, bk, em, ek)


class ServerMomentum:
    """The server state of FedAvgM: step(g, a) -> the new global store (module docstring)."""

    def __init__(self, opt: ServerOpt, like):
        self.opt = opt
        self.M = [np.zeros(np.size(t), np.int64) for t in like]

    def step(self, glob, avg) -> list[np.ndarray]:
        o = self.opt
        if o.plain:
            return [np.asarray(a) for a in avg]
        out = []
        for i, (g, a) in enumerate(zip(glob, avg)):
            g64 = np.asarray(g, np.int64).reshape(-1)
            d = np.asarray(a, np.int64).reshape(-1) - g64
            m = (fp.rshift_round(self.M[i] * o.beta_m, o.beta_k) if o.beta_m else 0) + d
            self.M[i] = m
            step = m if (o.eta_m == 1 and o.eta_k == 0) else fp.rshift_round(m * o.eta_m, o.eta_k)
            out.append(_sat(g64 + step, np.asarray(g).dtype).reshape(np.shape(g)))
        return out

    def get_state(self) -> np.ndarray:
        return np.concatenate(self.M) if self.M else np.zeros(0, np.int64)

    def set_state(self, flat) -> None:
        flat = np.asarray(flat, np.int64)
        sizes = np.cumsum([m.size for m in self.M])[:-1]
        self.M = [a.copy() for a in np.split(flat, sizes)]


class MajorityVote:
    """Aggregation of ``signmv`` updates (signSGD with majority vote), integer only. Per tensor,
    over the devices that sent it (a device whose tensor was "zero" abstains for that tensor),
    with n_i the device's samples, q_i in {-1, +1} its signs and s_i its shift::

        vote = sum_i n_i * q_i                          (int64, per element)
        S    = floor((sum_i n_i * s_i + floor(N_t / 2)) / N_t)   (N_t = sum of those n_i; the
                                                         sample-weighted mean shift, rounded half up)
        w    = sat(g + (vote >= 0 ? +1 : -1) * 2^S)     (a tie moves up, as the device's v = 0 -> +)

    A tensor no device sent stays g. The scale is the devices' mean (log2) step, so the vote
    moves every element by one common step whose size follows the devices' update magnitudes.
    """

    def __init__(self, like):
        self.like = [np.asarray(t) for t in like]
        self.vote = [np.zeros(np.size(t), np.int64) for t in like]
        self.ns = [0] * len(self.like)    # samples of the devices that voted on tensor i
        self.ss = [0] * len(self.like)    # sum of n_i * s_i
        self.N = 0
        self.count = 0

    def add_update(self, u) -> None:
        n = int(u.n_samples)
        if n <= 0:
            raise ValueError(f"an update must count at least one sample, got {n}")
        if u.signs is None:
            raise ValueError(f"majority vote needs sign updates, got codec {u.codec}")
        add_count(self, n, 1)
        for i, sq in enumerate(u.signs):
            if sq is None:
                continue
            s, q = sq
            self.vote[i] += q * n
            self.ns[i] += n
            self.ss[i] += n * int(s)

    def merge(self, other: "MajorityVote") -> None:
        """Add another vote's sums (a worker's share of the round's devices)."""
        add_count(self, other.N, other.count)
        for i in range(len(self.like)):
            self.vote[i] += other.vote[i]
            self.ns[i] += other.ns[i]
            self.ss[i] += other.ss[i]

    def result(self) -> list[np.ndarray]:
        if self.N == 0:
            raise ValueError("no updates to aggregate")
        out = []
        for g, v, n, ss in zip(self.like, self.vote, self.ns, self.ss):
            if n == 0:
                out.append(g.copy())
                continue
            S = (ss + n // 2) // n
            step = np.where(v >= 0, np.int64(1) << S, -(np.int64(1) << S))
            out.append(_sat(np.asarray(g, np.int64).reshape(-1) + step, g.dtype).reshape(g.shape))
        return out


def aggregator(codec: str, glob):
    """The aggregation of a round's updates: MajorityVote for ``signmv``, else integer FedAvg."""
    from tinytrain.federated.fedavg import Aggregator

    return MajorityVote(glob) if codec == "signmv" else Aggregator(glob)
