"""Live pool resizing and live policy changes, the agents' side: when the hosts move to the pool
`passing-ctl job resize` installed, or to the patience and staleness bound `passing-ctl job set`
gave, and to which.

The controller installs the new pool beside the old one (the other FLAG_POOL) and raises the
job's `pool` in its parameters; a new policy raises its `policy`. The agents learn of both by
polling their parameter source. They must then all change at the same call: a host that
streamed a call into the other pool, or with another window, would have its fragments summed
with the wrong ones, and hosts that count short calls against different staleness bounds no
longer agree on which call waits for everyone. So every call carries a vote in one fragment
of its own, after the tensor's: each host votes for the newest parameters it holds (its
current ones until it learns of newer):

    lane 0: 1 from every host (its sum says how many hosts voted)
    then for each digit d of what it votes for, two lanes: d and d^2. The digits: the 8
      base-16 digits of the pool number, the 4 of the window, the 8 of the policy number

and the hosts change after the call whose sums say that all n hosts are in and, for every
digit, n * sum(d^2) == sum(d)^2, which holds only if every host's digit is the same
(Cauchy-Schwarz): so all voted for the same pool, window and policy; a host changes if that is
newer than what it holds. Every host reads the same sums, so every host decides alike; a round
closed by a quorum holds fewer votes, and nobody changes. Digits keep every lane's sum below
2**S for up to 1024 hosts, so the fixed point carries them exactly (host_agent.fixed_point).
Voting for what it holds, not only for what is new, lets a host that was left behind (a forged
vote made the others change without it) catch up: its vote for the same parameters is the one
that was missing. A policy number names one patience and one staleness bound (the controller
raises it whenever it changes either), so hosts that voted for the same number apply the same
policy.

The session is derived from the one the hosts agreed on, the pool number and the window
(`pool_session`), in the first pool as after every move: hosts that hold different parameters
(a stale file two resizes old names a pool with the same FLAG_POOL; the switches drop its
packets anyway, their version's epoch being the old pool's) never share a session, so their
fragments are never summed together; a result of the old pool (a late resend's answer)
is never taken for one of the new pool; and the first call in the new pool waits for everyone
(StreamConfig.wait_first), so no new round completes while a host may still be finishing its
last call in the old one. The
controller frees the old pool once every host has contributed to the new one
(docs/protocol.md, "Live pool resizing"). A policy change alone keeps the pool, the session
and the rounds: only when hosts ask to close rounds changes (docs/protocol.md, "Live policy
changes").
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable

import numpy as np

from host_agent import fixed_point as fx
from passing import protocol as P
from passing.contract import JobParams

_POOL_DIGITS = 8  # base-16 digits of a pool number (JobParams.pool: 31 bits)
_WINDOW_DIGITS = 4  # ... of a window: pools have at most 65535 slots
_POLICY_DIGITS = 8  # ... of a policy number (JobParams.policy: 31 bits)
_DIGIT_COUNT = _POOL_DIGITS + _WINDOW_DIGITS + _POLICY_DIGITS
VOTE_LANES = 1 + 2 * _DIGIT_COUNT

# What a change of policy sets in a host's StreamConfig (SlotStreamer.set_policy), from the
# parameters it changes to: the caller's rule (the `passing` backend's lets PASSING_PATIENCE
# and PASSING_STALENESS win over the job's, as at start).
Policy = Callable[[JobParams], dict]


def vote_offset(n: int) -> int:
    """Where a call of `n` values puts its vote: the first lane of the fragment after them."""
    return -(-n // P.K) * P.K


def call_size(n: int) -> int:
    """Values a call of `n` streams through the switch, the vote included."""
    return vote_offset(n) + VOTE_LANES


def pool_session(session: int, pool: int, window: int) -> int:
    """The session of hosts that agreed on `session` and stream in pool number `pool` with
    `window` slots: the same on every host that holds the same parameters, non-zero, and
    unrelated to any other pool's or window's. The rule of which slots a call uses is part
    of it, and so is the speculative scale's (a fragment's packets differ): agents of another
    rule count other rounds on the same slots, or read an exponent packet as values, and the
    switch would sum their fragments with ours; in different sessions it never does."""
    rule = (f"slots {P.MIN_SLOTS}/{P.FRAGS_PER_SLOT} speculate "
            f"{fx.SPEC_HEADROOM}/{fx.SPEC_SLACK} on the whole window, zero holds, fewer misses "
            "than slots").encode()
    h = hashlib.sha256(session.to_bytes(8, "big") + pool.to_bytes(4, "big")
                       + window.to_bytes(4, "big") + b"passing/pool" + rule)
    return int.from_bytes(h.digest()[:8], "big") or 1


def _digits(params: JobParams) -> list[int]:
    """What a host votes with when it votes for `params`."""
    return [(value >> (4 * k)) & 0xF
            for value, count in ((params.pool, _POOL_DIGITS), (params.window, _WINDOW_DIGITS),
                                 (params.policy, _POLICY_DIGITS))
            for k in range(count)]


def _same_job(a: JobParams, b: JobParams) -> bool:
    """Parameters of the same job that a resize or `job set` may have produced: only the
    window, the pool and the agents' policy change."""
    return (a.job_id, a.mode, a.session_key, a.switch_udp_port, a.agent_udp_port, a.hosts,
            a.values_per_packet) == (b.job_id, b.mode, b.session_key, b.switch_udp_port,
                                     b.agent_udp_port, b.hosts, b.values_per_packet)


def _newer(params: JobParams, current: JobParams) -> bool:
    """`params` is what `current` may change to: the same job, in the next pool (any newer
    policy with it) or in the same pool and window under a newer policy."""
    if not _same_job(params, current) or params.policy < current.policy:
        return False
    if params.pool == current.pool + 1:
        return True
    return (params.pool == current.pool and params.window == current.window
            and params.policy > current.policy)


class PoolVote:
    """The leader's view of the job's parameters: those it streams with (`params`), newer ones
    it learned of (polling `source` every `poll` seconds, in a thread), and the votes."""

    def __init__(self, params: JobParams, source: Callable[[], JobParams] | None = None,
                 poll: float = 2.0):
        self.params = params
        self.calls = 0
        self.moves: list[tuple[int, int, int]] = []  # (call, pool, window) of every pool move
        self.policies: list[tuple[int, int]] = []  # (call, policy) of every policy change
        self._source = source
        self._next: JobParams | None = None
        self._voted: JobParams | None = None
        self._lock = threading.Lock()  # `_next`: the poll thread offers, the caller votes
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if source is not None and poll > 0:
            self._thread = threading.Thread(target=self._poll, args=(poll,), daemon=True,
                                            name=f"passing-pool-{params.job_id}")
            self._thread.start()

    def offer(self, params: JobParams) -> bool:
        """Take `params` as the ones to vote for if the current ones may change to them (the
        next pool of this very job, or a newer policy) and are not older than the ones already
        taken (a source that briefly serves older parameters changes nothing); whether they
        were taken."""
        with self._lock:
            if not _newer(params, self.params) or (
                    self._next is not None and params != self._next
                    and _newer(self._next, self.params) and not _newer(params, self._next)):
                return False
            self._next = params
            return True

    def _poll(self, every: float) -> None:
        while not self._stop.wait(every):
            try:
                fresh = self._source()
            except Exception:  # noqa: BLE001 - an unreachable controller: keep what we have
                continue
            self.offer(fresh)

    def with_vote(self, flat: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """`flat` followed by this host's vote, as the call streams it: in `out` (call_size
        floats, float32 where `flat` is, whatever it held before) or a new float64 array."""
        n = flat.size
        if out is None:
            out = np.empty(call_size(n), dtype=np.float64)
        out[:n] = flat
        out[n:] = 0  # up to the vote's fragment, and the vote's lanes not set below
        with self._lock:
            nxt = self._next
        self._voted = nxt if nxt is not None and _newer(nxt, self.params) else self.params
        lanes = out[vote_offset(n):]
        lanes[0] = 1.0
        for k, d in enumerate(_digits(self._voted)):
            lanes[1 + 2 * k], lanes[2 + 2 * k] = d, d * d
        return out

    def decide(self, sums: np.ndarray, counts: np.ndarray, complete: int,
               streams: int) -> JobParams | None:
        """After a call: the parameters every host changes to now, from the call's vote lanes
        (`sums`, and the GPUs each holds, `counts`), or None to stay."""
        voted, self._voted = self._voted, None
        self.calls += 1
        lanes = [int(v) for v in np.rint(sums[:VOTE_LANES])]
        if (voted is None or voted is self.params or lanes[0] != streams
                or np.any(counts[:VOTE_LANES] < complete)):
            return None
        for k, d in enumerate(_digits(voted)):
            s1, s2 = lanes[1 + 2 * k], lanes[2 + 2 * k]
            if streams * s2 != s1 * s1 or s1 != streams * d:
                return None
        with self._lock:
            before, self.params = self.params, voted
            if self._next is voted:
                self._next = None
        if voted.pool != before.pool:
            self.moves.append((self.calls, voted.pool, voted.window))
        if voted.policy != before.policy:
            self.policies.append((self.calls, voted.policy))
        return voted

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
