"""Matchmaking under forged declarations: real DHT nodes running MANTA's validator, real averagers,
an attacker writing to the same DHT as hard as it can."""

from __future__ import annotations

import threading

import torch
from hivemind.utils import get_dht_time

from hivemind_adapter.allreduce import VerifiedAverager
from hivemind_adapter.dht import record_validator_rejections, speaker, start_dht, visible_maddrs
from hivemind_adapter.group_keys import DeclarationSigner
from protocol.declarations import AveragingDeclaration, declaration_subkey
from protocol.dht_schema import MantaRecordValidator
from protocol.identity import Identity
from protocol.peer_keys import Libp2pKey
from tests.helpers import wait_until
from tests.hivemind_adapter.averager_pair import LOOPBACK, PAIR_SETTINGS, step_all_at_once
from tests.protocol.factories import fake_peer_id, seal_unchecked

TASK = "keys-test"
PREFIX = f"{TASK}_cohort_a"
GROUP_KEY = f"{PREFIX}.0b"  # hivemind's key for a target group of two (no group bits)
STEP_TIMEOUT = 8.0  # four matchmaking periods
FAKES = 12


def _forge(attacker_dht, victims: list[str], stop: threading.Event, signed_by: Identity | None) -> None:
    """Until ``stop``: withdraw every victim's declaration in its name (an expiry later than any it
    uses, so the DHT keeps the forgery) and declare peers that do not exist as leaders. Unsigned
    (hivemind's form) or sealed by the attacker's own MANTA key."""
    fakes = [fake_peer_id(bytes([i]) * 8) for i in range(FAKES)]
    own_libp2p_key = Libp2pKey.generate()  # the attacker's: it endorses the attacker's MANTA key only
    while not stop.is_set():
        now = get_dht_time()
        for peer_id, looking, expiry in [(v, False, now + 30) for v in victims] + [
            (f, True, now + 1.0) for f in fakes
        ]:
            if signed_by is None:
                subkey, value = peer_id_bytes(peer_id), looking
            else:
                subkey = declaration_subkey(peer_id, signed_by.public_key_hex)
                value = seal_unchecked(
                    AveragingDeclaration.model_construct(
                        task_id=TASK, group_key=GROUP_KEY, peer_id=peer_id, public_key=signed_by.public_key_hex,
                        endorsement=own_libp2p_key.endorse(signed_by.public_key),
                        looking=looking, expiration_ms=int(round(expiry * 1000)),
                    ),
                    signed_by,
                )  # fmt: skip
            attacker_dht.store(GROUP_KEY, value, expiry, subkey=subkey, return_future=True)
        stop.wait(0.3)


def _entries(dht, key: str) -> int:
    """How many entries a read of ``key`` through ``dht`` returns (after its validator)."""
    found = dht.get(key, latest=True)
    return len(found.value) if found is not None and isinstance(found.value, dict) else 0


def _refused(dhts) -> int:
    """Declarations the validators of ``dhts`` refused so far."""
    return sum(
        n
        for dht in dhts
        for label, n in record_validator_rejections(dht).items()
        if label.startswith("group_key")
    )


def _matchmade_step(_: int, averager: VerifiedAverager) -> object:
    return averager.step(timeout=STEP_TIMEOUT, allow_retries=False)


def peer_id_bytes(peer_id: str) -> bytes:
    from hivemind.p2p import PeerID

    return PeerID.from_base58(peer_id).to_bytes()


def _pair_under_attack(defended: bool) -> tuple[list[object], list[dict[str, int]], list[str]]:
    """Two honest averagers (and, defended, a third that signs properly but is not in their roster: a
    Sybil) step once while an attacker forges declarations; returns each step's outcome (gathered
    metadata or the exception), what each honest node's validator refused (defended only), and the
    averagers' peer ids."""
    validators = [MantaRecordValidator(TASK)] if defended else []
    members = 3 if defended else 2
    honest = [Identity.generate() for _ in range(members)]
    dhts = [start_dht(host_maddrs=LOOPBACK, validators=validators)]
    for _ in range(members - 1):
        dhts.append(
            start_dht(host_maddrs=LOOPBACK, initial_peers=visible_maddrs(dhts[0]), validators=validators)
        )
    attacker = start_dht(host_maddrs=LOOPBACK, initial_peers=visible_maddrs(dhts[0]))
    averagers: list[VerifiedAverager] = []
    stop = threading.Event()
    try:
        for dht, identity in zip(dhts, honest):
            signer = DeclarationSigner(TASK, speaker(dht, identity)) if defended else None
            averagers.append(
                VerifiedAverager([torch.ones(64)], dht, prefix=PREFIX, declarations=signer, **PAIR_SETTINGS)
            )
        peer_ids = [a.peer_id.to_base58() for a in averagers]
        roster = {p: i.public_key_hex for p, i in zip(peer_ids[:2], honest)}  # not the Sybil's
        if defended:
            for averager in averagers:
                averager.set_admitted(roster)
        forger = threading.Thread(
            target=_forge,
            args=(attacker, list(roster), stop, Identity.generate() if defended else None),
            daemon=True,
        )
        forger.start()
        if defended:  # the forgeries reach the honest nodes (and are refused there) before anyone declares
            wait_until(lambda: _refused(dhts[:2]) >= FAKES, 30, "the honest nodes to refuse forgeries")
        else:  # the forgeries are in place, as an honest node reads them, before anyone declares
            wait_until(lambda: _entries(dhts[0], GROUP_KEY) >= FAKES, 30, "the forged declarations")
        outcomes = step_all_at_once(averagers, _matchmade_step, 3 * STEP_TIMEOUT)
        refusals = [record_validator_rejections(dht) for dht in dhts] if defended else []
        return outcomes, refusals, peer_ids
    finally:
        stop.set()
        for averager in averagers:
            averager.shutdown()
        attacker.shutdown()
        for dht in reversed(dhts):
            dht.shutdown()


def test_forged_withdrawals_keep_plain_hivemind_peers_apart():
    """The attack is real: with hivemind's unsigned declarations, withdrawals forged in the honest
    peers' names hide them from each other, and neither finds a group within five periods."""
    outcomes, _, _ = _pair_under_attack(defended=False)
    assert all(isinstance(o, Exception) for o in outcomes), outcomes


def test_signed_declarations_meet_despite_forgeries():
    """With signed declarations read through the roster, the same attacker (now signing with its own
    key, since nodes refuse unsigned ones) cannot hide the honest peers or lure them to fake leaders,
    and a Sybil outside the roster cannot join them."""
    outcomes, refusals, peer_ids = _pair_under_attack(defended=True)
    assert not any(isinstance(o, Exception) for o in outcomes[:2]), outcomes
    for outcome in outcomes[:2]:  # they met each other, and nobody else
        assert sorted(str(p) for p in outcome) == sorted(peer_ids[:2]), outcome
    assert isinstance(outcomes[2], Exception), outcomes  # the Sybil found no group
    # what kept them apart before never reached them: their DHT nodes refused it (a withdrawal or a
    # leader in a peer id's name carries no endorsement of that peer id's libp2p key)
    assert all(sum(r.values()) > 0 for r in refusals[:2]), refusals


def _joins_a_group_with_a_sybil(follower_checks: bool) -> tuple[object, dict[str, int], str]:
    """A leader in the roster that admits anyone (a dishonest one) gathers a Sybil outside the roster
    and an honest follower; returns the follower's step outcome, its admission refusals and the
    Sybil's peer id. Both followers are in client mode, so the dishonest peer is the only leader."""
    validators = [MantaRecordValidator(TASK)]
    dhts = [start_dht(host_maddrs=LOOPBACK, validators=validators)]
    for _ in range(2):
        dhts.append(
            start_dht(host_maddrs=LOOPBACK, initial_peers=visible_maddrs(dhts[0]), validators=validators)
        )
    identities = [Identity.generate() for _ in range(3)]  # leader, Sybil, honest follower
    settings = {**PAIR_SETTINGS, "target_group_size": 3, "min_group_size": 3}
    averagers: list[VerifiedAverager] = []
    try:
        for i, (dht, identity) in enumerate(zip(dhts, identities)):
            signer = DeclarationSigner(TASK, speaker(dht, identity))
            averagers.append(
                VerifiedAverager(
                    [torch.ones(64)], dht, prefix=PREFIX, declarations=signer, client_mode=i > 0, **settings
                )
            )
        leader, sybil, follower = (a.peer_id.to_base58() for a in averagers)
        if follower_checks:  # the roster holds the leader and the follower, not the Sybil
            averagers[2].set_admitted(
                {p: identities[i].public_key_hex for i, p in ((0, leader), (2, follower))}
            )
        outcomes = step_all_at_once(averagers, _matchmade_step, 3 * STEP_TIMEOUT)
        return outcomes[2], averagers[2].admission_refusals(), sybil
    finally:
        for averager in averagers:
            averager.shutdown()
        for dht in reversed(dhts):
            dht.shutdown()


def test_a_follower_leaves_a_leader_whose_group_holds_a_peer_outside_the_roster():
    """A dishonest leader cannot fill a group with peers of its own making (enough of them would
    outvote the honest members of a robust all-reduce): without the follower's check the honest
    follower averages with the Sybil; with it, it refuses the group and applies nothing of it."""
    joined, _, sybil = _joins_a_group_with_a_sybil(follower_checks=False)
    assert not isinstance(joined, Exception), joined
    assert sybil in {str(p) for p in joined}, joined  # the attack is real: the Sybil was in its group
    refused, refusals, _ = _joins_a_group_with_a_sybil(follower_checks=True)
    assert isinstance(refused, Exception), refused
    assert refusals.get("group_not_in_roster", 0) >= 1, refusals
