"""The controller's errors (re-exported by controller.core and controller.store, where callers
import them from)."""


class ControllerError(RuntimeError):
    """An operation that could not be done; the message is meant for the operator."""


class SwitchFailure(ControllerError):
    """A switch could not be reached or refused what it was told."""


class SwitchUnreachable(SwitchFailure):
    """No P4Runtime session with a switch, after the retries."""


class StoreError(Exception):
    """The store refused an operation, or the file is not a job store it can read."""
