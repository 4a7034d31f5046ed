"""A stage admits the peers its roster shows while it looks for its group, not only those it showed
when the attempt began: real averagers with signed matchmaking, in processes of their own."""

from __future__ import annotations

import time

import pytest
import torch

from hivemind_adapter.dht import peer_id, read_entries, speaker, store
from hivemind_adapter.group_keys import DeclarationSigner
from peer.averaging.factory import build_averager
from peer.averaging.stage import AveragingTimeouts
from protocol.identity import Identity
from tests.peer.swarm_harness import run_peers, start_bootstrap_dht

pytestmark = pytest.mark.swarm

PEERS = 3
SAMPLES = 8
SHAPE = (4096,)
FAST = AveragingTimeouts(matchmaking=2.0, request=1.0, next_chunk=5.0, allreduce=30.0, step=30.0, commit=20.0)
KEY_AFTER = 1.0  # seconds after the roster is whole that the late peer's key reaches the roster
STEP_AFTER = 3.5  # ... and that it begins its attempt: the others gather for 6 s


def _wait_for(dht, key: str, count: int) -> list[str]:
    deadline = time.monotonic() + 60
    while len(found := sorted(read_entries(dht, key))) < count:
        assert time.monotonic() < deadline, f"{key}: {len(found)} of {count}"
        time.sleep(0.2)
    return found


def _peer(dht, *, seed: int, run_id: str, late: bool) -> dict:
    """One attempt of one cohort of :data:`PEERS`. The matchmaking admits the keys under
    ``{run_id}_keys`` (the roster's keys, as the peer reads them). The late peer's key reaches that
    roster after the others began their attempt, as an announcement a peer's roster reads missed."""
    identity = Identity.generate()
    averager = build_averager(
        dht, run_id, "host-a", [torch.zeros(SHAPE)], timeouts=FAST,
        declarations=DeclarationSigner(run_id, speaker(dht, identity)),
        admitted=lambda: {p: str(k) for p, k in read_entries(dht, f"{run_id}_keys").items()},
    )  # fmt: skip
    try:
        store(dht, f"{run_id}_roster", True, 300.0, subkey=peer_id(dht))
        roster = _wait_for(dht, f"{run_id}_roster", PEERS)
        if late:
            time.sleep(KEY_AFTER)
            store(dht, f"{run_id}_keys", identity.public_key_hex, 300.0, subkey=peer_id(dht))
            time.sleep(STEP_AFTER - KEY_AFTER)
        else:
            store(dht, f"{run_id}_keys", identity.public_key_hex, 300.0, subkey=peer_id(dht))
            _wait_for(dht, f"{run_id}_keys", PEERS - 1)  # the early peers admit each other from the start
        gradient = torch.randn(SHAPE, generator=torch.Generator().manual_seed(seed))
        res = averager.average(
            0, [gradient * SAMPLES], SAMPLES, cohort_size=PEERS, num_cohorts=1, expected_peers=roster,
            cohorts=[roster],
        )  # fmt: skip
        refusals: dict[str, int] = {}
        for hivemind_averager in averager.guard.averagers:
            for reason, count in hivemind_averager.admission_refusals().items():
                refusals[reason] = refusals.get(reason, 0) + count
        return dict(
            committed=res.committed,
            reason=res.reason,
            digest=res.digest,
            contributors=sorted(c.peer for c in res.contributors),
            refusals=refusals,
        )
    finally:
        averager.shutdown()


def test_a_peer_the_roster_showed_after_the_attempt_began_is_admitted_to_its_group():
    """Two peers begin an attempt whose roster lacks the third's key; it shows 1 s later, and the
    third joins 2.5 s after that, while the two still gather. Admitted only at the attempt's start,
    the two refuse it (as a leader refuses its join, as a follower the group it is in) and average
    as a pair, without it. Admitted as the roster shows it, the three meet and commit one result."""
    boot, maddrs = start_bootstrap_dht()
    try:
        results = run_peers(
            _peer,
            maddrs,
            {f"p{i}": dict(seed=i, run_id="admission-refresh", late=i == PEERS - 1) for i in range(PEERS)},
        )
    finally:
        boot.shutdown()
    outcomes = [results[f"p{i}"] for i in range(PEERS)]
    assert all(o["committed"] for o in outcomes), [o["reason"] for o in outcomes]
    assert all(len(o["contributors"]) == PEERS for o in outcomes), [o["contributors"] for o in outcomes]
    assert len({o["digest"] for o in outcomes}) == 1
    assert not any(o["refusals"] for o in outcomes), [o["refusals"] for o in outcomes]
