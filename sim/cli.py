"""`python -m sim`: simulate strategies on a fabric, validate against `make bench`, or run the
1,024-host study.

    python -m sim --topo topologies/leafspine.json --strategies passing,ring --sizes 256K,1M \\
        --link-mbps 20 --gpus 2 --out build/sim          # (the same as `python -m sim run ...`)
    python -m sim run --fabric 32x32x4 --oversubscription 4 --gpus 8 --link-mbps 100000 \\
        --sizes 100MB --strategies passing,hier-ring
    python -m sim validate [--measured docs/benchmarks.md] [--docs docs/simulation.md]
    python -m sim fit --measured REPORT [--write]     # refit sim/fitted.json to a report
    python -m sim study [--quick] [--docs docs/simulation.md] [--plots docs/simulation]

Every simulation runs in a process of its own (SimGrid's engine is once per process), `--jobs`
at a time. Results are CSV files under --out; plots beside them (run, validate) or under
--plots (study).
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sim import fabric, simgrid_missing
from sim.strategies import STRATEGIES
from sim.wire import format_size, parse_size

COMMANDS = ("run", "validate", "fit", "study")
DEFAULT_MEASURED = fabric.ROOT / "docs" / "benchmarks.md"
DEFAULT_DOC = fabric.ROOT / "docs" / "simulation.md"


def _list(conv: Callable[[str], Any]) -> Callable[[str], list]:
    def parse(text: str) -> list:
        return [conv(x) for x in text.split(",") if x.strip()]
    return parse


def _strategies(text: str) -> list[str]:
    names = _list(str)(text)
    bad = [n for n in names if n not in STRATEGIES]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown strategy {', '.join(bad)} "
                                          f"(have: {', '.join(STRATEGIES)})")
    return names


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m sim", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command")
    run = sub.add_parser("run", help="strategies x sizes on one fabric (the default command)")
    where = run.add_mutually_exclusive_group()
    where.add_argument("--topo", default="leafspine",
                       help="topology file or shipped name (default leafspine)")
    where.add_argument("--fabric", help="a generated leaf-spine: RACKSxHOSTS[xSPINES]")
    run.add_argument("--strategies", type=_strategies, default=list(STRATEGIES))
    run.add_argument("--sizes", type=_list(parse_size), default=[256 << 10, 1 << 20])
    run.add_argument("--link-mbps", type=float, default=None,
                     help="every link at this rate (default: as the file ships them)")
    run.add_argument("--gpus", type=int, default=None, help="GPUs per host (default: the file's)")
    run.add_argument("--hosts", type=int, default=0, help="job size in hosts (default: all)")
    run.add_argument("--oversubscription", type=float, default=1.0, help="--fabric only")
    run.add_argument("--costs", choices=("emulation", "datacenter"), default=None,
                     help="default: emulation for a topology file, datacenter for --fabric")
    run.add_argument("--target", choices=("model", "bmv2"), default="model",
                     help="the emulation's switch (its calibration and window)")
    run.add_argument("--in-host", choices=("nvlink", "pcie"), default="nvlink")
    run.add_argument("--window", type=int, default=None)
    run.add_argument("--measured", type=Path, default=DEFAULT_MEASURED,
                     help="the make bench report whose calibration the emulation uses")
    run.add_argument("--max-chunks", type=int, default=64)
    run.add_argument("--out", type=Path, default=Path("build/sim"))
    run.add_argument("--no-plots", action="store_true")
    val = sub.add_parser("validate", help="simulated against measured, 256 KiB-16 MiB")
    val.add_argument("--measured", type=Path, default=DEFAULT_MEASURED)
    val.add_argument("--strategies", type=_strategies, default=None)
    val.add_argument("--max-chunks", type=int, default=64)
    val.add_argument("--out", type=Path, default=Path("build/sim"))
    val.add_argument("--docs", type=Path, nargs="?", const=DEFAULT_DOC, default=None,
                     help="write the validation table into this page (default "
                          "docs/simulation.md)")
    fit = sub.add_parser("fit", help="fit the emulation's constants (sim/fitted.json) to a "
                                     "make bench report; validate on another")
    fit.add_argument("--measured", type=Path, required=True,
                     help="the report to fit to (a copy of a make bench results section)")
    fit.add_argument("--write", action="store_true", help="rewrite sim/fitted.json")
    study = sub.add_parser("study", help="the 1,024-host study")
    study.add_argument("--parts", type=_list(str), default=["gpus", "rates", "jobs", "pcie"])
    study.add_argument("--strategies", type=_strategies, default=list(STRATEGIES))
    study.add_argument("--quick", action="store_true", help="a few cases only")
    study.add_argument("--out", type=Path, default=Path("build/sim"))
    study.add_argument("--plots", type=Path, default=None,
                       help="where the study's plots go (default: --out)")
    study.add_argument("--docs", type=Path, nargs="?", const=DEFAULT_DOC, default=None)
    study.add_argument("--from-csv", type=Path, default=None,
                       help="draw the plots and tables of a study.csv written before, without "
                            "simulating")
    for p in (run, val, fit, study):
        p.add_argument("--jobs", type=int, default=2, help="simulations at once (default 2)")
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in (*COMMANDS, "-h", "--help"):
        argv = ["run", *argv]
    args = parser().parse_args(argv)
    missing = simgrid_missing()
    if missing:
        print(f"python -m sim: {missing}", file=sys.stderr)
        return 2
    return {"run": cmd_run, "validate": cmd_validate, "fit": cmd_fit,
            "study": cmd_study}[args.command](args)


def _progress(i: int, n: int, result) -> None:
    status = f"error: {result.error}" if result.error else \
        ", ".join(f"{t * 1e3:.1f} ms" for t in result.seconds.values())
    print(f"[{i}/{n}] {result.label}: {status} ({result.wall_s:.1f} s)", flush=True)


def write_csv(path: Path, columns: list[str], rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)


def cmd_run(args) -> int:
    from sim import measured, runs
    from sim.runner import run_cases
    if args.fabric:
        spec = fabric.parse_spec(args.fabric, args.gpus or 1, args.link_mbps or 100_000.0,
                                 args.oversubscription)
        topo = fabric.generate(spec)
    else:
        topo = fabric.reshape(fabric.load(args.topo), args.link_mbps, args.gpus)
    kind = args.costs or ("datacenter" if args.fabric else "emulation")
    cal = None
    if kind == "emulation":
        cal = measured.load(args.measured).calibration[args.target]
    gpus = next(iter(topo.hosts.values())).gpus
    spec = runs.RunSpec(topo, args.strategies, args.sizes, args.hosts,
                        runs.make_costs(kind, cal, gpus, args.in_host), args.target, args.window,
                        cal, args.max_chunks)
    built = runs.cases(spec)
    rows = [runs.row(meta, result) for (_, meta), result in
            zip(built, run_cases([c for c, _ in built], args.jobs, _progress), strict=True)]
    out = args.out / "sim.csv"
    write_csv(out, runs.COLUMNS, rows)
    print(f"wrote {out}")
    for r in rows:
        print(f"{r['strategy']:9s} {format_size(r['size_bytes']):>9s} "
              f"{r['sim_s'] * 1e3:10.2f} ms  {r['algbw_gbps']:.3f} Gbit/s {r['error']}")
    if not args.no_plots:
        from sim import plots
        for path in plots.plot_runs(rows, args.out):
            print(f"wrote {path}")
    return 1 if any(r["error"] for r in rows) else 0


def cmd_validate(args) -> int:
    from sim import measured, report, validate
    rep = measured.load(args.measured)
    cells = validate.cells_in(rep, strategies=args.strategies)
    started = time.monotonic()
    rows = validate.validate(rep, cells, args.jobs, args.max_chunks)
    validate.print_rows(rows)
    print(validate.summary(rows), f"({time.monotonic() - started:.0f} s)")
    write_csv(args.out / "validation.csv", validate.CSV_COLUMNS, [validate.csv_row(r)
                                                                  for r in rows])
    from sim import plots
    plot = plots.plot_validation(rows, args.out)
    if args.docs:
        report.write_validation(args.docs, rep, rows, args.measured)
        if plot is not None:
            report.copy_plot(plot, args.docs)
        print(f"wrote the validation into {args.docs}")
    return 1 if any(r.error for r in rows) else 0


def cmd_fit(args) -> int:
    from sim import costs, measured
    from sim.fit import fit
    rep = measured.load(args.measured)
    result = fit(rep, args.jobs)
    for name, value in result.constants.items():
        print(f"{name} = {value:g} (worst ratio of its cells {result.worst[name]:.3f})")
    if args.write:
        costs.write_fitted(result.constants, {n: f"{s}; {args.measured.name}"
                                              for n, s in result.sources.items()})
        print(f"wrote {costs.FITTED_FILE}")
    return 0


def cmd_study(args) -> int:
    from sim import plots, report, study
    if args.from_csv:
        rows = study.load_csv(args.from_csv)
    else:
        rows = _run_study(args)
    written = plots.plot_study(rows, args.plots or args.out)
    for path in written:
        print(f"wrote {path}")
    if args.docs:
        report.write_study(args.docs, rows, written)
        print(f"wrote the study into {args.docs}")
    return 1 if any(r.error for r in rows) else 0


def _run_study(args) -> list:
    from sim import study
    from sim.runner import run_cases
    todo = study.cases(args.parts, args.strategies, args.quick)
    print(f"{len(todo)} cases", flush=True)
    out = args.out / "study.csv"
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    with out.open("w", newline="") as f:  # row by row: a long study keeps what it did
        w = csv.DictWriter(f, fieldnames=study.COLUMNS, extrasaction="ignore")
        w.writeheader()
        for sc, result in zip(todo, run_cases([study.build(c) for c in todo], args.jobs,
                                              _progress), strict=True):
            rows.append(study.row(sc, result))
            w.writerow(rows[-1].to_dict())
            f.flush()
    print(f"wrote {out}")
    return rows
