"""Many datagrams per system call: Linux's sendmmsg(2) and recvmmsg(2) through ctypes.

Python's socket module sends and receives one datagram per call, and at ~300 bytes a datagram
the system call and the interpreter around it cost more than the data. Here a batch of
datagrams of one size is described once, as numpy arrays of `struct mmsghdr` and `struct iovec`
pointing into one contiguous buffer, and handed to the kernel in one call. The switch model's
packet sockets use the same calls for Ethernet frames of any length (`send_frames`, and a
`Receiver` with room for each frame's ancillary data).

Linux x86-64 and aarch64 layouts (LP64): iovec {void *base; size_t len} = 16 bytes;
msghdr {void *name; socklen_t namelen; struct iovec *iov; size_t iovlen; void *control;
size_t controllen; int flags} = 56 bytes; mmsghdr {msghdr hdr; unsigned int len} = 64 bytes.
`available()` is False elsewhere, and callers fall back to one call per datagram.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import functools
import os
import platform
import socket
import sys
from collections.abc import Sequence

import numpy as np

IOVEC = np.dtype([("base", "<u8"), ("len", "<u8")])
MMSGHDR = np.dtype({"names": ["name", "namelen", "iov", "iovlen", "control", "controllen",
                              "flags", "len"],
                    "formats": ["<u8", "<u4", "<u8", "<u8", "<u8", "<u8", "<i4", "<u4"],
                    "offsets": [0, 8, 16, 24, 32, 40, 48, 56], "itemsize": 64})
MSG_DONTWAIT = 0x40
MSG_TRUNC = 0x20
SOL_UDP, UDP_SEGMENT = 17, 103  # <netinet/udp.h>: a message's datagram size for GSO
_MAX_UDP_PAYLOAD = 65507  # 65535 less the IPv4 and UDP headers
_MAX_UDP_SEGMENTS = 64  # the kernel's UDP_MAX_SEGMENTS before 6.x raised it to 128
_CMSG_HDR = 16  # sizeof(struct cmsghdr) on LP64: size_t len, int level, int type

_libc = None


def available() -> bool:
    """True on 64-bit Linux with a libc that has both calls."""
    global _libc
    if _libc is None:
        ok = (sys.platform.startswith("linux") and ctypes.sizeof(ctypes.c_void_p) == 8
              and platform.machine() in ("x86_64", "aarch64"))
        lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True) \
            if ok else None
        ok = ok and hasattr(lib, "sendmmsg") and hasattr(lib, "recvmmsg")
        if ok:
            for fn in (lib.sendmmsg, lib.recvmmsg):
                fn.restype = ctypes.c_int
            lib.sendmmsg.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int]
            lib.recvmmsg.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int,
                                     ctypes.c_void_p]
        _libc = lib if ok else False
    return bool(_libc)


def _require() -> None:
    if not available():
        raise OSError("sendmmsg/recvmmsg: not available on this platform (mmsg.available())")


def _headers_at(base: int, offsets: np.ndarray, lengths: np.ndarray | int
                ) -> tuple[np.ndarray, np.ndarray]:
    """mmsghdr and iovec arrays, one message per offset: `lengths` bytes at base + offset."""
    n = len(offsets)
    iov = np.zeros(n, dtype=IOVEC)
    iov["base"] = base + offsets
    iov["len"] = lengths
    hdr = np.zeros(n, dtype=MMSGHDR)
    hdr["iov"] = iov.ctypes.data + np.arange(n, dtype=np.uint64) * np.uint64(IOVEC.itemsize)
    hdr["iovlen"] = 1
    return hdr, iov


def _headers(buf: np.ndarray, n: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    """mmsghdr and iovec arrays for n datagrams of `size` bytes laid end to end in buf."""
    return _headers_at(buf.ctypes.data, np.arange(n, dtype=np.uint64) * np.uint64(size), size)


def send_rows(sock: socket.socket, rows: np.ndarray, segments: int = 1) -> tuple[int, int]:
    """Send each row of the C-contiguous uint8 array `rows` as one datagram on the connected
    UDP socket `sock`. With `segments` > 1, up to that many consecutive rows go as one message
    that the kernel cuts into one datagram per row (UDP_SEGMENT, generic segmentation): the
    same datagrams on the wire, one pass through the socket, IP and queueing layers per
    message instead of per row. A message never holds more than one UDP datagram can
    (`per_message`). Returns (rows sent, errno of the call that stopped short, 0 if none);
    after an error the rows of the message that failed are the next
    min(per_message(segments, row bytes), rest): a caller decides what an error means (the
    transport counts them lost)."""
    _require()
    rows = np.ascontiguousarray(rows, dtype=np.uint8)
    n, size = rows.shape
    segments = per_message(segments, size)
    if segments <= 1 or n <= 1:
        hdr, iov = _headers(rows, n, size)
        return _send_all(sock, hdr, n, (rows, iov))
    starts = np.arange(0, n, segments, dtype=np.uint64)
    lengths = np.minimum(np.uint64(segments), np.uint64(n) - starts) * np.uint64(size)
    hdr, iov = _headers_at(rows.ctypes.data, starts * np.uint64(size), lengths)
    control = _segment_control(size)
    hdr["control"] = control.ctypes.data
    hdr["controllen"] = control.size
    sent, err = _send_all(sock, hdr, len(starts), (rows, iov, control))
    return min(sent * segments, n), err


def per_message(segments: int, size: int) -> int:
    """Rows of `size` bytes that one segmented message carries: `segments`, fewer where they
    would not fit in one UDP datagram (the kernel refuses the message, EMSGSIZE) or exceed
    the kernel's 64 segments; one where rows are empty."""
    if size <= 0:
        return 1
    return max(1, min(segments, _MAX_UDP_SEGMENTS, _MAX_UDP_PAYLOAD // size))


@functools.lru_cache(maxsize=8)
def _segment_control(size: int) -> np.ndarray:
    """One cmsghdr {size_t len; int level; int type} carrying UDP_SEGMENT = `size` (a u16),
    padded to CMSG_SPACE: the same buffer serves every message of every call with rows of
    that size (made once, not on every send; the kernel only reads it)."""
    buf = np.zeros(_CMSG_HDR + 8, dtype=np.uint8)
    buf[:8] = np.frombuffer(np.uint64(_CMSG_HDR + 2).tobytes(), dtype=np.uint8)
    buf[8:12] = np.frombuffer(np.int32(SOL_UDP).tobytes(), dtype=np.uint8)
    buf[12:16] = np.frombuffer(np.int32(UDP_SEGMENT).tobytes(), dtype=np.uint8)
    buf[16:18] = np.frombuffer(np.uint16(size).tobytes(), dtype=np.uint8)
    buf.flags.writeable = False  # shared by every caller (the cache)
    return buf


def send_frames(sock: socket.socket, frames: Sequence[bytes]) -> tuple[int, int]:
    """Send each of `frames`, of any lengths, as one datagram (or, on a bound packet socket,
    one Ethernet frame) in as few system calls as the kernel takes. Returns what send_rows
    returns."""
    _require()
    n = len(frames)
    if not n:
        return 0, 0
    joined = b"".join(frames)
    lengths = np.fromiter(map(len, frames), dtype=np.uint64, count=n)
    offsets = np.zeros(n, dtype=np.uint64)
    np.cumsum(lengths[:-1], out=offsets[1:])
    data = np.frombuffer(joined, dtype=np.uint8)  # read only: the kernel only reads it
    hdr, iov = _headers_at(data.ctypes.data, offsets, lengths)
    return _send_all(sock, hdr, n, (joined, data, iov))


def _send_all(sock: socket.socket, hdr: np.ndarray, n: int, keep: tuple) -> tuple[int, int]:
    """sendmmsg until all n are sent or a call fails; `keep` holds the memory the headers
    point into until the kernel has read it."""
    sent = 0
    while sent < n:
        k = _libc.sendmmsg(sock.fileno(), hdr.ctypes.data + sent * MMSGHDR.itemsize,
                           n - sent, 0)
        if k < 0:
            return sent, ctypes.get_errno()
        sent += k
    del keep
    return sent, 0


class Receiver:
    """recvmmsg into a preallocated buffer of `batch` slots of `slot` bytes each; with
    `control` > 0 each slot also gets that many bytes of ancillary data (`ctrl`, the length
    the kernel filled in `ctrl_len`), with `name` > 0 a source address buffer (`names`)."""

    def __init__(self, batch: int = 256, slot: int = 2048, control: int = 0, name: int = 0):
        _require()
        self.batch, self.slot, self.control, self.name = batch, slot, control, name
        self.buf = np.zeros((batch, slot), dtype=np.uint8)
        self.hdr, self._iov = _headers(self.buf, batch, slot)
        self.ctrl = np.zeros((batch, max(control, 1)), dtype=np.uint8)
        self.names = np.zeros((batch, max(name, 1)), dtype=np.uint8)
        rows = np.arange(batch, dtype=np.uint64)
        if control:
            self.hdr["control"] = self.ctrl.ctypes.data + rows * np.uint64(self.ctrl.shape[1])
        if name:
            self.hdr["name"] = self.names.ctypes.data + rows * np.uint64(self.names.shape[1])

    def ctrl_len(self, k: int) -> np.ndarray:
        """Bytes of ancillary data the kernel wrote for each of the last call's k messages."""
        return self.hdr["controllen"][:k]

    def receive(self, sock: socket.socket) -> tuple[np.ndarray, np.ndarray]:
        """What is waiting on `sock`, without blocking: (buffer rows, their lengths). Datagrams
        longer than a slot come back with the length the kernel reports and the flag
        MSG_TRUNC; a caller that only takes datagrams of one exact size never takes them."""
        # The kernel writes back how much control data and address each message had.
        if self.control:
            self.hdr["controllen"] = self.control
        if self.name:
            self.hdr["namelen"] = self.name
        k = _libc.recvmmsg(sock.fileno(), self.hdr.ctypes.data, self.batch, MSG_DONTWAIT, None)
        if k < 0:
            err = ctypes.get_errno()
            if err in (errno.EAGAIN, errno.EWOULDBLOCK):
                return self.buf[:0], np.zeros(0, dtype=np.uint32)
            raise OSError(err, os.strerror(err))
        lengths = self.hdr["len"][:k].copy()
        lengths[(self.hdr["flags"][:k] & MSG_TRUNC) != 0] = 0xFFFFFFFF
        return self.buf[:k], lengths
