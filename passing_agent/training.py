"""The data-parallel training workloads for comparing all-reduce strategies.

Every rank trains the same MLP (passing_agent.workloads: a small one, and a wide one of 1.1M
parameters) on the scikit-learn digits (shipped with the package, so nothing is downloaded and
the run is the same on every machine). The all-reduce is a plain callable, so the same loop
runs with torch.distributed, the PASSING agent, or an identity for one process, and the
results (accuracy, final weights) say whether a strategy aggregated correctly, not only how fast.

Data parallelism here is exact: step `s` uses global batch `s`, rank `r` takes the `r`-th
contiguous shard of it, and each rank's loss is the mean over its shard. The summed gradients
divided by the world size are then the mean gradient over the whole global batch, so a run with
`world` ranks ends where a single process on the same global batches ends, up to float rounding.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn

from passing_agent.workloads import CLASSES, DEFAULT_MODEL, IN_FEATURES, MODELS

Allreduce = Callable[[torch.Tensor], torch.Tensor]

TEST_FRACTION = 0.25


def load_digits_split(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """X_train, y_train, X_test, y_test of the 1797 8x8 digits.

    Pixels are 0..16; dividing by 16 puts them in [0, 1] so the default init and lr=0.1 train
    without a scaler fitted on the data. The split is stratified so a 25% test set keeps every
    class, and seeded so every rank (and every strategy) sees the same one.
    """
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=TEST_FRACTION, stratify=y, random_state=seed)
    return x_train, y_train, x_test, y_test


def make_model(seed: int, model: str = DEFAULT_MODEL) -> nn.Module:
    """The MLP `model` (a key of MODELS: 64 -> hidden layers -> 10) whose weights depend on
    `seed` alone.

    Ranks build their copy independently instead of broadcasting one, so the init must not depend
    on what the process drew from torch's global RNG before; the global RNG is forked around the
    construction so callers' own random streams are left where they were.
    """
    if model not in MODELS:
        raise ValueError(f"no model {model!r}: one of {', '.join(MODELS)}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        layers: list[nn.Module] = []
        width = IN_FEATURES
        for hidden in MODELS[model]:
            layers += [nn.Linear(width, hidden), nn.ReLU()]
            width = hidden
        return nn.Sequential(*layers, nn.Linear(width, CLASSES))


def model_and_buffer(seed: int, name: str = DEFAULT_MODEL
                     ) -> tuple[nn.Module, list[nn.Parameter], int, torch.Tensor]:
    """make_model(seed, name), its parameters (each with a zeroed .grad), how many gradient
    elements they have, and the one buffer a step's all-reduce sums: those gradients, then
    the loss."""
    model = make_model(seed, name)
    params = list(model.parameters())
    for p in params:
        p.grad = torch.zeros_like(p)
    n_grad = sum(p.numel() for p in params)
    return model, params, n_grad, torch.empty(n_grad + 1, dtype=torch.float32)


def set_flat_grads(model: nn.Module, flat: torch.Tensor) -> None:
    """Copy `flat` (every parameter's gradient in `model.parameters()` order) back into each
    parameter's `.grad`."""
    offset = 0
    for p in model.parameters():
        n = p.numel()
        p.grad.copy_(flat[offset:offset + n].view_as(p.grad))
        offset += n
    if offset != flat.numel():
        raise ValueError(f"flat gradient has {flat.numel()} elements, the model {offset}")


def batch_indices(n_train: int, steps: int, global_batch: int, seed: int) -> np.ndarray:
    """(steps, global_batch) indices into the training set.

    A fresh seeded permutation per epoch, epochs laid end to end so a batch may straddle two;
    computed up front so that no rank's timing includes it and all ranks agree on every batch.
    """
    rng = np.random.default_rng(seed)
    need = steps * global_batch
    epochs = -(-need // n_train)
    stream = np.concatenate([rng.permutation(n_train) for _ in range(epochs)])
    return stream[:need].reshape(steps, global_batch)


def train(allreduce: Allreduce, rank: int, world: int, steps: int,
          seed: int = 0, global_batch: int = 64, lr: float = 0.1, model: str = DEFAULT_MODEL,
          eval_every: int = 0, ready: Callable[[], None] | None = None) -> dict:
    """Train on this rank's shards for `steps` SGD steps, aggregating gradients with `allreduce`.

    `allreduce(t)` must sum `t` over all ranks (in place is fine) and return the sum; it is called
    exactly once per step. The tensor it gets holds the flattened gradients followed by ONE extra
    element, this rank's shard loss: after the sum and the division by `world` that element is
    the mean loss over the global batch (shards are equal), so `final_loss` is the same on every
    rank and equal to a single-process run's, without a second collective per step. A strategy
    therefore sees `parameter count + 1` float32 elements.

    `seed` fixes the train/test split, the model init and the batch order, so runs that differ
    only in the strategy (or in `world`) are directly comparable; `param_checksum` (sum of |w|
    over the final weights) is the cheap way to compare them.

    `model` names the MLP (MODELS). With `eval_every` > 0 the test accuracy is also measured
    before the first step, every `eval_every` steps and after the last, the clock stopped.
    `ready`, if given, is called once just before the clock starts (after the data and the
    model are loaded): a meeting of every rank, so that the time does not hold the wait for
    the rank that finished loading last, which differs from run to run by hundreds of ms.

    Returns steps, seconds (the step loop only, evaluation excluded), iters_per_s, final_loss
    (global-batch mean loss of the last step, before its update), accuracy (on the test set after
    training, in [0, 1]), param_checksum, allreduce_numel, model and curve: [training seconds,
    step, accuracy] of each evaluation (empty without eval_every).
    """
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"rank {rank} is not in a world of {world}")
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    if eval_every < 0:
        raise ValueError(f"eval_every must be at least 0, got {eval_every}")
    if global_batch < 1 or global_batch % world:
        raise ValueError(f"global_batch {global_batch} is not divisible by world {world}: every "
                         "rank needs an equal shard for the averaged gradient to be the "
                         "global-batch mean")
    shard = global_batch // world

    x_train, y_train, x_test, y_test = load_digits_split(seed)
    x_train_t, y_train_t = torch.from_numpy(x_train), torch.from_numpy(y_train)
    batches = torch.from_numpy(
        batch_indices(len(x_train), steps, global_batch, seed)[:, rank * shard:(rank + 1) * shard])

    net, params, n_grad, flat = model_and_buffer(seed, model)
    loss_fn = nn.CrossEntropyLoss()
    x_test_t = torch.from_numpy(x_test)

    def accuracy() -> float:
        with torch.no_grad():
            return float(np.mean(net(x_test_t).argmax(dim=1).numpy() == y_test))

    curve: list[tuple[float, int, float]] = [(0.0, 0, accuracy())] if eval_every else []
    evaluating = 0.0  # seconds spent on evaluations, not counted as training
    if ready is not None:
        ready()
    start = time.perf_counter()
    for s in range(steps):
        idx = batches[s]
        for p in params:
            p.grad.zero_()
        loss = loss_fn(net(x_train_t[idx]), y_train_t[idx])
        loss.backward()
        # One tensor, one collective per step (as a bucketed DDP issues it), not one per
        # parameter, which would time per-call latency instead of the aggregation.
        torch.cat([p.grad.reshape(-1) for p in params] + [loss.detach().reshape(1)], out=flat)
        summed = allreduce(flat)
        summed.div_(world)
        set_flat_grads(net, summed[:n_grad])
        with torch.no_grad():
            for p in params:
                p.add_(p.grad, alpha=-lr)
        if eval_every and ((s + 1) % eval_every == 0 or s + 1 == steps):
            t = time.perf_counter()
            curve.append((t - start - evaluating, s + 1, accuracy()))
            evaluating += time.perf_counter() - t
    seconds = time.perf_counter() - start - evaluating
    final_loss = float(summed[n_grad])

    acc = accuracy()
    with torch.no_grad():
        checksum = float(sum(p.detach().double().abs().sum() for p in params))
    return {
        "steps": steps,
        "seconds": seconds,
        "iters_per_s": steps / seconds if seconds > 0 else float("inf"),
        "final_loss": final_loss,
        "accuracy": acc,
        "param_checksum": checksum,
        "allreduce_numel": n_grad + 1,
        "model": model,
        "curve": curve,
    }
