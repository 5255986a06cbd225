"""The training workloads' shapes, without torch or scikit-learn (the command line checks
names and sizes its waits before any rank starts): MLPs on scikit-learn's 8x8 digits."""

from __future__ import annotations

IN_FEATURES, CLASSES = 64, 10
# Hidden layer widths. digits-mlp (9,610 parameters, a 38 KB gradient) is latency-bound on
# every strategy; digits-wide (1,126,410 parameters, a 4.5 MB gradient) makes each step's
# all-reduce the bulk of the step, as in training large models.
MODELS: dict[str, tuple[int, ...]] = {"digits-mlp": (128,), "digits-wide": (1024, 1024)}
DEFAULT_MODEL = "digits-mlp"


def parameters(model: str) -> int:
    """How many parameters (gradient elements) the MLP `model` has."""
    widths = (IN_FEATURES, *MODELS[model], CLASSES)
    return sum((a + 1) * b for a, b in zip(widths, widths[1:], strict=False))


def train_budget_s(model: str, steps: int) -> float:
    """Seconds a caller waits for `steps` training steps before it calls a run hung:
    generous, and growing with the gradient (a 4.5 MB one through a parameter server on slow
    links takes seconds a step)."""
    return steps * (2.0 + 2e-5 * parameters(model))
