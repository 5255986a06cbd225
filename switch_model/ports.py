"""Raw-socket ports: frames in from each interface, through the pipeline, out of the egress
interfaces. One thread, epoll over all ports; each ready socket is drained in batches, with
recvmmsg and one sendmmsg per egress port per batch where the platform has them
(passing.mmsg), so the system calls and the interpreter around them are paid per batch, not
per frame."""

from __future__ import annotations

import fcntl
import logging
import os
import select
import socket
import struct
import threading
from collections.abc import Iterable, Iterator

import numpy as np

from passing import mmsg
from switch_model import fastpath
from switch_model.fair_share import epoch_now, fair_flow
from switch_model.frame import congested, is_passing_copy, with_mark
from switch_model.pipeline import Pipeline

log = logging.getLogger("switch_model.ports")
ETH_P_ALL = 0x0003
SOL_PACKET = 263
PACKET_AUXDATA = 8
PACKET_IGNORE_OUTGOING = 23
PACKET_OUTGOING = 4
BATCH = fastpath.RX_BATCH
# The largest frame a packet socket hands over: a veth passes TCP's 64 KiB segmentation
# super-frames through whole where the sender leaves segmentation to the device (the Mininet
# hosts do not, but other senders may), so a buffer must hold one.
MAX_FRAME = 65536 + 64
# struct tpacket_auxdata: the kernel strips a VLAN tag off the frame into here (BMv2's libpcap
# puts it back; so must the model, or a tagged frame would look untagged to its pipeline).
_AUXDATA = struct.Struct("=IIIHHHH")
_AUX_SPACE = socket.CMSG_SPACE(_AUXDATA.size)
TP_STATUS_VLAN_VALID = 0x10
TP_STATUS_VLAN_TPID_VALID = 0x40
# LP64 struct cmsghdr {size_t len; int level; int type;} then the auxdata; sockaddr_ll's
# sll_pkttype is its byte 10.
_CMSG_DATA = 16
_SLL_SIZE, _SLL_PKTTYPE = 20, 10
SIOCOUTQ = 0x5411
_INT = struct.Struct("i")


def queued_bytes(sock: socket.socket) -> int:
    """What this switch queued on `sock`'s port and the kernel still holds (SIOCOUTQ: frames
    in the link's qdisc, each with its buffer): the model's enq_qdepth, in bytes
    (fastpath.MARK_BYTES and FAIR_BYTES say how it compares)."""
    try:
        return _INT.unpack(fcntl.ioctl(sock.fileno(), SIOCOUTQ, b"\0" * _INT.size))[0]
    except OSError:
        return 0


def with_vlan_tag(frame: bytes, ancillary: list[tuple[int, int, bytes]]) -> bytes:
    """The frame as it was on the wire: its VLAN tag, if the kernel stripped one, put back."""
    for level, kind, data in ancillary:
        if level == SOL_PACKET and kind == PACKET_AUXDATA and len(data) >= _AUXDATA.size:
            status, _, _, _, _, tci, tpid = _AUXDATA.unpack_from(data)
            if status & TP_STATUS_VLAN_VALID:
                return _tagged(frame, status, tpid, tci)
    return frame


def _tagged(frame: bytes, status: int, tpid: int, tci: int) -> bytes:
    tpid = tpid if status & TP_STATUS_VLAN_TPID_VALID else 0x8100
    return frame[:12] + struct.pack("!HH", tpid, tci) + frame[12:]


def _slow_frames(fast: fastpath.FastPath) -> Iterator[bytes]:
    """The run of frames the compiled path handed back (FastPath.slow), as they were on the
    wire (a VLAN tag the kernel stripped put back); those it drops unseen left out."""
    for i in fast.slow():
        got = fast.received(i)
        if got is None:
            continue
        frame, status, tpid, tci = got
        yield _tagged(frame, status, tpid, tci) if status & TP_STATUS_VLAN_VALID else frame


def vlan_of_batch(ctrl: np.ndarray, ctrl_len: np.ndarray) -> tuple[np.ndarray, np.ndarray,
                                                                   np.ndarray]:
    """For each frame of a recvmmsg batch, from its ancillary data (one row of `ctrl`, the
    kernel's length in `ctrl_len`): (auxdata status, VLAN TPID, VLAN TCI); a status without
    TP_STATUS_VLAN_VALID where the frame had no tag or no auxdata came."""
    n = len(ctrl_len)
    have = ctrl_len >= _CMSG_DATA + _AUXDATA.size
    level = ctrl[:n, 8:12].copy().view("<i4").ravel()
    kind = ctrl[:n, 12:16].copy().view("<i4").ravel()
    have &= (level == SOL_PACKET) & (kind == PACKET_AUXDATA)
    aux = _CMSG_DATA
    status = np.where(have, ctrl[:n, aux:aux + 4].copy().view("<u4").ravel(), 0)
    tci = ctrl[:n, aux + 16:aux + 18].copy().view("<u2").ravel()
    tpid = ctrl[:n, aux + 18:aux + 20].copy().view("<u2").ravel()
    return status, tpid, tci


class Ports:
    def __init__(self, interfaces: dict[int, str]):
        self.socks: dict[int, socket.socket] = {}
        self.filter_outgoing = False
        try:
            for port, ifname in interfaces.items():
                s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
                try:
                    # The switch's own transmissions must not come back in as input.
                    s.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
                except OSError:
                    self.filter_outgoing = True
                s.setsockopt(SOL_PACKET, PACKET_AUXDATA, 1)
                s.bind((ifname, 0))
                s.setblocking(False)
                self.socks[port] = s
        except OSError:
            self.close()
            raise
        self.tx_errors = 0
        self.rx_truncated = 0
        self._pipeline: Pipeline | None = None  # whose egress counters send() keeps (run())
        self._batched = mmsg.available()
        if self._batched:
            self._rx = mmsg.Receiver(BATCH, MAX_FRAME, control=_AUX_SPACE, name=_SLL_SIZE)
            self._rx_mem = memoryview(self._rx.buf.reshape(-1))

    def send(self, port: int, frames: list[bytes]) -> None:
        """`frames` out of `port`, in order; a frame the kernel refuses is counted in
        tx_errors and the rest still go."""
        sock = self.socks.get(port)
        if sock is None:
            return  # no such port: dropped, as BMv2 drops packets to absent ports
        frames = self._marked(port, queued_bytes(sock), frames)
        if not self._batched or len(frames) == 1:
            for frame in frames:
                try:
                    sock.send(frame)
                except OSError:
                    self.tx_errors += 1
            return
        i = 0
        while i < len(frames):
            sent, err = mmsg.send_frames(sock, frames[i:] if i else frames)
            i += sent
            if err:
                self.tx_errors += 1  # this frame is lost (ENOBUFS, a link gone down)
                i += 1

    def _marked(self, port: int, queued: int, frames: list[bytes]) -> list[bytes]:
        """PassingEgress's marks on a batch for `port`, its queue `queued` bytes deep: every
        PASSING copy from a queue MARK_BYTES deep, and those FairShare marks (counting every
        frame) from one FAIR_BYTES deep."""
        pipeline = self._pipeline
        fair = getattr(pipeline, "fair", None)  # (a test's own pipeline may count nothing)
        if fair is None:
            return [congested(f) for f in frames] if queued >= fastpath.MARK_BYTES else frames
        deep = queued >= fastpath.MARK_BYTES
        fair_deep = queued >= fastpath.FAIR_BYTES
        epoch, out = epoch_now(), []
        for f in frames:
            passing = is_passing_copy(f)
            over = fair.step(port, fair_flow(pipeline.state, f, passing), len(f), epoch,
                             fair_deep, passing)
            out.append(with_mark(f) if passing and (deep or over) else f)
        return out

    def _frames(self, sock: socket.socket) -> Iterator[bytes]:
        """The frames waiting on `sock`, as they were on the wire, at most BATCH of them."""
        if not self._batched:
            for _ in range(BATCH):
                try:
                    frame, anc, _, addr = sock.recvmsg(65535, _AUX_SPACE)
                except BlockingIOError:
                    return
                if self.filter_outgoing and addr[2] == PACKET_OUTGOING:
                    continue
                yield with_vlan_tag(frame, anc) if anc else frame
            return
        rx = self._rx
        buf, lengths = rx.receive(sock)
        k = len(lengths)
        if not k:
            return
        status, tpid, tci = vlan_of_batch(rx.ctrl, rx.ctrl_len(k))
        tagged = ((status & TP_STATUS_VLAN_VALID) != 0).tolist()
        skip = lengths > rx.slot  # longer than any frame a link carries: never cut to size
        self.rx_truncated += int(skip.sum())
        if self.filter_outgoing:
            skip |= rx.names[:k, _SLL_PKTTYPE] == PACKET_OUTGOING
        skip = skip.tolist()
        mem, slot = self._rx_mem, rx.slot
        for i, n in enumerate(lengths.tolist()):
            if skip[i]:
                continue
            frame = mem[i * slot:i * slot + n].tobytes()
            yield _tagged(frame, int(status[i]), int(tpid[i]), int(tci[i])) \
                if tagged[i] else frame

    def _process_and_send(self, process, port: int, frames: Iterable[bytes]) -> None:
        """`frames` (arrived on `port`) through `process`; the output goes out per egress port
        in one call, in the order the pipeline made it."""
        out: dict[int, list[bytes]] = {}
        for frame in frames:
            for egress, packet in process(port, frame):
                q = out.get(egress)
                if q is None:
                    out[egress] = [packet]
                else:
                    q.append(packet)
        for egress, packets in out.items():
            self.send(egress, packets)

    def _run_compiled(self, pipeline: Pipeline, ep: select.epoll, stop: threading.Event
                      ) -> None:
        """The port loop with receive, the PASSING path and send in C (fastpath.c), one call
        per receive batch; runs of other frames (and tagged ones) come back here for
        Pipeline.process, between the compiled path's frames, in arrival order."""
        fast = pipeline.fast
        fast.attach({p: s.fileno() for p, s in self.socks.items()}, BATCH, MAX_FRAME,
                    _AUX_SPACE, self.filter_outgoing)
        by_fd = {s.fileno(): port for port, s in self.socks.items()}
        try:
            while not stop.is_set():
                for fd, _ in ep.poll(0.2):
                    port = by_fd[fd]
                    with pipeline.state.lock:
                        r = fast.drain(fd, port)
                        while r == 1:
                            self._process_and_send(pipeline.process, port, _slow_frames(fast))
                            r = fast.resume(port)
                    if r < 0:
                        raise OSError(-r, os.strerror(-r))
        finally:
            tx_errors, truncated = fast.counts()
            self.tx_errors += tx_errors
            self.rx_truncated += truncated

    def run(self, pipeline: Pipeline, stop: threading.Event) -> None:
        self._pipeline = pipeline
        ep = select.epoll()
        by_fd = {s.fileno(): (port, s) for port, s in self.socks.items()}
        for fd in by_fd:
            ep.register(fd, select.EPOLLIN)
        process = pipeline.process
        try:
            # (A pipeline without a compiled path, e.g. a test's or a benchmark's own, has no
            # `fast` at all.)
            if self._batched and getattr(pipeline, "fast", None) is not None:
                self._run_compiled(pipeline, ep, stop)
                return
            while not stop.is_set():
                for fd, _ in ep.poll(0.2):
                    port, sock = by_fd[fd]
                    self._process_and_send(process, port, self._frames(sock))
        finally:
            ep.close()

    def close(self) -> None:
        for s in self.socks.values():
            s.close()
        self.socks.clear()
