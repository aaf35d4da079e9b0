"""Progress bars for long work (verify steps, federated rounds, firmware builds, sweeps): tqdm on
stderr, shown only when stderr is a terminal and the command is not printing --json, so logs
and pipes never get carriage-return lines.

    with progress_bar(total=300, desc="verify", json=args.json) as bar:
        bar.update(1)
"""
from __future__ import annotations

import sys


def enabled(json: bool = False, force: bool | None = None) -> bool:
    """True if a bar should be drawn: `force` if given, else stderr is a TTY and not --json."""
    if force is not None:
        return bool(force)
    if json:
        return False
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def progress_bar(total=None, desc: str = "", unit: str = "it", json: bool = False,
                 force: bool | None = None):
    """A tqdm bar (a context manager with update/set_postfix/close) that is silent — draws
    nothing at all — unless `enabled(json, force)`."""
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit=unit, leave=False, dynamic_ncols=True,
                file=sys.stderr, disable=not enabled(json, force))
