"""Shared peers and rosters of the hierarchical-averaging swarm tests (real hivemind processes on
127.0.0.1): each ``_peer``-like function runs in a process of its own (tests/peer/swarm_harness.py)."""

from __future__ import annotations

import time

import torch

from hivemind_adapter.dht import peer_id, read_entries, store
from peer.averaging.factory import build_averager
from peer.averaging.stage import AveragingTimeouts
from tests.peer.swarm_harness import run_peers, start_bootstrap_dht

SHAPES = [(5, 7), (13,)]
FAST = AveragingTimeouts(matchmaking=2.0, request=1.0, next_chunk=5.0, allreduce=60.0, step=60.0, commit=30.0)


def _grads(seed: int, shapes=SHAPES) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g) * (10.0 ** (seed % 3 - 1)) for s in shapes]


def _crafted_masks(key: str) -> list[torch.Tensor]:
    """The weights a cohort's sub-networks use: 'a' the first rows/elements, 'b' the last ones (they
    overlap in row 2 of the first tensor); element [1][8] is used by neither."""
    masks = [torch.zeros(s, dtype=torch.bool) for s in SHAPES]
    if key == "a":
        masks[0][:3] = True
        masks[1][:6] = True
    elif key == "b":
        masks[0][2:] = True
        masks[1][9:] = True
    return masks


def _roster(dht, run_id: str, size: int) -> list[str]:
    """Every peer's id, as the real roster (signed announcements) would list them: each peer posts its
    own and waits (bounded) until all ``size`` are visible."""
    return sorted(_ranks(dht, run_id, size, 0))


def _cohorts_of_one(dht, run_id: str, size: int, rank: int) -> list[tuple[str]]:
    """:func:`_roster`, as the roster's peers of each cohort of one by rank (what a peer's plan passes)."""
    ranks = _ranks(dht, run_id, size, rank)
    return [(peer,) for peer in sorted(ranks, key=ranks.get)]


def average_as_cohort_of_one(averager, rank: int, ranked: list[tuple[str]], seed: int, samples: int):
    """Attempt 0 of a cohort of one among ``ranked`` (:func:`_cohorts_of_one`), contributing
    ``_grads(seed)`` over ``samples``; the averager's outcome."""
    numerator = [g * samples for g in _grads(seed)]
    return averager.average(
        0, numerator, samples, cohort_size=1, num_cohorts=len(ranked), cohort_rank=rank,
        expected_peers=[p for (p,) in ranked], cohorts=ranked,
    )  # fmt: skip


def _ranks(dht, run_id: str, size: int, rank: int) -> dict[str, int]:
    """peer id -> the cohort rank it posted with its id (``rank`` for this peer's), once all ``size`` did."""
    store(dht, f"{run_id}_roster", rank, 300.0, subkey=peer_id(dht))
    deadline = time.monotonic() + 60
    while len(found := read_entries(dht, f"{run_id}_roster")) < size:
        assert time.monotonic() < deadline, f"only {len(found)} of {size} peers posted their id"
        time.sleep(0.2)
    return {peer: int(value) for peer, value in found.items()}


def assert_no_split_of_two_on_time_and_two_late(outcomes: list[dict]) -> None:
    """Four peers, two of them late: all met in one group that holds a quorum (at least three
    committed one result of at least three contributors; a late one whose process lagged far
    behind the other may miss the group of three)."""
    committed = [r for r in outcomes if r["committed"]]
    assert len(committed) >= 3, [r["reason"] for r in outcomes]
    assert len({r["digest"] for r in committed}) == 1
    assert all(len(r["contributors"]) >= 3 for r in committed), [r["contributors"] for r in committed]


def _outcome(res) -> dict:
    """A round's outcome as a peer process sends it back to the test."""
    return dict(
        committed=res.committed,
        reason=res.reason,
        digest=res.digest,
        # numpy pickles by value: a torch tensor would reference this process's memory, which is gone
        # once the peer exits
        tensors=None if res.tensors is None else [t.numpy() for t in res.tensors],
        leader=res.leader,
        contributors=[c.peer for c in res.contributors],  # sorted by peer id
        seconds=res.seconds,
    )


def _peer(
    dht,
    *,
    cohort,
    seed,
    samples,
    sizes,
    run_id,
    shapes=SHAPES,
    mask_key="",
    masked=False,
    fp16=False,
    events=None,
):
    """One peer: ``sizes`` lists (cohort_size, num_cohorts) per round, as its DHT roster would say."""
    averager = build_averager(
        dht,
        run_id,
        cohort,
        [torch.zeros(s) for s in shapes],
        per_cohort=masked,
        cross_codec="fp16" if fp16 else "none",
        timeouts=FAST,
    )
    try:
        roster = _roster(dht, run_id, len(PEERS))  # a dead peer stays listed, as it would until its TTL
        out = []
        for r, (cohort_size, num_cohorts) in enumerate(sizes):
            grads = _grads(seed, shapes)
            if masked:
                grads = [g * m for g, m in zip(grads, _crafted_masks(mask_key))]
            numerator = [g * samples for g in grads]
            if events is not None and r == 1:
                events[0].set()  # entering round 1's averaging
            res = averager.average(
                r, numerator, samples, cohort_size=cohort_size, num_cohorts=num_cohorts, expected_peers=roster
            )
            if events is not None and r == 1:
                events[1].set()  # round 1 is over for this peer
            if not res.committed:
                averager.settle(r, roster)  # as the round loop does: the others finish the attempt first
            out.append(_outcome(res))
        return out
    finally:
        averager.shutdown()


PEERS = {  # name: (cohort, seed, samples, weights its cohort's sub-networks use in model-parallel rounds)
    "p0": ("rack-a", 0, 3, "a"),
    "p1": ("rack-a", 1, 5, "a"),
    "p2": ("rack-b", 2, 2, "b"),
    "p3": ("rack-b", 3, 7, "b"),
}


def _args(run_id, masked=False, sizes=((2, 2),), shapes=SHAPES):
    return {
        name: dict(
            cohort=c,
            seed=s,
            samples=n,
            mask_key=m,
            masked=masked,
            sizes=list(sizes),
            run_id=run_id,
            shapes=shapes,
        )
        for name, (c, s, n, m) in PEERS.items()
    }


def _run(run_id, args, target=_peer, **kw):
    boot, maddrs = start_bootstrap_dht()
    try:
        return run_peers(target, maddrs, args, **kw)
    finally:
        boot.shutdown()


def assert_survivors_hold_the_mean_of_all(survivors: list[dict]) -> None:
    """Every survivor committed one result: the exact sample-weighted mean over all of ``PEERS``
    (the dead one's contribution included)."""
    assert all(r["committed"] for r in survivors), [(r["reason"], r["seconds"]) for r in survivors]
    assert len({r["digest"] for r in survivors}) == 1
    assert all(len(r["contributors"]) == len(PEERS) for r in survivors)
    total = sum(n for _, _, n, _ in PEERS.values())
    want = [sum(_grads(s)[i] * n for _, s, n, _ in PEERS.values()) / total for i in range(len(SHAPES))]
    for got, expected in zip(survivors[0]["tensors"], want):
        torch.testing.assert_close(torch.from_numpy(got), expected, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- members that left the attempt
