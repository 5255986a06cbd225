"""What the Mininet CLI prints for `allreduce` and `train`: one line per host or rank, and a
verdict; True when every result was right."""

from __future__ import annotations

import json

from topologies.cpu_load import SATURATED_FROM
from topologies.link_rate import CPU_BOUND_BELOW


def report_allreduce(res: dict[str, dict], cpu_busy: float | None = None) -> bool:
    """Print one line per host, and whether the emulated links or this machine's CPU limited
    the run (the links' shares, and the CPUs' during the calls where known); True when every
    host got the correct sum."""
    ok = True
    for host, r in sorted(res.items()):
        if not r.get("ok"):
            print(f"{host}: FAILED: {r.get('error')}")
            ok = False
            continue
        ok &= bool(r["correct"])
        print(f"{host} [{r.get('strategy')}]: {r['bytes'] / 2**20:.2f} MiB in "
              f"{r['mean_s'] * 1e3:.1f} ms, "
              f"{r['goodput_gbps']:.3f} Gbit/s, {'correct' if r['correct'] else 'WRONG'} vs "
              f"numpy (max error {r['max_error']:.1e}), {r['retransmissions']} retransmissions"
              + (f", host link {r['link_busy']:.0%} busy" if "link_busy" in r else "")
              + _host_collective_text(r))
    busy = [r["link_busy"] for r in res.values() if "link_busy" in r]
    if busy and max(busy) < CPU_BOUND_BELOW:
        rate = max(r["link_mbps"] for r in res.values() if "link_busy" in r)
        print(f"*** CPU-bound: the {rate:g} Mbit/s host links were at most {max(busy):.0%} busy "
              "during a call, so this machine's CPU (switch processes and agents), not the "
              "emulated links, set the time; see README, \"Running a topology\"")
    if cpu_busy is not None:
        print(f"*** this machine's CPUs were {cpu_busy:.0%} busy during the calls"
              + (": the time may be the CPU's as well as the links' (the kernel carries every "
                 "frame through the shaped veths)" if cpu_busy >= SATURATED_FROM else ""))
    return ok


def report_windows(res: dict[str, dict]) -> None:
    """Each host's congestion window (docs/protocol.md, "Congestion control") in a passing
    allreduce's reports `res`: its size after the last call, the results that came marked, the
    times it shrank, and the packets resent."""
    if not res:
        print("hosts: no passing allreduce yet (their windows show after one)")
        return
    for host, r in sorted(res.items()):
        if "window" in r:
            print(f"{host}: window {r['window']} packets, {r['marks']} marked results, "
                  f"{r['window_cuts']} cuts, {r['retransmissions']} resent of "
                  f"{r['packets']} packets")


def _host_collective_text(r: dict) -> str:
    """How many calls a job waiting for switch slots summed among its hosts instead."""
    calls = r.get("host_calls", 0)
    if not calls:
        return ""
    moved = [m for m in r.get("pool_moves", []) if m[0] == calls]
    return (f"; {calls} calls over the host collective (the job waited for switch slots"
            + (f", then moved onto the switch with window {moved[0][2]})" if moved else ")"))


def report_train(res: dict[str, dict]) -> bool:
    """Print one line per rank (a host whose ranks never reported: one line) and a verdict;
    True when every rank finished."""
    ranks = []
    for host, r in res.items():
        for rank in r["ranks"]:
            ranks.append((rank.get("rank", -1), host, rank))
        if not r["ok"] and all(rank.get("ok") for rank in r["ranks"]):
            print(f"{host}: FAILED: {r['error']}")
    for _, host, r in sorted(ranks, key=lambda x: x[0]):
        print(_rank_line(f"{host} rank {r.get('rank')} (local {r.get('local_rank')})", r))
    failed = [r for _, _, r in ranks if not r.get("ok")]
    # Only a script's JSON report gives these (examples/train_ddp.py's); another script's
    # ranks are judged by their exit status alone.
    worlds = {r["world_size"] for _, _, r in ranks if "world_size" in r}
    losses = [r["final_loss"] for _, _, r in ranks if "final_loss" in r]
    logs = ", ".join(sorted({r["log_dir"] for r in res.values()}))
    if not all(r["ok"] for r in res.values()):
        print(f"train: FAILED ({len(failed)} of {len(ranks)} ranks; logs in {logs})")
        return False
    if worlds and worlds != {len(ranks)}:
        print(f"train: FAILED: world sizes {sorted(worlds)} for {len(ranks)} ranks")
        return False
    print(f"train: ok, {len(ranks)} ranks on {len(res)} hosts, "
          + (f"final loss {min(losses):.4f}..{max(losses):.4f}" if losses
             else "exit code 0 on every rank"))
    return True


def _rank_line(where: str, r: dict) -> str:
    if not r.get("ok"):
        return f"{where}: FAILED: {r.get('error')}"
    if "final_loss" in r:  # examples/train_ddp.py's report
        return (f"{where} [{r.get('backend')}]: final loss {r['final_loss']:.4f}, accuracy "
                f"{r['accuracy']:.3f}, {r['iters_per_s']:.1f} it/s, world size "
                f"{r.get('world_size')}, ok")
    code = "" if r.get("exit_code") is None else f", exit code {r['exit_code']}"
    last = r["output"] if "output" in r else json.dumps(
        {k: v for k, v in r.items() if k not in _RESULT_KEYS})
    return f"{where}: ok{code}; printed last: {last or '(nothing)'}"


# What topologies/train_results.py adds to a rank's report: not the script's own words.
_RESULT_KEYS = {"ok", "exit_code", "rank", "host", "local_rank"}
