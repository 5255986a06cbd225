"""The forwarding pipeline config of the P4Runtime service. The model runs one program, the
PASSING pipeline: a config for it is accepted (committing it clears the switch, as BMv2's
server does), one for any other program refused; what was pushed is answered back."""

from __future__ import annotations

import grpc
from p4.config.v1 import p4info_pb2
from p4.v1 import p4runtime_pb2

from passing.p4info import pipeline_signature
from switch_model.p4runtime_abort import Abort
from switch_model.pipeline import Pipeline

_SET = p4runtime_pb2.SetForwardingPipelineConfigRequest
_GET = p4runtime_pb2.GetForwardingPipelineConfigRequest
_VERIFIES = (_SET.VERIFY, _SET.VERIFY_AND_SAVE, _SET.VERIFY_AND_COMMIT, _SET.RECONCILE_AND_COMMIT)
_COMMITS = (_SET.VERIFY_AND_COMMIT, _SET.COMMIT, _SET.VERIFY_AND_SAVE, _SET.RECONCILE_AND_COMMIT)


class PipelineConfig:
    """Whether a config is loaded, and its cookie and device config."""

    def __init__(self, pipeline: Pipeline, p4info: p4info_pb2.P4Info, preloaded: bool):
        self.pipeline = pipeline
        self.p4info = p4info
        self.signature = pipeline_signature(p4info)
        self.loaded = preloaded
        self.cookie = 0
        self.device_config = b""

    def set(self, request: p4runtime_pb2.SetForwardingPipelineConfigRequest) -> None:
        """Verify and commit as `request.action` says; Abort (INVALID_ARGUMENT) for a P4Info
        of another program, before anything is committed."""
        if request.action in _VERIFIES and \
                pipeline_signature(request.config.p4info) != self.signature:
            raise Abort(grpc.StatusCode.INVALID_ARGUMENT,
                        "this switch model runs the PASSING pipeline only; the pushed P4Info "
                        "describes a different program")
        if request.action in _COMMITS:
            with self.pipeline.state.lock:
                # RECONCILE_AND_COMMIT keeps the forwarding state (P4Runtime specification).
                if request.action != _SET.RECONCILE_AND_COMMIT:
                    self.pipeline.reset()
                self.loaded = True
                self.cookie = request.config.cookie.cookie
                self.device_config = request.config.p4_device_config

    def get(self, response_type: int) -> p4runtime_pb2.GetForwardingPipelineConfigResponse:
        """The parts of the loaded config `response_type` asks for; nothing before one is."""
        rep = p4runtime_pb2.GetForwardingPipelineConfigResponse()
        if not self.loaded:
            return rep
        rep.config.cookie.cookie = self.cookie
        if response_type in (_GET.ALL, _GET.P4INFO_AND_COOKIE):
            rep.config.p4info.CopyFrom(self.p4info)
        if response_type in (_GET.ALL, _GET.DEVICE_CONFIG_AND_COOKIE):
            rep.config.p4_device_config = self.device_config
        return rep
