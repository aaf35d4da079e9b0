"""Multi-stage compression pipelines and adaptive (accuracy-aware) compression (docs/compress.md).

    import tinytrain.compress as tc
    sched = tc.from_file("examples/compress-w1.toml")     # tinytrain compress --schedule ...
    r = tc.compress(sched, "runs/w1-compress", board="mps2_an386")
    r["stages"][-1]["test_accuracy"], r["final"]
"""
from tinytrain.compress.adaptive import DEFAULTS, Controller
from tinytrain.compress.pipeline import compress
from tinytrain.compress.schedule import Schedule, ScheduleError, from_file, parse

__all__ = ["compress", "from_file", "parse", "Schedule", "ScheduleError", "Controller", "DEFAULTS"]
