"""The one record a peer posts on a commit board for an attempt, in every form it takes."""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class CommitReport:
    """One peer's latest record of one attempt.

    A *report* ends the peer's attempt: a result (``ok`` and its ``digest``), a failure (``ok``
    False) or a departure notice (``left``). A *marker* (``checking``) is posted in the middle of an
    attempt and only carries what the peer checked so far; readers never count it as a report.

    ``state``: the state digest after applying ``digest`` (the same report, posted again);
    ``group``: the averaging group id of the result (:class:`protocol.records.RoundCommit`), what
    receipts are checked against; ``outliers``: peers this peer's reducers named; ``proofs``: the
    reducers' signed proof digests it accepted (:mod:`protocol.proof_attestation` tokens);
    ``checked``: tokens of the groups of three it checked (every later record of the attempt repeats
    them); ``refused``: reducers whose averages it refused in the attempt.
    """

    ok: bool = False
    digest: str = ""
    left: bool = False
    state: str = ""
    group: str = ""
    outliers: tuple[str, ...] = ()
    proofs: tuple[str, ...] = ()
    checked: tuple[str, ...] = ()
    checking: bool = False
    refused: tuple[str, ...] = ()

    @classmethod
    def departure(cls) -> CommitReport:
        """A notice that the peer takes no part in the attempt."""
        return cls(left=True)

    @classmethod
    def marker(
        cls, proofs: tuple[str, ...], checked: tuple[str, ...], refused: tuple[str, ...]
    ) -> CommitReport:
        """What the peer checked, accepted and refused so far in an attempt it has not ended."""
        return cls(proofs=proofs, checked=checked, refused=refused, checking=True)

    def holding(self, state_digest: str) -> CommitReport:
        """This result report again, once its result is applied and the peer holds ``state_digest``."""
        return replace(self, state=state_digest)

    def holds(self, digest: str) -> bool:
        """Whether this is a report of result ``digest``."""
        return self.ok and not self.checking and self.digest == digest
