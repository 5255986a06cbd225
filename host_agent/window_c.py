"""The host agent's window compiled (window.c): a call's packets built and its results taken a
batch at a time in one C call each, where SlotStreamer's numpy takes some fifty array
operations a pass (on a machine whose two cores also run the emulated switches, the agents'
numpy was a quarter of all CPU time at 80 Mbit/s; see docs/history.md).

Only the batch work is compiled: SlotStreamer._send's packet building and slot state, and
SlotStreamer._collect's matching with _Call.absorb. Loss recovery, probes, quorum and results
kept early stay in Python, on the same arrays. `PASSING_AGENT_WINDOW=python` (or a machine
without a C compiler) keeps the numpy path; tests/host_agent/test_window_c.py holds the two to
the same bytes sent and the same state after every batch.
"""

from __future__ import annotations

import ctypes
import logging
import os
from pathlib import Path

import numpy as np

from host_agent import fixed_point as fx
from passing import cbuild, packet
from passing import protocol as P

log = logging.getLogger("host_agent.window_c")

SOURCE = Path(__file__).with_name("window.c")
# Environment variable: "python" keeps the numpy window (the reference) in every streamer.
PATH_ENV = "PASSING_AGENT_WINDOW"
TAG_LAST = 0x80

# The layout of the context, as window.c's enum.
(X_BLOCKS, X_BLOCKS_F32, X_LOCAL_EXP, X_AGREED, X_PREDICTED, X_PROPOSED, X_REDO, X_OUT,
 X_COUNTS, X_STEP, X_PENDING, X_PFRAG, X_PROUND, X_FIRST_SEQ, X_LAST_SEQ, X_SENT, X_CLOSE,
 X_WAITED, X_CLOSE_NEXT, X_ABSTAINING, X_RESENT, X_RETRIED, X_PROBED, X_PAYLOADS, X_ROUNDS,
 X_NFRAG, X_USED, X_SBITS, X_TAG, X_QUORUM, X_EAGER, X_LOCAL_GPUS, X_POOL_FLAG, X_EPOCH_BITS,
 X_JOB, X_SESSION, X_WINDOW, X_RESULT_FLAGS, X_COMPLETE, X_LEN) = range(40)
# Each array of a call the context points at, with the dtype window.c reads it as.
_ARRAYS = ((X_LOCAL_EXP, "local_exp", np.uint8), (X_AGREED, "agreed", np.uint8),
           (X_PROPOSED, "proposed", np.uint8), (X_REDO, "redo", np.bool_),
           (X_OUT, "out", np.float64), (X_COUNTS, "counts", np.int64),
           (X_STEP, "step", np.int64), (X_PENDING, "pending", np.bool_),
           (X_PFRAG, "p_frag", np.int64), (X_PROUND, "p_round", np.uint32),
           (X_FIRST_SEQ, "first_seq", np.int64), (X_LAST_SEQ, "last_seq", np.int64),
           (X_SENT, "sent", np.float64), (X_CLOSE, "close", np.bool_),
           (X_WAITED, "waited", np.bool_), (X_CLOSE_NEXT, "close_next", np.bool_),
           (X_ABSTAINING, "abstaining", np.bool_), (X_RESENT, "resent", np.bool_),
           (X_RETRIED, "retried", np.bool_), (X_PROBED, "probed", np.bool_))


def _defines() -> dict[str, int]:
    fields = packet.PAYLOAD_DTYPE.fields
    d = {f"OFF_{name.upper()}": fields[name][1] for name in packet.PAYLOAD_DTYPE.names}
    d.update({"K": P.K, "PAYLOAD_BYTES": P.PAYLOAD_BYTES, "EXP_BIAS": fx.EXP_BIAS,
              "POISON": fx.POISON, "MIN_E": fx._MIN_E, "SPEC_SLACK": fx.SPEC_SLACK,
              "TAG_LAST": TAG_LAST, "FLAG_CONTRIB": int(P.Flag.CONTRIB),
              "FLAG_CLOSE": int(P.Flag.CLOSE), "FLAG_CONGESTED": int(P.Flag.CONGESTED)})
    return d


def build() -> Path:
    """The compiled library for this source and these constants, built if not yet there."""
    return cbuild.build(SOURCE, "window", _defines())


def _open(lib: Path) -> ctypes.CDLL:
    dll = ctypes.CDLL(str(lib))
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    dll.wc_send.restype = None
    dll.wc_send.argtypes = [p, p, i64, i64, p]
    dll.wc_take.restype = None
    dll.wc_take.argtypes = [p, p, i64, ctypes.c_double, p, p, p, p, p, p]
    dll.wc_abi.restype = ctypes.c_int
    if dll.wc_abi() != X_LEN * 1000 + P.K:
        raise OSError(f"{lib.name}: not built for this layout (context of {X_LEN}, K={P.K})")
    return dll


_loaded: CompiledWindow | None | bool = False  # False: not tried yet


def load() -> CompiledWindow | None:
    """The compiled window, or None: PASSING_AGENT_WINDOW=python, or no library could be built
    (said once, in the log)."""
    global _loaded
    if os.environ.get(PATH_ENV, "").strip().lower() == "python":
        return None
    if _loaded is False:
        try:
            _loaded = CompiledWindow(_open(build()))
        except OSError as e:
            log.warning("the compiled agent window is unavailable, the agent takes numpy's "
                        "(slower): %s", e)
            _loaded = None
    return _loaded


class Taken:
    """What `CompiledWindow.take` took from a batch of results."""

    def __init__(self, code: np.ndarray, slots: np.ndarray, keep: np.ndarray, more: np.ndarray,
                 newest: int, rtt_median: float | None, rtt_min: float | None, missed: int,
                 marked: int):
        self.code, self.slots, self.keep, self.more = code, slots, keep, more
        self.newest, self.rtt_median, self.rtt_min, self.missed = newest, rtt_median, rtt_min, \
            missed
        self.marked = marked  # results taken that carried FLAG_CONGESTED

    @property
    def unmatched(self) -> np.ndarray:
        """Per row: a result of this session that was not taken (SlotStreamer._keep_early)."""
        return self.code == 2


class CompiledWindow:
    """window.c's functions on one call's context (`context`)."""

    def __init__(self, dll: ctypes.CDLL):
        self.dll = dll

    @staticmethod
    def context(call, streamer) -> np.ndarray:
        """The context of `call` (a host_agent.stream._Call) of `streamer`: pointers to its
        arrays (which must live as long as it is used) and the constants they need."""
        cfg = streamer.cfg
        x = np.zeros(X_LEN, dtype=np.uint64)
        blocks = call.blocks
        if not blocks.flags.c_contiguous or blocks.dtype not in (np.float32, np.float64):
            raise ValueError("blocks must be C-contiguous float32 or float64")
        x[X_BLOCKS], x[X_BLOCKS_F32] = blocks.ctypes.data, blocks.dtype == np.float32
        for i, name, dtype in _ARRAYS:
            a = getattr(call, name)
            if a.dtype != dtype or not a.flags.c_contiguous:
                raise ValueError(f"call.{name}: {a.dtype}, not C-contiguous {np.dtype(dtype)}")
            x[i] = a.ctypes.data
        if call.predicted is not None:
            x[X_PREDICTED] = call.predicted.ctypes.data
        x[X_PAYLOADS] = call.payloads.ctypes.data
        x[X_ROUNDS] = streamer.rounds.ctypes.data
        x[X_NFRAG], x[X_USED], x[X_SBITS], x[X_TAG] = call.nfrag, call.used, call.s_bits, call.tag
        x[X_QUORUM], x[X_EAGER] = call.quorum, call.eager
        x[X_LOCAL_GPUS], x[X_POOL_FLAG] = cfg.local_gpus, streamer._pool_flag
        x[X_EPOCH_BITS], x[X_JOB], x[X_SESSION] = streamer._epoch_bits, cfg.job_id, cfg.session
        x[X_WINDOW], x[X_RESULT_FLAGS] = cfg.window, streamer._result_flags
        x[X_COMPLETE] = cfg.complete
        return x

    def send(self, ctx: np.ndarray, slots: np.ndarray, seq0: int) -> tuple[int, int]:
        """Build the next packet of each of `slots` (int64) into the call's payloads and set
        the slots waiting on them; (packets that abstain, packets that ask for CLOSE)."""
        slots = np.ascontiguousarray(slots, dtype=np.int64)
        res = np.zeros(3, dtype=np.int64)
        self.dll.wc_send(ctx.ctypes.data, slots.ctypes.data, slots.size, seq0, res.ctypes.data)
        if res[2]:
            raise RuntimeError(
                f"agent window: slot {int(slots[res[2] - 1])} has no next packet in this call "
                "(a bug in the window's bookkeeping; nothing was sent)")
        return int(res[0]), int(res[1])

    def take(self, ctx: np.ndarray, rows: np.ndarray, now: float) -> Taken:
        """Take the awaited results among `rows` ((n, PAYLOAD_BYTES) uint8, in order of
        arrival) at time `now`: absorbed into the call, their slots' rounds counted."""
        rows = np.ascontiguousarray(rows, dtype=np.uint8)
        if rows.ndim != 2 or rows.shape[1] != P.PAYLOAD_BYTES:
            raise ValueError(f"rows must be (n, {P.PAYLOAD_BYTES}) bytes")
        n = rows.shape[0]
        code = np.empty(n, dtype=np.uint8)
        slots, keep, more = (np.empty(n, dtype=np.int64) for _ in range(3))
        rtt = np.empty(n + 2, dtype=np.float64)
        res = np.zeros(6, dtype=np.int64)
        self.dll.wc_take(ctx.ctypes.data, rows.ctypes.data, n, now, code.ctypes.data,
                         slots.ctypes.data, keep.ctypes.data, more.ctypes.data,
                         rtt.ctypes.data, res.ctypes.data)
        taken, nmore, newest, clean, missed, marked = (int(v) for v in res)
        return Taken(code, slots[:taken], keep[:taken], more[:nmore], newest,
                     float(rtt[0]) if clean else None, float(rtt[1]) if clean else None, missed,
                     marked)


def main() -> int:
    print(f"window: {build()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
