"""What opening a signed record costs a reader, with and without remembering valid signatures.

Every record that speaks for a peer id carries that peer's endorsement (its libp2p key's signature of
its MANTA key), and every announcement its binding and membership certificate: the same signatures,
checked again in each new record a reader opens. Here ``--peers`` peers each post ``--reports``
fresh commit reports (new bytes, as each attempt brings), and a reader opens all of them once with
every signature checked (:func:`protocol.identity.verify_signature` forgetting what it found) and once
as a peer does (remembering valid signatures); likewise each peer's announcement refreshed
``--reports`` times. Prints the cost per record side by side.

    python -m benchmarks.record_open_bench [--peers 32] [--reports 8]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable

from protocol.dht_schema import commit_subkey, open_commit_value, open_peer_value
from protocol.identity import Identity, forget_valid_signatures
from protocol.membership import MembershipCertificate
from protocol.peer_keys import Libp2pKey, Speaker
from protocol.records import Affinity, DeviceInfo, IdentityBinding, PeerAnnouncement, RoundCommit
from protocol.sealing import seal

TASK = "bench"


def _speaker() -> Speaker:
    return Speaker.of(Identity.generate(), Libp2pKey.generate())


def _report(speaker: Speaker, attempt: int) -> tuple[str, bytes]:
    record = RoundCommit(
        task_id=TASK, attempt=attempt, peer_id=speaker.peer_id, public_key=speaker.identity.public_key_hex,
        endorsement=speaker.endorsement, ok=True, digest=f"{attempt:064x}", timestamp=int(time.time() * 1000),
    )  # fmt: skip
    return commit_subkey(attempt, speaker.identity.public_key_hex), seal(record, speaker.identity)


def _announcement(speaker: Speaker, aggregator: Identity, refresh: int) -> tuple[str, list[bytes]]:
    me = speaker.identity
    now = int(time.time() * 1000)
    record = PeerAnnouncement(
        task_id=TASK, peer_id=speaker.peer_id, public_key=me.public_key_hex,
        devices=(DeviceInfo(kind="cpu", name="bench", memory_mb=0),), throughput_milli=1000,
        affinity=Affinity(host_id="0" * 16, network_id="0" * 16), cohort_id="auto", timestamp=now + refresh,
    )  # fmt: skip
    binding = IdentityBinding(
        peer_id=speaker.peer_id, public_key=me.public_key_hex, endorsement=speaker.endorsement, timestamp=now
    )
    certificate = MembershipCertificate(
        task_id=TASK, member_key=me.public_key_hex, peer_id=speaker.peer_id, serial=1, policy="allow",
        issued_ms=now, expires_ms=now + 3600 * 1000,
    )  # fmt: skip
    return me.public_key_hex, [seal(record, me), seal(binding, me), seal(certificate, aggregator)]


def _per_record(opens: list[Callable[[], object]], remember: bool) -> float:
    """Seconds per record to open every one of ``opens`` once (remembering valid signatures or not)."""
    forget_valid_signatures()
    started = time.perf_counter()
    for open_one in opens:
        if not remember:
            forget_valid_signatures()
        open_one()
    return (time.perf_counter() - started) / len(opens)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", type=int, default=32)
    parser.add_argument("--reports", type=int, default=8, help="records per peer (attempts, refreshes)")
    args = parser.parse_args(argv)
    if args.peers < 1 or args.reports < 1:
        print("record_open_bench: --peers and --reports must be at least 1", file=sys.stderr)
        return 2
    print(f"command: python -m benchmarks.record_open_bench {' '.join(sys.argv[1:])}".rstrip())
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores")
    speakers, aggregator = [_speaker() for _ in range(args.peers)], Identity.generate()
    signers = frozenset({aggregator.public_key_hex})
    reports = [_report(s, a) for a in range(args.reports) for s in speakers]
    announcements = [_announcement(s, aggregator, r) for r in range(args.reports) for s in speakers]
    kinds = {
        "commit report (2 signatures)": [
            lambda sub=sub, wire=wire: open_commit_value(TASK, sub, wire) for sub, wire in reports
        ],
        "announcement (4 signatures)": [
            lambda sub=sub, value=value: open_peer_value(TASK, sub, value, signers)
            for sub, value in announcements
        ],
    }
    print(f"{'record':>30} {'every signature checked':>24} {'valid ones remembered':>22} {'ratio':>6}")
    for name, opens in kinds.items():
        checked, remembered = _per_record(opens, remember=False), _per_record(opens, remember=True)
        print(
            f"{name:>30} {checked * 1e6:>21.0f} us {remembered * 1e6:>19.0f} us {checked / remembered:>5.2f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
