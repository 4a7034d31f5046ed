"""Attacks on commit certificates (a task with ``commit = "certificates"``), run by an admitted peer
of the red team (``benchmarks/red_team.py --commit certificates``):

- ``far-attempt-votes``: its own valid vote for an attempt 1,000 ahead of the swarm's, sent to every
  honest peer every few seconds (followed, it would move their attempt counters past the swarm's
  and cut them off from its attempts);
- ``forged-votes``: departure and abort votes in every honest peer's name for the coming attempts,
  signed by a throw-away key (counted, they would shrink or sink every attempt's majority);
- ``equivocating-votes``: after each honest vote, a departure vote of its own key for the same
  attempt to half of the honest peers (its vote would count as a result for some verifiers and
  shrink the majority for others).
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Callable

from peer.commit.certificate_channel import encode, handler_name
from peer.commit.certificate_relay import Kind, RelayMessage
from peer.commit.certified import CertifiedCommitter
from peer.roster_view import read_roster
from protocol.commit_certificate import ABORTED, DEPARTED, CommitCertificate, sign_vote
from protocol.identity import Identity
from tests.adversaries.identity_attacks import repeat_in_background

logger = logging.getLogger("manta.red-team")

VOTE_ATTACKS = ("far-attempt-votes", "forged-votes", "equivocating-votes")
FAR = 1000  # how far ahead of the swarm's attempt far-attempt-votes votes
SEND_TIMEOUT = 5.0


def _committer(node) -> CertifiedCommitter:
    commits = node.parts.commits
    if not isinstance(commits, CertifiedCommitter):
        raise RuntimeError("vote attacks need a task whose rounds commit on certificates")
    return commits


def _honest_ids(node) -> list[str]:
    return [
        p.entry.peer_id for p in read_roster(node.dht, node.spec.record) if p.entry.peer_id != node.peer_id
    ]


def _send(commits: CertifiedCommitter, to: list[str], attempt: int, certificate: CommitCertificate) -> None:
    payload = encode(attempt, RelayMessage(Kind.VOTE, (certificate.to_wire(),)))
    for peer in to:
        try:
            commits.channel.endpoint.call(peer, handler_name(commits.task_id), payload, timeout=SEND_TIMEOUT)
        except Exception as e:  # gone or slow: the next round of votes
            logger.debug(f"red team: a vote to {peer[-8:]} failed: {e}")


def _scope(commits: CertifiedCommitter) -> str:
    return commits._scopes.get(commits.attempt, "c0000")


def far_attempt_votes(node) -> Callable[[], None]:
    commits = _committer(node)
    made_up = hashlib.sha256(b"a result of an attempt nobody is in").hexdigest()

    def once() -> None:
        far = max(0, commits.attempt) + FAR
        signature = sign_vote(commits.identity, commits.task_id, far, made_up, "")
        vote = CommitCertificate(
            commits.task_id, far, _scope(commits), made_up, "", {node.peer_id: signature}
        )
        _send(commits, _honest_ids(node), far, vote)

    return once


def forged_votes(node) -> Callable[[], None]:
    commits = _committer(node)
    forger = Identity.generate()

    def once() -> None:
        victims = _honest_ids(node)
        for ahead in range(3):
            attempt = max(0, commits.attempt) + ahead
            for digest in (DEPARTED, ABORTED):
                votes = {v: sign_vote(forger, commits.task_id, attempt, digest, "") for v in victims}
                certificate = CommitCertificate(commits.task_id, attempt, _scope(commits), digest, "", votes)
                _send(commits, victims, attempt, certificate)

    return once


def equivocating_votes(node) -> None:
    """Every vote it casts, it follows with a departure vote of its own key to half the honest peers."""
    honest_vote = CertifiedCommitter._vote

    def vote(self: CertifiedCommitter, attempt: int, digest: str, group: str) -> None:
        honest_vote(self, attempt, digest, group)
        scope = self._scopes.get(attempt)
        if scope is None or digest == DEPARTED:
            return
        signature = sign_vote(self.identity, self.task_id, attempt, DEPARTED, "")
        second = CommitCertificate(self.task_id, attempt, scope, DEPARTED, "", {self.peer_id: signature})
        victims = _honest_ids(node)
        threading.Thread(
            target=_send, args=(self, victims[: len(victims) // 2 + 1], attempt, second), daemon=True
        ).start()

    CertifiedCommitter._vote = vote  # type: ignore[method-assign]


_LOOPS = {"far-attempt-votes": far_attempt_votes, "forged-votes": forged_votes}


def start(fault: str, node) -> None:
    """Run ``fault`` beside ``node``'s honest work (a daemon thread; ``equivocating-votes`` changes
    what its votes are followed by instead)."""
    logger.info(f"red team: {fault} runs beside this peer's honest work")
    if fault == "equivocating-votes":
        equivocating_votes(node)
        return
    repeat_in_background(fault, _LOOPS[fault](node), "votes")
