"""`passing-ctl job ...`: what each job command does on the controller and what it prints
(a JSON-able result and the text for a terminal)."""

from __future__ import annotations

import json
from pathlib import Path

from controller.core import (
    Controller,
    ControllerError,
    port_span,
)
from controller.job_plan import JobSpec


def _patience_text(patience: tuple[float, ...]) -> str:
    if not patience:
        return "no patience (never ask to close)"
    if len(patience) == 1:
        return f"patience {patience[0]:g} s"
    return f"patience {patience[0]:g}..{patience[1]:g} s (adaptive)"



def _waiting_text(spec: JobSpec) -> str:
    """What a job waiting for slots does meanwhile, and when that ends."""
    want = f"a window of {spec.window}" + (f" (at least {spec.min_window})"
                                           if spec.min_window else "")
    return (f"its switches cannot hold {want} now, so its hosts sum with a host collective "
            "(the in-host stage, then a ring among the hosts' leaders); the controller moves it "
            "onto the switches, live, at the first call (job create, delete, resize, show, "
            "reconcile) after which they can")



def _moves(ctl: Controller) -> dict[str, list[dict]]:
    """What the call did besides (`--json`): waiting jobs placed, running jobs shrunk for
    them, shrunk jobs grown back."""
    return {key: [{"job_id": r.job_id, "window": r.pools[0].size, "pool_epoch": r.pool_epoch}
                  for r in jobs]
            for key, jobs in (("placed", ctl.placed), ("shrunk", ctl.shrunk),
                              ("grown", ctl.grown))}



def placed_text(ctl: Controller) -> str:
    """The waiting jobs this call moved onto their switches, and the running jobs it shrank
    for them."""
    return "".join(f"\njob {r.job_id} moved onto its switches: window {r.pools[0].size} (pool "
                   f"epoch {r.pool_epoch}); its agents leave the host collective at a call "
                   "boundary" for r in ctl.placed) + \
        "".join(f"\njob {r.job_id} shrunk to a window of {r.pools[0].size} (pool epoch "
                f"{r.pool_epoch}) to make room for jobs waiting for slots; its old pool is "
                "freed once its hosts have moved" for r in ctl.shrunk) + \
        "".join(f"\njob {r.job_id} grown back to a window of {r.pools[0].size} (pool epoch "
                f"{r.pool_epoch}), toward the {_asked(r)} it asked for" for r in ctl.grown)


def _asked(rec) -> int:
    """What a job grown back had asked for before it was shrunk: still asked (a partial
    growth), else the window it has now."""
    return rec.spec.get("asked_window") or rec.spec["window"]



def _pools(rec) -> list[dict]:
    return [{"switch": p.switch, "slots": f"{p.base}-{p.base + p.size - 1}" if p.size else "-",
             "size": p.size,
             "fan_in": p.fan_in, "role": "root" if p.is_root else "non-root",
             "generation": p.gen} for p in rec.pools]



def _retiring(rec) -> list[dict]:
    return [{"switch": r.switch, "slots": f"{r.base}-{r.base + r.size - 1}", "size": r.size,
             "generation": r.gen, "pool_bit": r.bit} for r in rec.retiring]



def _move_text(rec, move: dict | None, error: str | None) -> str:
    """`job show`'s line on the job's pool epoch and, during a resize, who has not moved."""
    text = f"pool epoch {rec.pool_epoch} (FLAG_POOL {rec.pool_bit})"
    if rec.installing:
        return text + ("; its resize was interrupted before every switch had the new pool: "
                       "run `passing-ctl reconcile`")
    if error is not None:
        return text + f"; old pool retiring, cannot tell which hosts have moved: {error}"
    if move is None or not move["pending"]:
        return text
    return (text + "; old pool retiring until every host has contributed to the new one; "
            f"moved: {', '.join(move['moved']) or 'none'}; not yet: "
            f"{', '.join(move['waiting'])}\nretiring:\n"
            + table(_retiring(rec), ["switch", "slots", "size", "generation"]))



def _agent_ports(ctl: Controller, rec) -> str:
    return port_span(JobSpec.from_dict(rec.spec).agent_ports(ctl.topo))



def table(rows: list[dict], cols: list[str]) -> str:
    widths = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in cols}
    lines = ["  ".join(c.upper().ljust(widths[c]) for c in cols)]
    lines += ["  ".join(str(r.get(c, "")).ljust(widths[c]) for c in cols) for r in rows]
    return "\n".join(lines)



def _write_params(path: str | None, params: dict) -> None:
    """--params-out: the agents' parameters as the file agents load (JobParams.load)."""
    if path:
        Path(path).write_text(json.dumps(params, indent=2) + "\n")



def run_job(ctl: Controller, args) -> tuple[object, str]:
    if args.job_cmd == "create":
        hosts = tuple(ctl.topo.hosts) if args.all_hosts else \
            tuple(h.strip() for h in args.hosts.split(",") if h.strip())
        spec = JobSpec(args.job_id, hosts, args.window, args.min_window,
                       agent_port=args.agent_port, mode=args.mode, quorum=args.quorum,
                       patience=args.patience, staleness=args.staleness,
                       fallback=not args.no_fallback)
        rec = ctl.create_job(spec)
        params = ctl.agent_params(rec.job_id).to_dict()
        _write_params(args.params_out, params)
        res = {"job_id": rec.job_id, "pools": _pools(rec), "waiting": rec.waiting,
               **_moves(ctl), "agent_params": params}
        head = (f"job {rec.job_id} created on {', '.join(p.switch for p in rec.pools)}, "
                f"agent ports {_agent_ports(ctl, rec)}")
        if rec.waiting:
            return res, (f"{head}, WAITING for slots: {_waiting_text(spec)}"
                         + placed_text(ctl))
        return res, (f"{head}:\n" + table(_pools(rec), ["switch", "slots", "size", "fan_in",
                                                         "role"]) + placed_text(ctl))
    if args.job_cmd == "set":
        rec = ctl.set_policy(args.job_id, quorum=args.quorum, patience=args.patience,
                             staleness=args.staleness)
        spec = JobSpec.from_dict(rec.spec)
        per = ctl.quorums(args.job_id)
        rows = [{"switch": sw, **q} for sw, q in per.items()]
        agents = {"patience": list(spec.patience), "staleness": spec.staleness,
                  "policy": spec.policy}
        if args.params_out:
            _write_params(args.params_out, ctl.agent_params(args.job_id).to_dict())
        return {"job_id": args.job_id, "quorum": per, "agents": agents}, (
            f"job {args.job_id}: " + ("rounds wait for everyone" if not spec.quorum else
                                      f"quorum {','.join(map(str, spec.quorum))}")
            + f"; agents: {_patience_text(spec.patience)}, staleness {spec.staleness} (policy "
            f"{spec.policy}: running agents of the passing backend change to it after the same "
            "call, within their PASSING_POOL_POLL; new ones start with it)\n"
            + table(rows, ["switch", "fan_in", "quorum"]))
    if args.job_cmd == "resize":
        return resize(ctl, args)
    if args.job_cmd == "delete":
        rec = ctl.delete_job(args.job_id)
        freed = ", ".join(f"{p.switch} {p.base}-{p.base + p.size - 1}"
                          for p in (*rec.pools, *rec.retiring) if p.size)
        return {"job_id": rec.job_id, "freed": _pools(rec) + _retiring(rec),
                **_moves(ctl)}, \
            f"job {rec.job_id} deleted; slots freed: {freed or 'none'}" + placed_text(ctl)
    if args.job_cmd == "list":
        rows = [{"job": r.job_id, "mode": r.spec.get("mode", "passing"),
                 "hosts": ",".join(r.spec["hosts"]),
                 "window": (f"waiting ({r.spec['window']})" if r.waiting
                            else r.pools[0].size),
                 "switches": ",".join(p.switch for p in r.pools)}
                for r in ctl.store.jobs()]
        cols = ["job", "mode", "hosts", "window", "switches"]
        return rows, table(rows, cols) if rows else "no jobs"
    if args.job_cmd == "show":
        ctl.job(args.job_id)  # an unknown job is refused before any switch is asked
        move, error = None, None
        try:
            move = ctl.retire_pools(args.job_id).to_dict()
        except ControllerError as e:  # shown, not fatal: the rest comes from the state file
            error = str(e)
        rec = ctl.job(args.job_id)
        params = ctl.agent_params(args.job_id).to_dict()
        res = {"job_id": rec.job_id, "spec": rec.spec, "pools": _pools(rec),
               "waiting": rec.waiting, "pool_epoch": rec.pool_epoch,
               "installing": rec.installing,
               "retiring": _retiring(rec), "move": move, "agent_params": params,
               **_moves(ctl)}
        if error is not None:
            res["move_error"] = error
        where = (f"WAITING for slots: {_waiting_text(JobSpec.from_dict(rec.spec))}"
                 if rec.waiting else _move_text(rec, move, error))
        return res, (f"job {rec.job_id}: hosts {', '.join(rec.spec['hosts'])}, agent ports "
                     f"{_agent_ports(ctl, rec)}, {where}\n"
                     + table(_pools(rec), ["switch", "slots", "size", "fan_in", "role",
                                            "generation"])
                     + "\n\nagent parameters:\n" + json.dumps(params, indent=2)
                     + placed_text(ctl))
    raise AssertionError(args.job_cmd)



def resize(ctl: Controller, args) -> tuple[object, str]:
    """`job resize`: the job's new pools, its retiring ones and the agents' new parameters."""
    if args.min_window is not None and args.min_window > args.window:
        raise ControllerError(f"job {args.job_id} not resized: --min-window {args.min_window} "
                              f"is larger than --window {args.window}")
    rec = ctl.resize_job(args.job_id, args.window, args.min_window)
    params = ctl.agent_params(rec.job_id).to_dict()
    _write_params(args.params_out, params)
    size = rec.pools[0].size
    res = {"job_id": rec.job_id, "window": size, "pool_epoch": rec.pool_epoch,
           "pools": _pools(rec), "retiring": _retiring(rec), "agent_params": params}
    return res, (f"job {rec.job_id} resized to a window of {size} (pool epoch "
                 f"{rec.pool_epoch}) on {', '.join(p.switch for p in rec.pools)}; its agents "
                 "move at a call boundary, and the old pool is freed once every host has "
                 "contributed to the new one:\n"
                 + table(_pools(rec), ["switch", "slots", "size", "fan_in", "role"])
                 + "\nretiring:\n" + table(_retiring(rec), ["switch", "slots", "size"]))

