"""A receipt's witnesses, carried by its sender: its group's other committers' signed commit reports.

The aggregator credits a receipt only where a peer other than its sender reported committing the
receipt's group (:mod:`aggregator.commit_witness`). It reads those reports from the commit board,
where they live 90 s. A receipt that first reaches an aggregator later (the aggregator was down, or
restarted and asked for it again) would find none there and be refused as unwitnessed, though the
group did commit. So the sender keeps the reports it read beside the receipt and hands them over
before it. They are signed by their authors' keys: carrying them changes nothing of who vouches
(the same bytes could be posted on the board by anyone holding them), and a bundle the sender
forged or filled with another group's reports teaches the aggregator nothing.

Pure: bytes in, bytes out. The signatures are checked by the reader
(:func:`protocol.dht_schema.open_commit_value`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

# A group's other committers: a cohort stage and a cross stage hold far fewer.
MAX_REPORTS = 64
# A sealed RoundCommit is at most a few KiB (its lists are bounded); twice that per report, hex.
MAX_BUNDLE_BYTES = MAX_REPORTS * 16 * 1024


@dataclass(frozen=True)
class WitnessBundle:
    """``reports``: sealed :class:`~protocol.records.RoundCommit` wires of ``attempt`` that name
    ``group`` (the receipt's ``group_id``)."""

    attempt: int
    group: str
    reports: tuple[bytes, ...]

    def to_bytes(self) -> bytes:
        if len(self.reports) > MAX_REPORTS:
            raise ValueError(f"{len(self.reports)} reports, at most {MAX_REPORTS}")
        body = {"attempt": self.attempt, "group": self.group, "reports": [r.hex() for r in self.reports]}
        return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> WitnessBundle:
        """The bundle in ``data``; ValueError saying why if it is not one."""
        if len(data) > MAX_BUNDLE_BYTES:
            raise ValueError(f"a witness bundle of {len(data)} bytes, at most {MAX_BUNDLE_BYTES}")
        try:
            body = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"not JSON: {e}") from None
        if not isinstance(body, dict) or set(body) != {"attempt", "group", "reports"}:
            raise ValueError("a witness bundle holds exactly attempt, group and reports")
        attempt, group, reports = body["attempt"], body["group"], body["reports"]
        if type(attempt) is not int or attempt < 0:
            raise ValueError("its attempt is not a non-negative integer")
        if not isinstance(group, str) or not 0 < len(group) <= 128:
            raise ValueError("its group is not a group id")
        if not isinstance(reports, list) or len(reports) > MAX_REPORTS:
            raise ValueError(f"its reports are not a list of at most {MAX_REPORTS}")
        try:
            wires = tuple(bytes.fromhex(r) for r in reports)
        except (TypeError, ValueError):
            raise ValueError("a report is not hex") from None
        return cls(attempt, group, wires)
