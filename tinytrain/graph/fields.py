"""Field types of model descriptions: model-file keys, layer options, optimizer options.

Each table maps a key to a ``Field``: what the value must be (for the error message) and a
test. The tests are exact, because JSON and TOML values have exact types: a bool is a bool
(``"false"`` is a string, and a non-empty string is true), an integer is an int and not a
bool (``True`` is an int in Python), a number is an int or float and finite. Ranges that
need a reason (a learning rate too large to train, ``last:K`` beyond the model) are checked
where the reason is known (optim.SGD.compile, Sequential).
"""
from __future__ import annotations

import json
import math
import numbers
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Field:
    desc: str                       # "a positive integer": completes "... must be <desc>"
    ok: Callable[[object], bool]


def is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def is_number(v) -> bool:
    if not (is_int(v) or isinstance(v, numbers.Real) and not isinstance(v, bool)):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:  # an integer beyond any float (a 400-digit "lr")
        return False


def _ints(v, n, lo) -> bool:
    return isinstance(v, (list, tuple)) and len(v) == n and all(is_int(x) and x >= lo for x in v)


BOOL = Field("true or false, unquoted", lambda v: isinstance(v, bool))
INT = Field("an integer", is_int)
POS_INT = Field("a positive integer", lambda v: is_int(v) and v >= 1)
NUMBER = Field("a number", is_number)
STR = Field("a string", lambda v: isinstance(v, str))
POS_INT_OR_PAIR = Field("a positive integer or a list of two",
                        lambda v: POS_INT.ok(v) or _ints(v, 2, 1))


def one_of(*choices) -> Field:
    return Field("one of " + ", ".join(json.dumps(c) for c in choices),
                 lambda v: isinstance(v, str) and v in choices)


def either(*fields: Field) -> Field:
    return Field(" or ".join(f.desc for f in fields), lambda v: any(f.ok(v) for f in fields))


def padding(n: int) -> Field:
    """'valid', 'same' or n integers >= 0 (conv2d: top, bottom, left, right; conv1d: left, right)."""
    return Field(f'"valid", "same" or a list of {n} integers >= 0',
                 lambda v: v in ("valid", "same") if isinstance(v, str) else _ints(v, n, 0))


def optional(f: Field) -> Field:
    return Field(f"{f.desc} (or left out)", lambda v: v is None or f.ok(v))


def show(v) -> str:
    """A value as the user wrote it in JSON/TOML: true, "false", 1e+300."""
    try:
        return json.dumps(v)
    except (TypeError, ValueError):
        return repr(v)


def check(d: dict, fields: dict, what: str, error=ValueError) -> None:
    """Raise ``error`` naming the first unknown key (and the known ones) or mistyped value."""
    unknown = sorted(str(k) for k in d if k not in fields)
    if unknown:
        known = ", ".join(sorted(fields)) if fields else "none"
        raise error(f"{what}: unknown key(s) {', '.join(unknown)}: known keys are {known}")
    for k, v in d.items():
        if not fields[k].ok(v):
            raise error(f"{what}: {k} = {show(v)} must be {fields[k].desc}")
