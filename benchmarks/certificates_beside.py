"""Commit certificates relayed beside a thin peer's commit board (``swarm_scale --certificates``).

Each result the peer posts on its board it also votes for over direct calls
(:class:`peer.commit.certificate_channel.CertificateChannel`), in the cohorts the round assigned;
after the round the certificates' verdict is set beside the board's. They decide nothing here: the
board still commits, so the two can be compared on the same attempts.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from hivemind_adapter.p2p import Endpoint
from peer.averaging.outcome import AveragingOutcome
from peer.commit.certificate_channel import CertificateChannel
from peer.commit.certificate_relay import RelaySettings
from peer.commit.committer import RoundCommitter
from peer.commit.report import CommitReport
from protocol.commit_certificate import CommitCertificate, RosterSnapshot, sign_vote
from protocol.identity import Identity

AFTER_BOARD_WAIT = 3.0  # seconds a peer that voted waits past its board's verdict for the certificates'


@dataclass
class CertificateFigures:
    """A thin peer's commit certificates beside its board, over its rounds."""

    rounds: int = 0
    committed: int = 0  # peer-rounds whose certificates committed a result
    agreed: int = 0  # ... the one the board committed
    disagreed: int = 0  # ... another than the board committed (a fault: must stay 0)
    seconds: list[float] = field(default_factory=list)  # its vote to its certificate commit
    board_seconds: list[float] = field(default_factory=list)  # its report to its board verdict
    sent_bytes: int = 0
    sent_messages: int = 0


class CertificatesBeside:
    """One thin peer's certificate channel, fed by ``committer``'s posted results."""

    def __init__(self, dht, task_id: str, identity: Identity, committer: RoundCommitter, seed: int):
        self.task_id, self.identity = task_id, identity
        self.endpoint = Endpoint(dht, "certificates")
        self.me = self.endpoint.peer_id
        self.channel = CertificateChannel(self.endpoint, task_id, RelaySettings(), random.Random(seed))
        self.figures = CertificateFigures()
        self._cohort: str | None = None
        self._voted: set[int] = set()
        post = committer.post_result

        def post_and_vote(attempt: int, report: CommitReport) -> None:
            post(attempt, report)
            if report.ok and report.digest and self._cohort is not None:
                signature = sign_vote(self.identity, task_id, attempt, report.digest, report.group)
                votes = {self.me: signature}
                certificate = CommitCertificate(
                    task_id, attempt, self._cohort, report.digest, report.group, votes
                )
                self.channel.vote(attempt, certificate)
                self._voted.add(attempt)

        committer.post_result = post_and_vote  # type: ignore[method-assign]

    def begin(self, attempt: int, keys: dict[str, str], assignment: dict[str, str]) -> None:
        """Open ``attempt`` among the roster peers that have both a key and a cohort."""
        members = {p: c for p, c in assignment.items() if p in keys}
        self._cohort = members.get(self.me)
        if self._cohort is not None:
            self.channel.open(attempt, RosterSnapshot({p: keys[p] for p in members}, members))

    def end(self, attempt: int, outcome: AveragingOutcome) -> None:
        """Set the certificates' verdict on ``attempt`` beside the board's (``outcome``)."""
        self.figures.rounds += 1
        if self._cohort is None:
            return
        # only where the board committed is a certificate commit due: elsewhere waiting would put
        # this peer behind the swarm's next round
        wait = AFTER_BOARD_WAIT if attempt in self._voted and outcome.committed else 0.0
        digest = self.channel.wait_committed(attempt, timeout=wait)
        if "commit" in outcome.seconds and outcome.committed:
            self.figures.board_seconds.append(outcome.seconds["commit"])
        if digest is None:
            return
        self.figures.committed += 1
        if outcome.committed:
            same = digest == outcome.digest
            self.figures.agreed += same
            self.figures.disagreed += not same
        seconds = self.channel.commit_seconds(attempt)
        if seconds is not None:
            self.figures.seconds.append(seconds)

    def so_far(self) -> CertificateFigures:
        """The figures of the rounds so far, with what the channel sent."""
        self.figures.sent_bytes = self.channel.sent_bytes
        self.figures.sent_messages = self.channel.sent_messages
        return self.figures

    def close(self) -> None:
        self.channel.close()
        self.endpoint.close()
