"""Attacks on identity and membership, run by an otherwise honest peer of the red team
(``benchmarks/red_team.py``, ``tests/adversaries/dishonest_peer.py``): each is a loop on a thread of
the attacking peer's process, through its own DHT node, with keys it makes by the dozen.

- ``sybil-roster``: 40 throw-away keys announced, each bound to a libp2p key of its own and holding
  a membership certificate it signed itself;
- ``forged-departures``: departure notices in every honest peer's name for the coming attempts;
- ``forged-equivocation``: its own commit reports carry two different proofs it signed itself for a
  group that never met (evidence that would stop every commit of the attempt);
- ``throwaway-progress``: two throw-away keys report round 10^12 (it would age every receipt out);
- ``binding-hijack``: throw-away keys announced under every honest peer's id;
- ``replayed-records``: every announcement and progress record it reads, stored again to expire in
  ten years.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import threading
import time
from collections.abc import Callable

from hivemind.utils import get_dht_time

import peer.commit.boards
from hivemind_adapter.dht import read_entries, store
from peer.membership import sealed_binding
from peer.roster_view import read_roster
from peer.swarm_view import ProgressBoard
from protocol.dht_schema import commit_subkey, commits_key, peers_key, progress_key
from protocol.identity import Identity
from protocol.membership import MembershipCertificate
from protocol.peer_keys import Libp2pKey, Speaker
from protocol.proof_attestation import ProofAttestation, group_tag, proofs_digest
from protocol.record_lifetimes import ANNOUNCE_TTL, COMMIT_TTL
from protocol.records import Affinity, DeviceInfo, IdentityBinding, PeerAnnouncement, RoundCommit
from protocol.sealing import seal
from tests.protocol.factories import seal_unchecked

logger = logging.getLogger("manta.red-team")

IDENTITY_ATTACKS = (
    "sybil-roster", "forged-departures", "forged-equivocation", "throwaway-progress", "binding-hijack",
    "replayed-records",
)  # fmt: skip
EVERY = 2.0  # seconds between an attack's rounds of forgeries
SYBILS = 40
TEN_YEARS = 10 * 365 * 24 * 3600.0


def _now_ms() -> int:
    return int(time.time() * 1000)


def _throwaway() -> Speaker:
    return Speaker.of(Identity.generate(), Libp2pKey.generate())


def _announcement(task_id: str, identity: Identity, peer_id: str) -> PeerAnnouncement:
    return PeerAnnouncement(
        task_id=task_id, peer_id=peer_id, public_key=identity.public_key_hex,
        devices=(DeviceInfo(kind="cpu", name="sybil", memory_mb=1024),), throughput_milli=100_000,
        affinity=Affinity(host_id="5b" * 8, network_id="5b" * 8), cohort_id="auto", timestamp=_now_ms(),
    )  # fmt: skip


def _own_certificate(task_id: str, who: Speaker) -> bytes:
    now = _now_ms()
    certificate = MembershipCertificate(
        task_id=task_id, member_key=who.public_key_hex, peer_id=who.peer_id, serial=1, policy="open",
        issued_ms=now, expires_ms=now + 3600_000,
    )  # fmt: skip
    return seal(certificate, who.identity)


def sybil_roster(node) -> Callable[[], None]:
    task_id = node.spec.record.task_id
    sybils = [_throwaway() for _ in range(SYBILS)]

    def once() -> None:
        for who in sybils:
            entry = [
                seal(_announcement(task_id, who.identity, who.peer_id), who.identity),
                sealed_binding(who),
                _own_certificate(task_id, who),
            ]
            store(node.dht, peers_key(task_id), entry, ANNOUNCE_TTL, subkey=who.public_key_hex, wait=False)

    return once


def _honest_ids(node) -> list[str]:
    return [
        p.entry.peer_id for p in read_roster(node.dht, node.spec.record) if p.entry.peer_id != node.peer_id
    ]


def forged_departures(node) -> Callable[[], None]:
    task_id, forger = node.spec.record.task_id, _throwaway()

    def once() -> None:
        attempt = max(0, node.parts.commits.attempt)
        for victim in _honest_ids(node):
            for ahead in range(1, 4):
                notice = RoundCommit.model_construct(
                    task_id=task_id, attempt=attempt + ahead, peer_id=victim, public_key=forger.public_key_hex,
                    endorsement=forger.endorsement, ok=False, digest="", timestamp=_now_ms(), left=True, state="",
                    group="", outliers=(), proofs=(), checked=(), refused=(), checking=False,
                )  # fmt: skip
                store(
                    node.dht, commits_key(task_id, attempt + ahead), seal_unchecked(notice, forger.identity),
                    COMMIT_TTL, subkey=commit_subkey(attempt + ahead, forger.public_key_hex), wait=False,
                )  # fmt: skip

    return once


def forged_equivocation(node) -> None:
    """Every report it posts carries two different proofs it signed itself for a made-up group."""
    honest_post = peer.commit.boards.SignedCommitBoard.post
    identity, me = node.identity, node.peer_id

    def post(self, attempt, report, wait=True):
        group = group_tag(hashlib.sha256(b"never met %d" % attempt).digest()[:20])
        stories = tuple(
            ProofAttestation.signed(identity, group, me, proofs_digest(story)).to_token()
            for story in (b"one story", b"another story")
        )
        report = dataclasses.replace(report, proofs=(*report.proofs, *stories)[-16:])
        return honest_post(self, attempt, report, wait)

    peer.commit.boards.SignedCommitBoard.post = post


def throwaway_progress(node) -> Callable[[], None]:
    boards = [ProgressBoard(node.dht, node.spec.record.task_id, _throwaway()) for _ in range(2)]

    def once() -> None:
        for board in boards:
            board.publish(10**12, 64, 1.0, 1.0, "cohort-a", 10**12 - 1, wait=False)

    return once


def binding_hijack(node) -> Callable[[], None]:
    task_id = node.spec.record.task_id

    def once() -> None:
        for victim in _honest_ids(node):
            who = _throwaway()
            binding = IdentityBinding.model_construct(
                peer_id=victim,
                public_key=who.public_key_hex,
                endorsement=who.endorsement,
                timestamp=_now_ms(),
            )
            entry = [
                seal(_announcement(task_id, who.identity, victim), who.identity),
                seal_unchecked(binding, who.identity),
                _own_certificate(task_id, who),
            ]
            store(node.dht, peers_key(task_id), entry, ANNOUNCE_TTL, subkey=who.public_key_hex, wait=False)

    return once


def replayed_records(node) -> Callable[[], None]:
    task_id = node.spec.record.task_id

    def once() -> None:
        for key in (peers_key(task_id), progress_key(task_id)):
            for subkey, value in read_entries(node.dht, key).items():
                node.dht.store(key, value, get_dht_time() + TEN_YEARS, subkey=subkey, return_future=True)

    return once


_ATTACKS = {
    "sybil-roster": sybil_roster,
    "forged-departures": forged_departures,
    "throwaway-progress": throwaway_progress,
    "binding-hijack": binding_hijack,
    "replayed-records": replayed_records,
}


def start(fault: str, node) -> None:
    """Run ``fault`` beside ``node``'s honest work (a daemon thread; ``forged-equivocation`` changes
    what its reports carry instead)."""
    logger.info(f"red team: {fault} runs beside this peer's honest work")
    if fault == "forged-equivocation":
        forged_equivocation(node)
        return
    repeat_in_background(fault, _ATTACKS[fault](node), "forgeries")


def repeat_in_background(fault: str, once: Callable[[], None], what: str) -> None:
    """Call ``once`` every :data:`EVERY` seconds on a daemon thread, for as long as the peer runs
    (a failed call is logged; the next one comes)."""

    def loop() -> None:
        rounds = 0
        while True:
            try:
                once()
                rounds += 1
                if rounds in (1, 100):
                    logger.info(f"red team: {fault}: {rounds} round(s) of {what} sent")
            except Exception as e:  # the DHT or the channel refused or is busy: the next round
                logger.warning(f"red team: {fault}: {type(e).__name__}: {e}")
            time.sleep(EVERY)

    threading.Thread(target=loop, name=f"red-team-{fault}", daemon=True).start()
