"""What `make run-topology`'s allreduce prints about its own limits: each host's share of its
shaped link, and a CPU-bound notice when no link was close to busy (no root needed)."""

from __future__ import annotations

from topologies.link_rate import CPU_BOUND_BELOW
from topologies.reports import report_allreduce


def host(busy: float | None, mbps: float = 100) -> dict:
    r = {"ok": True, "correct": True, "strategy": "passing", "bytes": 4 << 20, "mean_s": 2.0,
         "goodput_gbps": 0.017, "max_error": 1e-7, "retransmissions": 3,
         "link_bytes_per_call": 5e6, "link_mbps": mbps}
    if busy is not None:
        r["link_busy"] = busy
    return r


def test_links_far_from_busy_are_reported_as_cpu_bound(capsys):
    assert report_allreduce({"h1": host(0.2), "h2": host(0.3)})
    out = capsys.readouterr().out
    assert "h1 [passing]" in out and "host link 20% busy" in out
    assert "*** CPU-bound: the 100 Mbit/s host links were at most 30% busy" in out


def test_a_busy_link_is_not_called_cpu_bound(capsys):
    assert report_allreduce({"h1": host(0.2), "h2": host(CPU_BOUND_BELOW + 0.3)})
    assert "CPU-bound" not in capsys.readouterr().out


def test_unshaped_links_say_nothing_about_the_bound(capsys):
    assert report_allreduce({"h1": host(None, mbps=0)})
    out = capsys.readouterr().out
    assert "busy" not in out and "CPU-bound" not in out


def test_a_wrong_sum_is_still_the_verdict(capsys):
    bad = {**host(0.9), "correct": False}
    assert not report_allreduce({"h1": bad})
    assert "WRONG" in capsys.readouterr().out


def test_the_cpus_share_is_said_and_a_saturated_machine_named(capsys):
    """Links busy enough and the CPUs nearly all busy: the run is not called CPU-bound by its
    links, but the CPUs' share says the time may be this machine's too; below 90% the share
    is only said, and without one nothing is."""
    assert report_allreduce({"h1": host(0.88)}, cpu_busy=0.93)
    out = capsys.readouterr().out
    assert "CPU-bound" not in out
    assert "*** this machine's CPUs were 93% busy during the calls: the time may be" in out
    assert report_allreduce({"h1": host(0.88)}, cpu_busy=0.5)
    out = capsys.readouterr().out
    assert "CPUs were 50% busy during the calls\n" in out
    assert report_allreduce({"h1": host(0.88)})
    assert "CPUs" not in capsys.readouterr().out
