"""Fitting the emulation's constants that no calibration measures (sim/fitted.json) to one
`make bench` report, so that a refit is a command, not a hand search:

* `gloo_step_s`, gloo's cost per ring step beyond the links: ring at 256 KiB and 1 MiB in the
  main scenario (the model switch, 4 hosts x 2 GPUs, 20 Mbit/s), where the links leave most
  room for it; the value whose simulated / measured ratios have a geometric mean of 1.
* `gloo_local_s`, per local reduce or broadcast of hier-ring: hier-ring in the same cells,
  likewise, with the step cost just fitted.
* `frame_cpu_fwd`, the kernel's work per frame per link crossed: every cell at 100 Mbit/s,
  where the two cores, not the links, set the time; the value with the smallest worst ratio
  either way (a grid, then a finer one around its best).

The three depend on each other a little (the shared CPU is busy at 20 Mbit/s too), so they are
fitted twice in turn. Fit on one report and validate on another: a fit's own cells say
nothing about the simulator.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from sim.costs import FITTED
from sim.measured import Cell, Report
from sim.validate import validate

SMALL = (256 << 10, 1 << 20)


@dataclass(frozen=True)
class Fit:
    constants: dict[str, float]
    sources: dict[str, str]
    worst: dict[str, float]  # per constant: the worst ratio (either way) of its cells at the fit


def _main(c: Cell) -> bool:
    return c.target == "model" and c.bw_mbps == 20 and c.hosts == 4 and c.gpus == 2


def cells_for(report: Report) -> dict[str, list[Cell]]:
    """The cells each constant is fitted to."""
    groups = {
        "gloo_step_s": [c for c in report.cells
                        if _main(c) and c.strategy == "ring" and c.size_bytes in SMALL],
        "gloo_local_s": [c for c in report.cells
                         if _main(c) and c.strategy == "hier-ring" and c.size_bytes in SMALL],
        "frame_cpu_fwd": [c for c in report.cells if c.target == "model" and c.bw_mbps == 100],
    }
    for name, cells in groups.items():
        if not cells:
            raise ValueError(f"the report has no cells to fit {name} to")
    return groups


def _log_ratios(report: Report, cells: list[Cell], constants: dict[str, float],
                workers: int) -> list[float]:
    rows = validate(report, cells, workers, constants=constants)
    bad = [r for r in rows if r.error or not r.simulated_s]
    if bad:
        raise RuntimeError(f"simulation failed: {bad[0].cell.scenario}: {bad[0].error}")
    return [math.log(r.ratio) for r in rows]


def _bisect_mean(evaluate: Callable[[float], float], lo: float, hi: float,
                 steps: int = 12) -> float:
    """The value in [lo, hi] where evaluate (increasing) crosses 0, or the nearer end."""
    if evaluate(lo) >= 0:
        return lo
    if evaluate(hi) <= 0:
        return hi
    for _ in range(steps):
        mid = (lo + hi) / 2
        if evaluate(mid) < 0:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def _grid_min(evaluate: Callable[[float], float], values: list[float]) -> float:
    scores = {v: evaluate(v) for v in values}
    return min(scores, key=lambda v: (scores[v], v))


def fit(report: Report, workers: int = 2, passes: int = 2,
        log: Callable[[str], None] = print) -> Fit:
    groups = cells_for(report)
    constants = {name: value for name, (value, _) in FITTED.items()}
    # The searches meet the same trials again (the fine grid holds points of the coarse one,
    # the last worst ratios the chosen point): each is simulated once.
    simulated: dict[tuple, list[float]] = {}

    def ratios(name: str, trial: dict[str, float]) -> list[float]:
        key = (name, tuple(sorted(trial.items())))
        if key not in simulated:
            simulated[key] = _log_ratios(report, groups[name], trial, workers)
        return simulated[key]

    def mean_log(name: str) -> Callable[[float], float]:
        def f(v: float) -> float:
            lr = ratios(name, {**constants, name: v})
            log(f"  {name} = {v:.5g}: mean log ratio {sum(lr) / len(lr):+.3f}")
            return sum(lr) / len(lr)
        return f

    def worst_log(v: float) -> float:
        lr = ratios("frame_cpu_fwd", {**constants, "frame_cpu_fwd": v})
        log(f"  frame_cpu_fwd = {v:.4g}: worst ratio {math.exp(max(map(abs, lr))):.3f}")
        return max(map(abs, lr))

    for p in range(passes):
        log(f"pass {p + 1} of {passes}")
        constants["gloo_step_s"] = round(_bisect_mean(mean_log("gloo_step_s"), 0.0, 0.02), 5)
        constants["gloo_local_s"] = round(_bisect_mean(mean_log("gloo_local_s"), 0.0, 0.1), 4)
        coarse = _grid_min(worst_log, [x / 2 for x in range(1, 17)])
        constants["frame_cpu_fwd"] = _grid_min(
            worst_log, [round(coarse + d / 8, 3) for d in range(-4, 5) if coarse + d / 8 > 0])
    worst = {name: math.exp(max(abs(x) for x in ratios(name, constants))) for name in groups}
    stamp = f"make bench {report.date}"
    sources = {
        "gloo_step_s": f"fitted (python -m sim fit): ring at 256 KiB and 1 MiB, 20 Mbit/s, "
                       f"{stamp} (its time beyond the links, per ring step)",
        "gloo_local_s": f"fitted (python -m sim fit): hier-ring at 256 KiB and 1 MiB, 20 Mbit/s, "
                        f"{stamp} (its time beyond the links and the ring's steps, per local "
                        "reduce or broadcast)",
        "frame_cpu_fwd": f"fitted (python -m sim fit): the 100 Mbit/s cells of {stamp} (the "
                         "smallest worst ratio); a frame's kernel work per link crossed (veth, "
                         "htb, sockets), in units of one frame forwarded by the model switch "
                         "(1 / its switch_fwd_pps, per CPU second)",
    }
    return Fit({k: constants[k] for k in groups}, sources, worst)
