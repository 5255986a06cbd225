"""K, the values per packet, is chosen with PASSING_K (64, 128, 256 or 320) and everything derived
from it follows: this process runs one K, so the K-sensitive test modules run again here in a
fresh interpreter at every other K (protocol, packer, scapy layer, SWAR lanes, the model's
register layout, the P4 program as preprocessed for that K, and agents' streams through the
model)."""

import os
import subprocess
import sys

import pytest

from passing import protocol as P
from tests import REPO

K_SENSITIVE = ["tests/unit/test_lanes.py", "tests/unit/test_packet.py",
               "tests/unit/test_scapy_layer.py", "tests/unit/test_model_registers.py",
               "tests/p4/test_p4_matches_python.py", "tests/host_agent/test_stream.py",
               "tests/bench/test_analytic.py"]


def env_with_k(k: str | None) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop(P.K_ENV, None)
    if k is not None:
        env[P.K_ENV] = k
    return env


def test_k_comes_from_the_environment_with_a_default():
    assert P.k_from(None) == P.k_from("") == P.DEFAULT_K
    for k in P.K_CHOICES:
        assert P.k_from(str(k)) == P.k_from(f" {k}\n") == k
    assert P.VALUE_WORDS * 64 == P.K and P.VALUES_BYTES == 4 * P.K
    assert P.FRAME_BYTES == 14 + 20 + 8 + 28 + 4 * P.K


@pytest.mark.parametrize("bad", ["100", "32", "384", "512", "0", "-64", "sixty-four", "64.0"])
def test_a_bad_k_is_refused_with_the_choices(bad):
    with pytest.raises(P.KError, match=f"PASSING_K='{bad}': K .* must be one of 64, 128, 256, 320"):
        P.k_from(bad)


def test_a_bad_k_stops_any_command():
    res = subprocess.run([sys.executable, "-c", "import passing.packet"], cwd=REPO,
                         env=env_with_k("100"), capture_output=True, text=True)
    assert res.returncode != 0
    assert "KError: PASSING_K='100': K (values per packet) must be one of 64, 128, 256, 320" \
        in res.stderr


@pytest.mark.parametrize("k", [k for k in P.K_CHOICES if k != P.K])
def test_k_sensitive_modules_pass_at_every_other_k(k):
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          *K_SENSITIVE], cwd=REPO, env=env_with_k(str(k)), capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert " passed" in res.stdout and " failed" not in res.stdout
