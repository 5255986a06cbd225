"""The refusal the P4Runtime service's parts raise and its servicer answers an RPC with."""

from __future__ import annotations

import grpc


class Abort(Exception):
    """A request refused with `code`: the servicer aborts its RPC with it; a Write lists it
    as the failure of the one update that raised it."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code = code
