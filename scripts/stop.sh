#!/usr/bin/env bash
# Clean up after `make run-topology`, also after Ctrl-C or a crash: the switch processes this
# project started (pid files under runs/), then Mininet's own leftovers (hosts, links).
set -u
cd "$(dirname "$0")/.."
for pidfile in runs/*/*.pid; do
    [ -e "$pidfile" ] || continue
    pid=$(cat "$pidfile")
    # Only a process that is still one of ours: a switch model or simple_switch_grpc.
    if grep -qaE 'switch_model|simple_switch_grpc' "/proc/$pid/cmdline" 2>/dev/null; then
        kill "$pid" 2>/dev/null && echo "stopped switch process $pid ($pidfile)"
    fi
    rm -f "$pidfile"
done
# The management network's bridge (topologies/management.py), left by a crash.
if ip link show passing-mgmt >/dev/null 2>&1; then
    ip link del passing-mgmt 2>/dev/null && echo "removed the management bridge passing-mgmt"
fi
# Loss rules on switch interfaces (topologies/link_loss.py): a table left behind would hook onto
# the same interface names in the next run and drop its frames.
if command -v nft >/dev/null 2>&1; then
    for table in $(nft list tables netdev 2>/dev/null | awk '$3 ~ /^passing_loss_/ {print $3}'); do
        nft delete table netdev "$table" && echo "removed loss rule $table"
    done
fi
if command -v mn >/dev/null 2>&1; then
    mn -c >/dev/null 2>&1 && echo "mininet cleaned up (mn -c)"
fi
exit 0
