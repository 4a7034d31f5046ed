"""A peer whose averager ended (killed: its served side stopped at once, nothing shut down) does not
hang: the averager's calls and steps fail at once instead of waiting for ever on an answer that will
never come, and the peer is told, once, to stop in one line."""

from __future__ import annotations

import time

import pytest
import torch

from hivemind_adapter.allreduce import VerifiedAverager
from hivemind_adapter.averager_process import AveragerGone
from hivemind_adapter.dht import peer_id, start_dht
from peer.averaging.factory import CohortAveragers, build_averager, committer_for
from peer.averaging.stage import AveragingTimeouts
from peer.commit.boards import DHTCommitBoard
from protocol.identity import Identity
from tests.protocol.factories import task_spec

LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]
SHAPES = [(5, 7), (13,)]
FAST = AveragingTimeouts(matchmaking=1.0, request=1.0, next_chunk=5.0, allreduce=20.0, step=20.0, commit=5.0)


def _kill(averager: VerifiedAverager) -> None:
    averager.kill()
    averager.join(10)
    assert not averager.is_alive()


@pytest.fixture
def dht():
    node = start_dht(host_maddrs=LOOPBACK)
    yield node
    node.shutdown()


def test_an_averager_that_ended_fails_its_calls_at_once(dht):
    averager = VerifiedAverager([torch.zeros(4)], dht, prefix="gone", start=True)
    try:
        averager.set_allreduce_timeout(5.0)  # answered while it runs
        _kill(averager)
        with pytest.raises(AveragerGone, match=r"ended \(exit code 1\)"):
            averager.check_alive()
        started = time.monotonic()
        with pytest.raises(AveragerGone, match=r"ended \(exit code 1\)"):
            averager.set_allreduce_timeout(5.0)  # hivemind's own call waited for the answer for ever
        assert time.monotonic() - started < 5.0
    finally:
        averager.remove_socket_file()


def test_a_round_on_an_averager_that_ended_fails_at_once_and_says_why(dht):
    averager = build_averager(dht, "gone-round", "c0", [torch.zeros(s) for s in SHAPES], timeouts=FAST)
    try:
        assert averager.ended() is None
        _kill(averager.cross.averager)
        assert "exit code 1" in (averager.ended() or "")
        started = time.monotonic()
        outcome = averager.average(
            0,
            [torch.ones(s) for s in SHAPES],
            3,
            cohort_size=1,
            num_cohorts=2,  # the cross stage, on the ended averager
            expected_peers=[peer_id(dht)],
        )
        assert not outcome.committed
        assert "AveragerGone" in (outcome.reason or ""), outcome.reason
        assert time.monotonic() - started < 30.0
    finally:
        averager.shutdown()


def test_a_cohort_whose_averager_ended_tells_the_peer_once(dht):
    """The peer is told, and stops in one line (peer.node), rather than average without it."""
    spec = task_spec(Identity.generate())
    told: list[str] = []
    averagers = CohortAveragers(
        dht,
        spec,
        [torch.zeros(s) for s in SHAPES],
        timeouts=FAST,
        client_mode=False,
        round_commits=committer_for(DHTCommitBoard(dht, spec.task_id), FAST),
        outer_board=None,
        leaving=lambda: False,
        online=lambda: [peer_id(dht)],
        on_ended=told.append,
    )
    try:
        first = averagers.rounds("c0")
        assert averagers.rounds("c0") is first and told == []  # nothing to tell while it runs
        _kill(first._cohort)
        averagers.rounds("c0")
        averagers.rounds("c0")
        assert len(told) == 1 and "ended (exit code 1)" in told[0], told
    finally:
        averagers.shutdown()
