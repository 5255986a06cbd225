"""The TNA program's admission (p4src/tna/admission.p4: differences computed in actions, then
one ternary table, reject, read here from the P4 source) refuses every packet for the reason
the v1model program gives (switch_model.pipeline's JobAdmission, held to p4src/include by the
conformance suite): the same first fault, in the same order, over random headers, members,
roles and pools within the controller's limits (at most 64 ids behind a port, pools below
2^15 slots)."""

from __future__ import annotations

import random
from types import SimpleNamespace

from switch_model.frame import (
    DROP_NONE,
    FLAG_CLOSE,
    FLAG_CONGESTED,
    FLAG_CONTRIB,
    FLAG_POOL,
    FLAG_RESULT,
    Header,
)
from switch_model.pipeline import Pipeline
from tests.p4 import needs_cpp
from tests.p4.tna_slot import const_entries, lookup, preprocessed

pytestmark = needs_cpp


def tna_reject(entries, h: Header, port: int, j: dict, member: tuple[int, int] | None):
    """admission.p4's differences() and id_room(), then its reject table."""
    cid, count = member if member is not None else (0, 0)
    offset = (h.contributor - cid) & 0xFF
    key = (h.flags, int(member is not None), offset, (offset - count) & 0xFF, j["is_root"],
           port ^ j["uplink_port"], h.version ^ (j["epoch"] << 1), h.slot,
           (h.slot - j["pool_size"]) & 0xFFFF, h.version ^ (h.round & 0xFF))
    e = lookup(entries, *key)
    return DROP_NONE if e is None else e.args[0]


def test_the_tna_admission_refuses_as_the_v1model_admission():
    entries = const_entries(preprocessed("admission.p4"), "reject")
    rng = random.Random(49)
    reasons = set()
    for n in range(40_000):
        port, uplink = (rng.randrange(1 << rng.choice([3, 9])) for _ in range(2))
        cid = rng.randrange(64)
        member = (cid, rng.randrange(1, 65 - cid)) if rng.random() < 0.85 else None
        j = {"is_root": rng.randrange(2), "uplink_port": uplink, "epoch": rng.randrange(128),
             "pool_size": rng.randrange(1, 11265)}
        kind = rng.choice([FLAG_CONTRIB] * 6 + [FLAG_RESULT] * 3 + [0, 3])
        flags = kind | rng.choice([0, 0, FLAG_CLOSE, FLAG_POOL, FLAG_CONGESTED, 0x40, 0x80])
        if j["is_root"] == 0 and kind == FLAG_RESULT and rng.random() < 0.7:
            port = uplink
        contributor = (cid + rng.randrange(-3, 67)) & 0xFF if member else rng.randrange(256)
        rnd = rng.getrandbits(32)
        epoch = j["epoch"] if rng.random() < 0.9 else rng.randrange(128)
        version = (epoch << 1) | ((rnd & 1) if rng.random() < 0.9 else rng.randrange(2))
        slot = rng.choice([rng.randrange(j["pool_size"]), rng.randrange(j["pool_size"] + 2),
                           rng.randrange(1 << 16)])
        h = Header(job_id=1, slot=slot, contributor=contributor, flags=flags, version=version,
                   level=0, frag=0, round=rnd, num_contrib=1, exp=0, tag=0, session=1)
        entries_of = {} if member is None else {
            (1, port): SimpleNamespace(params={"contributor": member[0], "count": member[1]})}
        v1model = SimpleNamespace(state=SimpleNamespace(
            tables={"membership": SimpleNamespace(entries=entries_of)}))
        want = Pipeline._admission_drop(v1model, port, h, j)
        assert tna_reject(entries, h, port, j, member) == want, (n, h, port, j, member)
        reasons.add(want)
    # Every reason, and admission, occur.
    assert len(reasons) == 8, reasons
