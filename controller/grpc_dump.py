"""A gRPC client interceptor that appends every P4Runtime message of one switch's channel to a
text file (p4lang tutorials' habit, for debugging): `SwitchConnection(..., dump_file=PATH)`."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import grpc
from p4.v1 import p4runtime_pb2


class MessageDump(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                  grpc.StreamStreamClientInterceptor):
    """Appends every message of a channel to a text file, as it is sent or received: requests,
    responses, errors and both directions of the stream (arbitration included), each under the
    switch's name and the RPC's."""

    def __init__(self, name: str, path: Path):
        self.name, self.path = name, path
        self._lock = threading.Lock()

    def _write(self, method: str, what: str, text: str) -> None:
        rpc = method.rsplit("/", 1)[-1]
        with self._lock, self.path.open("a") as f:
            f.write(f"[{time.strftime('%H:%M:%S')}] {self.name} {rpc} {what}\n{text}\n")

    def _message(self, method: str, msg) -> None:
        shown = msg
        config = getattr(msg, "config", None)
        if isinstance(config, p4runtime_pb2.ForwardingPipelineConfig) and \
                (config.p4info.tables or config.p4_device_config):
            # A whole P4Info and BMv2 JSON would bury the rest of the dump.
            shown = type(msg)()
            shown.CopyFrom(msg)
            shown.config.ClearField("p4info")
            shown.config.ClearField("p4_device_config")
            shown = (f"{shown}(config: P4Info with {len(config.p4info.tables)} tables, "
                     f"{len(config.p4_device_config)} bytes of device config)")
        self._write(method, type(msg).__name__, str(shown))

    def _error(self, method: str, err: grpc.RpcError) -> None:
        self._write(method, "error", f"{err.code().name}: {err.details()}")

    def _stream(self, method: str, messages: Iterable) -> Iterator:
        try:
            for msg in messages:
                self._message(method, msg)
                yield msg
        except grpc.RpcError as e:
            self._error(method, e)
            raise

    def intercept_unary_unary(self, continuation: Callable, details, request):
        self._message(details.method, request)
        outcome = continuation(details, request)
        err = outcome.exception()
        if err is None:
            self._message(details.method, outcome.result())
        elif isinstance(err, grpc.RpcError):
            self._error(details.method, err)
        return outcome

    def intercept_unary_stream(self, continuation: Callable, details, request):
        self._message(details.method, request)
        return self._stream(details.method, continuation(details, request))

    def intercept_stream_stream(self, continuation: Callable, details, request_iterator):
        requests = self._stream(details.method, request_iterator)
        return self._stream(details.method, continuation(details, requests))
