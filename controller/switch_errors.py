"""What a switch's P4Runtime server refused, as exceptions whose message says which switch and
why, and the failed updates of a Write (P4Runtime spec, section 12)."""

from __future__ import annotations

import grpc
from google.rpc import code_pb2, status_pb2
from p4.v1 import p4runtime_pb2

Update = p4runtime_pb2.Update


def write_failures(err: grpc.RpcError) -> list[tuple[int, str, str]]:
    """(update index, status code name, message) of each failed update of a Write, from the
    status details (P4Runtime spec, section 12)."""
    out = []
    for key, value in err.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            for i, detail in enumerate(status_pb2.Status.FromString(value).details):
                e = p4runtime_pb2.Error()
                if detail.Unpack(e) and e.canonical_code != code_pb2.OK:
                    out.append((i, code_pb2.Code.Name(e.canonical_code), e.message))
    return out


class SwitchError(RuntimeError):
    """A switch refused a request or could not be reached; the message says which and why."""


class WriteError(SwitchError):
    """A Write with failed updates; `failures` lists (index, code name, message) of each."""

    def __init__(self, message: str, failures: list[tuple[int, str, str]]):
        super().__init__(message)
        self.failures = failures

    @classmethod
    def of(cls, switch: str, updates: list[Update],
           failures: list[tuple[int, str, str]]) -> WriteError:
        what = "; ".join(f"update {i} ({updates[i].entity.WhichOneof('entity')}): "
                         f"{code}: {msg}" for i, code, msg in failures)
        return cls(f"switch {switch}: write failed: {what}", failures)
