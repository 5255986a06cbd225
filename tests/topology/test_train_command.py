"""The `train` command at the passing> prompt (topologies.run.PassingCLI.do_train), without
Mininet: what it hands the network's training runs, `--env` included, and what a bad command
line prints while the prompt stays alive."""

from __future__ import annotations

from topologies.run import PassingCLI


class RecordingNet:
    """A network whose `train` records what it was asked and reports one rank that did."""

    def __init__(self):
        self.calls: list[dict] = []

    def train(self, job_id, **kw) -> dict:
        self.calls.append({"job_id": job_id, **kw})
        return {"h1": {"ok": True, "log_dir": "/tmp/x",
                       "ranks": [{"ok": True, "rank": 0, "local_rank": 0, "output": "done"}]}}


def cli_of() -> tuple[PassingCLI, RecordingNet]:
    cli = PassingCLI.__new__(PassingCLI)  # the commands, without Mininet's interactive loop
    cli.pnet = RecordingNet()
    return cli, cli.pnet


def test_env_and_script_args_reach_the_ranks(capsys):
    cli, net = cli_of()
    cli.do_train("--script bench/ddp_overlap.py --env PASSING_OVERLAP=0 --env A=b=c "
                 "-- --steps 5")
    [call] = net.calls
    assert call["env"] == {"PASSING_OVERLAP": "0", "A": "b=c"}
    assert call["script"] == "bench/ddp_overlap.py"
    assert call["args"] == ("--epochs", "1", "--steps", "5")
    assert "train: ok, 1 ranks on 1 hosts" in capsys.readouterr().out


def test_a_bad_env_prints_the_usage_and_trains_nothing(capsys):
    cli, net = cli_of()
    cli.do_train("--env PASSING_OVERLAP")
    out = capsys.readouterr().out
    assert "--env 'PASSING_OVERLAP': NAME=VALUE" in out and "usage: train" in out
    assert net.calls == []
