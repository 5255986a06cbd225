"""Packets per second of the software switch model's pipeline on one core, without I/O.

Full aggregation packets (K values, PASSING_K) of a fan-in-4 job over a 256-slot pool, round
after round, so every packet is admitted, added into its slot, and every fourth
completes the slot and is multicast to 4 members (4 frames built). This is the cost the model
adds per packet; `bench.switch_pps --target model` measures it with raw-socket I/O included.
`--pipeline compiled` (the switch's default) takes the packets through the compiled PASSING
path (switch_model/fastpath.c) in batches of 64, as the switch's port loop does; `python`
through Pipeline.process one by one.

    python -m bench.model_pipeline [--packets 200000] [--pipeline compiled|python]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from passing import protocol as P
from testbed.entries import contribution
from testbed.loopback import LoopbackSwitch

FAN_IN, POOL, DEV = 4, 256, 0
BATCH = 64


def setup():
    """The model's pipeline with one root job of FAN_IN hosts over POOL slots."""
    return LoopbackSwitch(FAN_IN, job_id=1, slots=POOL).pipe


def frames(rounds: int) -> list[tuple[int, bytes]]:
    rng = np.random.default_rng(0)
    vals = rng.integers(-(2**20), 2**20, size=(FAN_IN, P.K))
    return [(port, contribution(DEV, port, vals[port - 1], job_id=1, slot=s, round=r,
                                frag=r * POOL + s))
            for r in range(rounds) for s in range(POOL) for port in range(1, FAN_IN + 1)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--packets", type=int, default=200_000)
    ap.add_argument("--pipeline", choices=("compiled", "python"), default="compiled")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    pipe = setup()
    if args.pipeline == "compiled" and not pipe.use_compiled():
        ap.error("the compiled path could not be built (see the warning above)")
    rounds = max(2, args.packets // (POOL * FAN_IN))
    work = frames(rounds)
    out = 0
    if args.pipeline == "python":
        process = pipe.process
        t0 = time.perf_counter()
        for port, frame in work:
            out += len(process(port, frame))
        dt = time.perf_counter() - t0
    else:
        # Batches of one port's frames, as a port's receive batch brings them.
        by_port = [(port, [f for p, f in work[i:i + 4 * BATCH] if p == port])
                   for i in range(0, len(work), 4 * BATCH) for port in range(1, FAN_IN + 1)]
        t0 = time.perf_counter()
        for port, batch in by_port:
            out += len(pipe.process_batch(port, batch))
        dt = time.perf_counter() - t0
    completed = int(pipe.state.counters["job_stats"][P.JobEvent.COMPLETE_ROOT, 0])
    assert completed == rounds * POOL, "every slot of every round must complete"
    res = {"K": P.K, "pipeline": args.pipeline, "packets": len(work), "seconds": round(dt, 3),
           "pps": round(len(work) / dt), "values_per_s": round(len(work) * P.K / dt),
           "frames_out": out, "slots_completed": completed}
    print(json.dumps(res) if args.json else
          f"model pipeline ({args.pipeline}), K={P.K}: {res['pps']} packets/s = "
          f"{res['values_per_s']} values/s "
          f"on one core ({len(work)} packets, {completed} slots completed, {out} frames out)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
