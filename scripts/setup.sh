#!/usr/bin/env bash
# One-command set-up on a fresh Debian 12 machine (run as root): the Debian packages the project and
# its tests use, a virtualenv in .venv built on Debian's own Python 3 (so Debian's Mininet is
# importable from it), and the exact Python dependencies of requirements.lock.
# p4c and BMv2 are not installed here: no package registry carries them (see README).
# torch: requirements.lock pins torch==2.13.0, which the CPU build 2.13.0+cpu also satisfies and
# pip prefers wherever it sees one: this project's machines keep it on local disk, where pip
# finds it; elsewhere `PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu ./scripts/setup.sh`
# (as docker/Dockerfile does) brings it, while PyPI alone brings the multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(python3 python3-venv python3-dev gcc libc6-dev make iproute2 iputils-ping ethtool tcpdump nftables iperf3 mininet python3-simgrid)

if [ "$(id -u)" -eq 0 ]; then
    missing=()
    for p in "${APT_PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        echo "setup: installing Debian packages: ${missing[*]}"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
    fi
else
    echo "setup: not root, skipping Debian packages (${APT_PACKAGES[*]}); tests that need root will skip"
fi

if [ ! -x .venv/bin/python ]; then
    /usr/bin/python3 -m venv --system-site-packages .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -r requirements.lock
.venv/bin/python -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
echo "setup: torch $(.venv/bin/python -c 'import torch; print(torch.__version__)')"
# The model switch's compiled PASSING path (switch_model/fastpath.c), built now so that no switch
# pays for it at start; a switch rebuilds it itself after an edit or for another PASSING_K.
.venv/bin/python -m switch_model.fastpath
# The host agent's compiled window (host_agent/window.c), likewise.
.venv/bin/python -m host_agent.window_c
echo "setup: done. Run the tests with: make test"
