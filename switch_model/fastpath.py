"""The compiled PASSING path of the model switch (fastpath*.c): built on first use, bound to a
Pipeline's registers, counters and tables; the switch's port loop runs in it a receive batch at
a time (receive, the PASSING path, send). The C units are compiled with the constants of
passing.protocol (K among them) by passing.cbuild (build/fastpath/ of a checkout), so an edited
source or another PASSING_K never runs a stale library. Where no C compiler is found the switch
keeps the Python pipeline for every frame (`load()` returns None and says why).

The PASSING path, the result guard and L2 forwarding are compiled. A frame whose VLAN tag the
kernel took off, one shorter than an Ethernet header or longer than FAST_MAX_FRAME, and every
frame while a table holds what the compiled path cannot take (fastpath_tables) comes back to
the caller for Pipeline.process, so the two paths interleave frame by frame on the same state.
"""

from __future__ import annotations

import ctypes
import logging
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

from passing import cbuild
from passing import protocol as P
from passing.protocol import Flag, GlobalDrop, JobDrop, JobEvent
from switch_model.fastpath_tables import (
    L2_FLOOD,
    L2_TO_PORT,
    MAX_COPIES,
    TableArrays,
    Unsupported,
    table_arrays,
)

log = logging.getLogger("switch_model.fastpath")

SOURCES = [Path(__file__).with_name(n) for n in  # the path, its Aggregation, the port loop
           ("fastpath.c", "fastpath_aggregate.c", "fastpath_forward.c", "fastpath_ports.c",
            "fastpath_fair.c", "fastpath.h")]
# "python" here makes the Python pipeline the model's default (switch_model/cli.py's --pipeline).
PATH_ENV = "PASSING_MODEL_PIPELINE"
# Frames longer than this (a PASSING frame with a long trailer) take the Python path.
FAST_MAX_FRAME = max(2048, -(-P.FRAME_BYTES // 1024) * 1024)
OUT_FRAMES = 4096
RX_BATCH = 64  # frames the port loop takes from one port per system call (switch_model.ports)
# The model's congestion mark (docs/protocol.md, "Congestion control"): the P4 program's
# enq_qdepth >= MARK_QDEPTH, read from the bytes the kernel holds of the model's frames on the
# port (SIOCOUTQ), where each frame counts with its buffer, about twice its length, and
# beyond one receive batch: the model sends a batch's copies to a port at once, a burst BMv2,
# one packet at a time, never makes, and which must not alone mark a job that fits its links.
MARK_BYTES = (P.MARK_QDEPTH + RX_BATCH) * 2 * P.FRAME_BYTES
# The fair-share mark's queue (enq_qdepth >= FAIR_QDEPTH) in the same bytes, without the batch:
# a lone job is never marked by it (it needs two active flows), so a batch's own burst is harmless.
FAIR_BYTES = P.FAIR_QDEPTH * 2 * P.FRAME_BYTES
OUT_BYTES = OUT_FRAMES * FAST_MAX_FRAME

# The layout of ctx, as fastpath.h's enum.
(C_JOBS, C_NJOBS, C_MEMBERS, C_NMEMBERS, C_PEERS, C_NPEERS, C_REPLICAS, C_NREPLICAS,
 C_CAPACITY, C_GEN, C_SESSION, C_ROUND, C_FLAGS, C_NSUM, C_EXP, C_COUNT, C_BITMAP, C_VALUES,
 C_GLOBAL, C_NGLOBAL, C_JOBSTATS, C_NJOBSTATS, C_POOLC, C_NPOOLC, C_LATE, C_NLATE,
 C_EGRESS, C_NEGRESS, C_OUT, C_OUTCAP, C_OUTPORT, C_OUTOFF, C_OUTLEN, C_MAXOUT, C_MAXCOPIES,
 C_RX, C_RXSLOT, C_RXBATCH, C_RXLEN, C_RXSKIP, C_RXCTRL, C_CTRLSPACE, C_RXNAME, C_PORTFD,
 C_NPORTFD, C_FILTER_OUT, C_VLAN, C_SCRATCH, C_L2, C_NL2, C_GUARDS, C_NGUARDS, C_L2DEF,
 C_L2DEFARG, C_FAIRP, C_FAIRF, C_LEN) = range(57)
IO_NOUT, IO_USED, IO_FULL, IO_K, IO_NEXT, IO_SLOW_END, IO_TX_ERRORS, IO_TRUNCATED = range(8)
SOCKADDR_LL_SIZE = 20
TP_STATUS_VLAN_VALID = 0x10
COUNTERS = ((C_GLOBAL, "global_drops"), (C_JOBSTATS, "job_stats"), (C_POOLC, "pool_contribs"),
            (C_LATE, "late_contribs"), (C_EGRESS, "egress_drops"))


def _defines() -> dict[str, int]:
    d = {"K": P.K, "HEADER_BYTES": P.HEADER_BYTES, "PASSING_PORT": P.PASSING_UDP_PORT,
         "FLAGS_KNOWN": P.FLAGS_MASK, "ROLE_ROOT": int(P.Role.ROOT),
         "JOB_STATS_STRIDE": P.JOB_STATS_STRIDE, "MAX_FAN_IN": P.MAX_FAN_IN,
         "FAST_MAX_FRAME": FAST_MAX_FRAME, "MAX_COPIES": MAX_COPIES, "OUT_FRAMES": OUT_FRAMES,
         "MARK_BYTES": MARK_BYTES, "L2_TO_PORT": L2_TO_PORT, "L2_FLOOD": L2_FLOOD,
         "FAIR_BYTES": FAIR_BYTES, "FAIR_INTERVAL_SHIFT": P.FAIR_INTERVAL_SHIFT,
         "FAIR_F_MIN": P.FAIR_F_MIN, "FAIR_F_MAX": P.FAIR_F_MAX,
         "FAIR_ACTIVE_DIV": P.FAIR_ACTIVE_DIV, "FAIR_PORTS": P.FAIR_PORTS,
         "FAIR_FLOWS": P.FAIR_FLOWS}
    d.update({f"TPID_{i}": tpid for i, tpid in enumerate(P.VLAN_TPIDS)})
    d.update({f"FLAG_{f.name}": int(f) for f in Flag})
    d.update({f"DROP_{e.name}": int(e) for e in JobDrop})
    d.update({f"EVT_{e.name}": int(e) for e in JobEvent})
    d.update({f"GDROP_{e.name}": int(e) for e in GlobalDrop})
    return d


def build() -> Path:
    """The compiled library for this source and these constants, built if not yet there."""
    return cbuild.build(SOURCES, "fastpath", _defines())


def _open(lib: Path) -> ctypes.CDLL:
    dll = ctypes.CDLL(str(lib))
    dll.fp_run.restype = ctypes.c_int64
    dll.fp_run.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_void_p,
                           ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int64, ctypes.c_int64,
                           ctypes.c_void_p]
    for fn in (dll.fp_drain, dll.fp_resume):
        fn.restype = ctypes.c_int64
    dll.fp_drain.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p]
    dll.fp_resume.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_void_p]
    dll.fp_scratch_bytes.restype = ctypes.c_uint64
    dll.fp_fair_step.restype = ctypes.c_int
    dll.fp_fair_step.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint32,
                                 ctypes.c_uint32, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int,
                                 ctypes.c_int]
    dll.fp_abi.restype = ctypes.c_int
    if dll.fp_abi() != C_LEN * 1000 + P.K:
        raise OSError(f"{lib.name}: not built for this layout (ctx of {C_LEN}, K={P.K})")
    return dll


def load(pipeline) -> FastPath | None:
    """The compiled path bound to `pipeline`, or None (logged) where no compiler could
    build it."""
    try:
        return FastPath(pipeline, _open(build()))
    except OSError as e:
        log.warning("the compiled PASSING path is unavailable, every frame takes the Python "
                    "pipeline (several times slower): %s", e)
        return None


class FastPath:
    """fastpath.c bound to one Pipeline. Call `run` under the pipeline's state lock."""

    def __init__(self, pipeline, dll: ctypes.CDLL):
        self.pipe, self.dll = pipeline, dll
        self.io = np.zeros(8, dtype=np.uint64)
        self.out = np.zeros(OUT_BYTES, dtype=np.uint8)
        self.out_port = np.zeros(OUT_FRAMES, dtype=np.uint32)
        self.out_off = np.zeros(OUT_FRAMES, dtype=np.uint32)
        self.out_len = np.zeros(OUT_FRAMES, dtype=np.uint32)
        self.ctx = np.zeros(C_LEN, dtype=np.uint64)
        slots = pipeline.slots
        ctx = self.ctx
        ctx[C_CAPACITY] = slots.capacity
        for i, a in zip(range(C_GEN, C_VALUES + 1), slots.arrays(), strict=True):
            ctx[i] = a.ctypes.data
        for i, name in COUNTERS:
            cells = pipeline.state.counters[name]
            ctx[i], ctx[i + 1] = cells.ctypes.data, len(cells)
        for i, a in ((C_OUT, self.out), (C_OUTPORT, self.out_port), (C_OUTOFF, self.out_off),
                     (C_OUTLEN, self.out_len)):
            ctx[i] = a.ctypes.data
        ctx[C_OUTCAP], ctx[C_MAXOUT] = OUT_BYTES, OUT_FRAMES
        fair = pipeline.fair
        ctx[C_FAIRP], ctx[C_FAIRF] = fair.ports.ctypes.data, fair.flows.ctypes.data
        self.scratch = np.zeros(dll.fp_scratch_bytes(), dtype=np.uint8)
        ctx[C_SCRATCH] = self.scratch.ctypes.data
        self._synced = -1
        self._tables: TableArrays | None = None
        self._ctx_addr, self._io_addr = ctx.ctypes.data, self.io.ctypes.data

    def _sync(self) -> None:
        """The tables and groups copied into arrays, if they changed since the last copy. A
        table holding an entry the compiled path does not know (another action) turns it off
        until the next change: every frame then takes the Python pipeline."""
        st = self.pipe.state
        if st.changes == self._synced:
            return
        self._synced = st.changes  # an unusable copy is not retried before the next change
        self.ctx[C_MAXCOPIES] = 0  # fastpath.c: every frame to the caller
        try:
            tables = table_arrays(st)
        except (Unsupported, OverflowError, ValueError, TypeError):
            return
        self._tables = tables  # kept alive: ctx holds their addresses
        for i, a in ((C_JOBS, tables.jobs), (C_MEMBERS, tables.members), (C_PEERS, tables.peers),
                     (C_REPLICAS, tables.replicas), (C_L2, tables.l2),
                     (C_GUARDS, tables.guards)):
            self.ctx[i], self.ctx[i + 1] = a.ctypes.data, len(a)
        self.ctx[C_L2DEF], self.ctx[C_L2DEFARG] = tables.l2_default
        self.ctx[C_MAXCOPIES] = tables.widest

    def run(self, buf: np.ndarray, lengths: np.ndarray, skip: np.ndarray, port: int,
            start: int, end: int) -> int:
        """Frames start..end-1 of a receive batch (row i of `buf`, lengths[i] bytes, uint32;
        skip[i] nonzero for one the caller takes) through the compiled path until the first
        that is not a PASSING-path frame or the output is full (`full()`); their copies are
        appended to the output (`frames()`). Returns the index of the first frame not taken."""
        self._sync()  # unusable tables: C_MAXCOPIES 0, and fp_run takes no frame
        return self.dll.fp_run(self._ctx_addr, buf.ctypes.data, buf.shape[1],
                               lengths.ctypes.data, skip.ctypes.data, port, start, end,
                               self._io_addr)

    # -- the switch's port loop (switch_model/ports.py) ---------------------------------------
    def attach(self, fds: dict[int, int], batch: int, slot: int, ctrl_space: int,
               filter_outgoing: bool) -> None:
        """Receive into batches of `batch` frames of up to `slot` bytes (with `ctrl_space`
        bytes of ancillary data each) and send to the packet sockets `fds` (port -> fd)."""
        self.rx = np.zeros((batch, slot), dtype=np.uint8)
        self.rx_len = np.zeros(batch, dtype=np.uint32)
        self.rx_skip = np.zeros(batch, dtype=np.uint8)
        self.rx_ctrl = np.zeros((batch, ctrl_space), dtype=np.uint8)
        self.rx_name = np.zeros((batch, SOCKADDR_LL_SIZE), dtype=np.uint8)
        self.vlan = np.zeros((batch, 3), dtype=np.uint32)
        self.port_fd = np.full(max(fds, default=0) + 1, -1, dtype=np.int64)
        for port, fd in fds.items():
            self.port_fd[port] = fd
        ctx = self.ctx
        for i, a in ((C_RX, self.rx), (C_RXLEN, self.rx_len), (C_RXSKIP, self.rx_skip),
                     (C_RXCTRL, self.rx_ctrl), (C_RXNAME, self.rx_name),
                     (C_PORTFD, self.port_fd), (C_VLAN, self.vlan)):
            ctx[i] = a.ctypes.data
        ctx[C_RXSLOT], ctx[C_RXBATCH], ctx[C_CTRLSPACE] = slot, batch, ctrl_space
        ctx[C_NPORTFD], ctx[C_FILTER_OUT] = len(self.port_fd), int(filter_outgoing)

    def drain(self, fd: int, port: int) -> int:
        """One receive batch of packet socket `fd` (switch port `port`) through the compiled
        path and out. 1: frames `slow()` are the caller's (Pipeline.process), after which it
        calls `resume`; 0: done; < 0: -errno of the receive."""
        self._sync()
        return self.dll.fp_drain(self._ctx_addr, fd, port, self._io_addr)

    def resume(self, port: int) -> int:
        """After the caller took the frames `slow()`: the rest of the batch, as `drain`."""
        self.io[IO_NEXT] = self.io[IO_SLOW_END]
        return self.dll.fp_resume(self._ctx_addr, port, self._io_addr)

    def slow(self) -> range:
        return range(int(self.io[IO_NEXT]), int(self.io[IO_SLOW_END]))

    def received(self, i: int) -> tuple[bytes, int, int, int] | None:
        """Frame i of the batch as received (None where it is dropped unseen), and its VLAN
        tag's (auxdata status, TPID, TCI) where the kernel took one off (status 0 if none)."""
        if self.rx_skip[i] == 1:
            return None
        status, tpid, tci = (int(x) for x in self.vlan[i])
        return self.rx[i, :int(self.rx_len[i])].tobytes(), status, tpid, tci

    def counts(self) -> tuple[int, int]:
        """(frames the kernel refused on send, frames dropped on receive as too long)."""
        return int(self.io[IO_TX_ERRORS]), int(self.io[IO_TRUNCATED])

    def full(self) -> bool:
        return bool(self.io[IO_FULL])

    def pending(self) -> int:
        return int(self.io[IO_NOUT])

    def frames(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(egress ports, offsets in `out`, lengths) of the copies made since `clear`."""
        n = int(self.io[IO_NOUT])
        return self.out_port[:n], self.out_off[:n], self.out_len[:n]

    def clear(self) -> None:
        self.io[IO_NOUT] = self.io[IO_USED] = 0


def interleave(pipeline, fast: FastPath | None, port: int, buf: np.ndarray, lengths: np.ndarray,
               skip: np.ndarray, frame_of: Callable[[int], bytes | None],
               take: Callable[[list[tuple[int, bytes]]], None],
               flush: Callable[[], None]) -> None:
    """A receive batch (frames 0..len(lengths)-1, arrived on `port`) through the pipeline in
    order: runs of PASSING-path frames through the compiled path, any other frame (its bytes
    from `frame_of`, None to drop it unseen) through Pipeline.process, whose copies go to
    `take`. `flush` must send what `take` got, then the compiled path's copies (`frames()`),
    and clear both: it is called before a frame goes to Python while compiled copies wait, when
    the compiled output is full, and at the end, so each egress port sends in arrival order."""
    n = len(lengths)
    i = 0
    with pipeline.state.lock:
        while i < n:
            if fast is not None:
                i = fast.run(buf, lengths, skip, port, i, n)
                if fast.full():
                    flush()
                    continue
                if i >= n:
                    break
                if fast.pending():
                    flush()
            frame = frame_of(i)
            i += 1
            if frame is not None:
                take(pipeline.process(port, frame))
    flush()


def main() -> int:
    """Build the library now (scripts/setup.sh), so that no switch pays for it at start."""
    try:
        print(f"fastpath: {build()}")
    except OSError as e:
        print(f"fastpath: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
