"""The README's result block (README.md, "The result"), written from the same runs as the
report: the headline configuration's times and PASSING's speedup in every configuration."""

from __future__ import annotations

import math
from pathlib import Path

from bench.report_format import md_table, millis, number
from bench.results import (
    GroupKey,
    Run,
    by_size,
    format_size,
    group_label,
    group_runs,
    largest_passing_size,
    load_allreduce,
    main_group,
    order_strategies,
    speedups,
)

# The README's result block (README.md, "The result"): written from the same runs as the report.
README_BEGIN = "<!-- bench:begin -->"
README_END = "<!-- bench:end -->"


def headline_group(groups: dict[GroupKey, list[Run]]) -> GroupKey | None:
    """The main configuration at the fastest links the run gave it (unshaped counts as
    fastest): with make bench's plan, leafspine with its links as shipped, the regime a user of
    `make run-topology` gets."""
    main = main_group(groups)
    if main is None:
        return None
    same = [k for k in groups if (k[0], k[1], k[3], k[4]) == (main[0], main[1], main[3], main[4])]
    return max(same, key=lambda k: k[2] if k[2] else math.inf)  # max keeps the first of equals


def _readme_cell(at: dict[str, Run], s: str) -> str:
    r = at.get(s)
    if r is None:
        return ""
    cell = f"{millis(r.mean_s)} ms"
    sp = speedups(at).get(s)
    if s != "passing" and sp is not None:
        cell += f" ({number(sp, '.2f')}x)"
    return cell + ("" if r.correct else " **WRONG**")


def render_readme_block(allreduce_csv: Path, meta: dict[str, str]) -> str:
    """The README's result block: when and where the run was made, the headline configuration's
    times with PASSING's speedups, and PASSING's speedup in every configuration at its largest
    tensor, the losing and level ones included. Every number is formatted as the report's
    tables format it (the test compares them as printed)."""
    runs = load_allreduce(allreduce_csv)
    lines = ["<!-- written by bench/report.py (make bench) from the runs of the results section of "
             "docs/benchmarks.md; tests/bench/test_readme_numbers.py holds every number to it -->",
             ""]
    wrong = sum(not r.correct for r in runs)
    verdict = (f"every one of its {len(runs)} all-reduce runs correct" if not wrong else
               f"**{wrong} of its {len(runs)} all-reduce runs WRONG**")
    lines += [f"Latest `make bench`: **{meta.get('date', 'n/a')}** on "
              f"{meta.get('machine', 'n/a')}; {verdict}.", ""]
    groups = group_runs(runs)
    head = headline_group(groups)
    if head is None:
        return "\n".join(lines + ["No all-reduce runs."]) + "\n"
    strategies = order_strategies(r.strategy for r in runs)
    lines += [f"Time of one all-reduce (the slowest host's mean) and PASSING's speedup over each "
              f"baseline, `{group_label(head)}`:", ""]
    rows = [[format_size(size)] + [_readme_cell(at, s) for s in strategies]
            for size, at in by_size(groups[head]).items()]
    lines += md_table(["tensor", *strategies], rows) + [""]
    others = [s for s in strategies if s != "passing"]
    lines += ["PASSING's speedup over each baseline in every configuration of the run, at its "
              "largest tensor (a speedup under one: PASSING was the slower):", ""]
    rows = []
    for key, group in groups.items():
        size = largest_passing_size(group)
        if size is None:
            continue
        at = by_size(group)[size]
        sp = speedups(at)
        rows.append([group_label(key), format_size(size), _readme_cell(at, "passing")]
                    + [number(sp[s], ".2f") + "x" if s in sp else "" for s in others])
    lines += md_table(["configuration", "tensor", "passing", *(f"vs {s}" for s in others)], rows)
    return "\n".join(lines) + "\n"


def merge_readme(existing: str, block: str, name: str = "README") -> str:
    """Replace the text between the README's bench markers; a README without them is an error,
    not a place to append results to."""
    start = existing.find(README_BEGIN)
    end = existing.find(README_END, start + len(README_BEGIN)) if start >= 0 else -1
    if start < 0 or end < 0:
        raise ValueError(f"{name}: no {README_BEGIN} ... {README_END} block to write the "
                         "results into")
    return existing[:start] + README_BEGIN + "\n" + block + existing[end:]


def readme_for(report: Path) -> Path | None:
    """The checkout's README.md when `report` is the checkout's docs/benchmarks.md (what make
    bench writes), else None: a report written elsewhere (make bench-quick, a subset into another
    file) leaves the README alone."""
    root = Path(__file__).resolve().parents[1]
    readme = root / "README.md"
    if Path(report).resolve() == root / "docs" / "benchmarks.md" and readme.exists():
        return readme
