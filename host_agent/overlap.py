"""The `passing` backend's all-reduces in the background: `all_reduce(..., async_op=True)`, and
DDP's gradient buckets, return at once, and the sum runs on a thread of the process's own,
so that backward computes the next layers while a bucket streams (docs/pytorch.md, "In the
background").

One thread per process group runs the calls one at a time, in the order they were made. Every
local rank of a host makes its calls in the same order (DDP's buckets, a training loop's
all-reduces), so the in-host stage's collectives, which the thread issues, meet in the same
order on every rank, and every host streams its calls through the switch in that order: the
call boundaries at which pool moves and policy changes apply are the same as without overlap.
A call's error is raised where its Work is waited on (or its future read), on every rank,
as the call itself raises it on every rank.

`PASSING_OVERLAP=0` runs every call in the caller's thread instead, before the Work is
returned (the backend's behaviour before overlap).
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable, Mapping

import torch
import torch.distributed as dist

OVERLAP_ENV = "PASSING_OVERLAP"


def overlap_enabled(env: Mapping[str, str] = os.environ) -> bool:
    """Whether all-reduces run in the background (PASSING_OVERLAP, default 1)."""
    text = env.get(OVERLAP_ENV, "1").strip()
    if text not in ("0", "1"):
        raise ValueError(f"{OVERLAP_ENV}={text!r}: 1 (all-reduces in the background, the "
                         "default) or 0 (in the caller's thread)")
    return text == "1"


def done(tensors: list[torch.Tensor]) -> dist.Work:
    """A Work already complete, with `tensors` as its result."""
    fut: torch.futures.Future[list[torch.Tensor]] = torch.futures.Future()
    fut.set_result(tensors)
    return torch._C._distributed_c10d._create_work_from_future(fut)


def cuda_ready(tensors: list[torch.Tensor]) -> torch.cuda.Event | None:
    """For CUDA tensors, an event on the caller's current stream: the background thread waits
    for it, so that it sums what the kernels queued before the call (a gradient bucket's
    backward) have written."""
    if not any(t.device.type == "cuda" for t in tensors):
        return None
    event = torch.cuda.Event()
    event.record()
    return event


class BackgroundWork(dist.Work):
    """A call the CallQueue runs: `wait()` returns once it has run and raises its own error
    (an AllreduceError stays one); `get_future()`, what DDP reads, completes with the tensors,
    or fails with a C++ error naming the call's (torch.futures.Future.set_exception only stores
    a Python object as the value, which DDP then reads as tensors: a crash)."""

    def __init__(self, tensors: list[torch.Tensor]):
        super().__init__()
        self.tensors = tensors
        self.error: BaseException | None = None
        self._ran = threading.Event()
        self._parent: torch.futures.Future = torch.futures.Future()
        self._future = self._parent.then(self._unwrap)

    def _unwrap(self, _: torch.futures.Future) -> list[torch.Tensor]:
        if self.error is not None:
            raise self.error  # becomes the future's error, in C++
        return self.tensors

    def finish(self, error: BaseException | None) -> None:
        self.error = error
        self._parent.set_result(self.tensors)
        self._ran.set()

    def wait(self, timeout=None) -> bool:
        self._ran.wait()
        if self.error is not None:
            raise self.error
        return True

    def is_completed(self) -> bool:
        return self._ran.is_set()

    def is_success(self) -> bool:
        return self._ran.is_set() and self.error is None

    def exception(self):
        return self.error

    def get_future(self) -> torch.futures.Future:
        return self._future


class CallQueue:
    """Runs submitted calls one at a time, in order, on a thread of its own (started with the
    first call), or at once in the caller's thread when `background` is False."""

    def __init__(self, name: str, background: bool = True):
        self.name = name
        self.background = background
        self._calls: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._closed = False

    def submit(self, call: Callable[[], None], tensors: list[torch.Tensor]) -> dist.Work:
        """A Work that completes, with `tensors` as its result, when `call()` has run after
        every call submitted before it; its error, if it raises, is the Work's."""
        if not self.background:
            call()
            return done(tensors)
        work = BackgroundWork(tensors)
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self.name}: closed (its process group was destroyed)")
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
            self._calls.put((call, work))
        return work

    def _run(self) -> None:
        while True:
            item = self._calls.get()
            try:
                if item is None:
                    return
                call, work = item
                try:
                    call()
                except Exception as e:  # noqa: BLE001 - the caller's wait() raises it
                    work.finish(e)
                else:
                    work.finish(None)
            finally:
                self._calls.task_done()

    def drain(self) -> None:
        """Until every call submitted so far has run (a collective that must come after
        them on every rank: a barrier, the straggler count)."""
        if self._thread is not None:
            self._calls.join()

    def close(self) -> None:
        """Run what was submitted, then stop the thread; later submissions are refused."""
        with self._lock:
            self._closed = True
            thread = self._thread
        if thread is not None:
            self._calls.put(None)
            thread.join()
