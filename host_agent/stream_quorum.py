"""When a call may close rounds without every host (docs/protocol.md, "Rounds, quorum and late
contributions"): the patience a packet waits in silence, learned from the waits of rounds every
host made in time (adaptive patience), the staleness bound that makes a call wait for everyone,
and the evidence that makes the next call eager. Every host reads the same results, so every
host decides alike. No sockets, no clocks: times come in as arguments."""

from __future__ import annotations

from collections import deque

import numpy as np

from host_agent.stream_api import StreamConfig
from host_agent.stream_call import Call

# A short call makes the next one eager (every packet asks for CLOSE when first sent) only when
# at least EAGER_EVIDENCE of the last EAGER_HISTORY streaks began with a host late for a call
# that waited the patience (QuorumPolicy.late_starts).
EAGER_HISTORY, EAGER_EVIDENCE = 4, 2


class QuorumPolicy:
    """One session's quorum decisions, from call to call. The parameters (patience,
    patience_min, staleness) are the StreamConfig each method is given, which a live policy
    change replaces between calls; what was measured and counted is kept across it."""

    def __init__(self, cfg: StreamConfig):
        # Calls in a row whose sums left some GPU out.
        self.short_streak = cfg.staleness if cfg.wait_first else 0
        # The last call was short, and hosts were late at the start of enough streaks of
        # calls before it: the next closes its rounds as soon as the quorum is in.
        self.eager = False
        # Per streak, for the last EAGER_HISTORY: whether the call that waited the patience
        # after a call with everyone (the first of a streak of short calls, or one more call
        # with everyone) was short. The evidence of a host that keeps coming late, as against
        # one late step, however many calls that step makes.
        self.late_starts: deque[bool] = deque(maxlen=EAGER_HISTORY)
        # The longest silence per call that rounds completed by every host ended (mean, mean
        # deviation over calls): what adaptive patience follows.
        self.wait_avg: float | None = None
        self.wait_dev = 0.0

    def patience_now(self, cfg: StreamConfig) -> float | None:
        """How long a packet waits in silence (no awaited result of the call) for the other
        hosts before it asks for CLOSE (None: always waits)."""
        if cfg.patience is None or cfg.patience_min is None or self.wait_avg is None:
            return cfg.patience
        return min(max(self.wait_avg + 4 * self.wait_dev, cfg.patience_min), cfg.patience)

    def start(self, cfg: StreamConfig) -> tuple[float | None, bool, bool]:
        """A call begins: (its patience, None if it waits for everyone; whether the staleness
        bound forces that; whether the call before it had everyone)."""
        forced = self.short_streak >= cfg.staleness
        # Someone was left out too often: this call waits for everyone.
        return None if forced else self.patience_now(cfg), forced, self.short_streak == 0

    def finish(self, counts: np.ndarray, complete: int, quorum: bool,
               after_complete: bool) -> bool:
        """A call ended with `counts` GPUs in each fragment's sum (`complete` in a full one),
        it may have closed rounds without everyone (`quorum`), and the call before it was
        complete or not (`after_complete`): whether it was short, counted for the calls
        after it."""
        short = bool(np.any(counts < complete))
        self.short_streak = self.short_streak + 1 if short else 0
        if quorum and after_complete:  # (an eager call never follows a complete one)
            self.late_starts.append(short)
        # A host late for one step (jitter, a busy machine), in however many calls, leaves
        # the calls after it waiting the patience again; only a host late at the start of
        # more streaks makes the next call close at once (docs/protocol.md, "Quorum"). Every
        # host reads the same counts, so all agree.
        self.eager = short and sum(self.late_starts) >= EAGER_EVIDENCE
        return short

    @staticmethod
    def longest_wait(call: Call, slots: np.ndarray, recs: np.ndarray, now: float,
                     forced: bool, progress: float, complete: int) -> float | None:
        """The slowest wait among results of rounds that every host made in time, sent once
        (Karn): a CLOSE is a resend, so rounds a quorum closed never count. A wait is what
        patience is compared with: the silence the result ended, since the later of the
        packet's first send and the result before (`progress`). None: nothing to measure.
        In a call that waited for everyone (the staleness bound), a slot's first round
        waited for the straggler to arrive and does not count either; its later rounds
        started together on every host and do. Without that, a host that is always late
        would leave nothing to measure and the patience at its upper bound."""
        # A probe's turn through the older packets resends every packet that waits long
        # enough (a late host's lateness included): such resends do not hide a wait.
        full = ~call.retried[slots] & (recs["num_contrib"].astype(np.int64) >= complete)
        if forced:
            full &= call.step[slots] > 0
        if not full.any():
            return None
        return now - max(float(np.min(call.first_sent[slots[full]])), progress)

    def learn_wait(self, wait: float) -> None:
        """One sample per call, its longest silence: most silences of a call are the gaps
        between one result and the next, and learning from each would sink the patience to
        its floor, below the wait at a call's start (the hosts' skew, the first round trip),
        which is the one a late host must exceed."""
        if self.wait_avg is None:
            self.wait_avg, self.wait_dev = wait, wait / 2
        else:
            self.wait_dev = 0.75 * self.wait_dev + 0.25 * abs(self.wait_avg - wait)
            self.wait_avg = 0.875 * self.wait_avg + 0.125 * wait
