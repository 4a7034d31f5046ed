"""The cohort directory end to end: an aggregator signs it from the members' real announcements and
serves its pages; a peer reads its cohort and the roster's size from one header key and one page,
checked, and switches epochs at the attempt the directory names. Real DHT nodes, real endpoints."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import NamedTuple

import pytest

from aggregator.board_reads import AnnouncementReader
from aggregator.cohort_directory import LEAD_ATTEMPTS, MIN_EPOCH_SECONDS, DirectoryPublisher
from hivemind_adapter.dht import peer_id, speaker, store
from hivemind_adapter.p2p import Endpoint
from peer.directory_plan import NotListedYet, plan_from_directory
from peer.directory_view import DirectoryUnavailable, DirectoryView
from protocol.cohort_assignment import RosterEntry, assign_cohorts
from protocol.cohort_directory import CohortDirectory, DirectoryHeader, DirectoryMember
from protocol.dht_schema import directory_key, peers_key
from protocol.identity import Identity
from protocol.record_lifetimes import ANNOUNCE_TTL, DIRECTORY_TTL
from protocol.records import Affinity, DeviceInfo, PeerAnnouncement
from protocol.sealing import seal
from protocol.task_spec import TaskSpec
from tests.helpers import two_task_dhts
from tests.protocol.factories import (
    ADMITTING_AGGREGATOR,
    TASK,
    certificate_wire,
    now_ms,
    speaker_binding_wire,
    speaker_of,
    task_spec,
)

HOST, OTHER_HOST = "a1" * 8, "b2" * 8


class _Desk(NamedTuple):
    """An aggregator's directory publisher and a peer's view of it, on two DHT nodes of TASK."""

    task: TaskSpec
    publisher: DirectoryPublisher
    view: DirectoryView
    desk_dht: object
    peer_dht: object
    peer_end: Endpoint


@contextlib.contextmanager
def _published(newest_attempt: Callable[[], int]) -> Iterator[_Desk]:
    """A :class:`_Desk` whose publisher knows the swarm's newest attempt from ``newest_attempt``
    (cohorts of at most 4); stopped and closed at the end."""
    task = task_spec(ADMITTING_AGGREGATOR)
    with two_task_dhts(TASK) as (desk_dht, peer_dht):
        desk_end, peer_end = Endpoint(desk_dht, "desk"), Endpoint(peer_dht, "peer")
        reader = AnnouncementReader(desk_dht, TASK, frozenset(task.aggregator_keys))
        publisher = DirectoryPublisher(
            desk_dht, desk_end, ADMITTING_AGGREGATOR, task,
            lambda: [e.announcement.record for e in reader.read()], newest_attempt,
        )  # fmt: skip
        view = DirectoryView(peer_dht, peer_end, task, peer_id(peer_dht), lambda key: peer_id(desk_dht))
        try:
            yield _Desk(task, publisher, view, desk_dht, peer_dht, peer_end)
        finally:
            publisher.stop()
            desk_end.close()
            peer_end.close()


def _same(header: DirectoryHeader, other: DirectoryHeader) -> bool:
    """One directory, whenever each copy of its header was signed."""
    return header.model_copy(update={"timestamp": 0}) == other.model_copy(update={"timestamp": 0})


def _announce(dht, identity: Identity, host: str, network: str, *, as_dht=None) -> str:
    """``identity`` announced as a member on ``host`` (under ``as_dht``'s peer id, else its test one)."""
    who = speaker(as_dht, identity) if as_dht is not None else speaker_of(identity)
    record = PeerAnnouncement(
        task_id=TASK, peer_id=who.peer_id, public_key=identity.public_key_hex,
        devices=(DeviceInfo(kind="cpu", name="test cpu", memory_mb=1024),), throughput_milli=100_000,
        affinity=Affinity(host_id=host, network_id=network), cohort_id="auto", timestamp=now_ms(),
    )  # fmt: skip
    value = [
        seal(record, identity),
        speaker_binding_wire(who),
        certificate_wire(identity, peer_id=who.peer_id),
    ]
    assert store(dht, peers_key(TASK), value, ttl=ANNOUNCE_TTL, subkey=identity.public_key_hex)
    return who.peer_id


def test_a_peer_reads_its_checked_cohort_and_roster_size_and_switches_epoch_at_the_named_attempt():
    attempt = {"newest": -1}
    with _published(lambda: attempt["newest"]) as (task, publisher, view, desk_dht, peer_dht, peer_end):
        me = Identity.generate()
        # this peer and four more share a host (5 > 4: two parts); one is alone on its network
        mine = _announce(peer_dht, me, HOST, "e1", as_dht=peer_dht)
        others = [Identity.generate() for _ in range(5)]
        ids = [
            _announce(peer_dht, o, HOST if i < 4 else OTHER_HOST, f"{i:02x}") for i, o in enumerate(others)
        ]
        with pytest.raises(DirectoryUnavailable, match="no cohort directory governs attempt 0 yet"):
            view.own_cohort(0)
        assert publisher.tick(now=0.0) is None  # members read once: not yet settled
        first = publisher.tick(now=0.0)
        assert first is not None and (first.size, first.first_attempt) == (6, LEAD_ATTEMPTS - 1)
        roster = [RosterEntry(mine, HOST, "e1", None)] + [
            RosterEntry(p, HOST if i < 4 else OTHER_HOST, f"{i:02x}", None) for i, p in enumerate(ids)
        ]
        expected = assign_cohorts(roster, task.params.max_group_size)
        assert len(set(expected.values())) == 3  # the host's two parts and the lone peer
        view.headers(fresh=True)
        own = view.own_cohort(5)
        assert _same(own.header, first) and own.page.cohort == expected[mine]
        assert {m.peer_id for m in own.page.members} == {
            p for p, c in expected.items() if c == expected[mine]
        }
        lone = view.cohort(own.signer, own.header, expected[ids[4]])
        assert [m.peer_id for m in lone.page.members] == [ids[4]]

        # a seventh member: a new epoch, but not sooner than MIN_EPOCH_SECONDS after the last
        _announce(peer_dht, Identity.generate(), OTHER_HOST, "e9")
        assert publisher.tick(now=MIN_EPOCH_SECONDS / 2) is None
        attempt["newest"] = 7
        second = publisher.tick(now=MIN_EPOCH_SECONDS)
        assert second is not None and second.epoch > first.epoch and second.size == 7
        assert second.first_attempt == 7 + LEAD_ATTEMPTS
        view.headers(fresh=True)
        signer, governs = view.governing(7 + LEAD_ATTEMPTS - 1)
        assert signer == own.signer and _same(governs, first)  # the attempt under way
        assert _same(view.own_cohort(7 + LEAD_ATTEMPTS).header, second)
        # a peer that reads the headers only now: the DHT holds the newest (the second); it asks
        # the aggregator for the first, which still governs the attempt under way
        newcomer = DirectoryView(peer_dht, peer_end, task, peer_id(peer_dht), lambda key: peer_id(desk_dht))
        signer, governs = newcomer.governing(7 + LEAD_ATTEMPTS - 1)
        assert signer == own.signer and _same(governs, first)

        # an eighth member: no new epoch until the swarm runs the second one's first attempt (the
        # attempt before it ended); then one from the attempt after that
        _announce(peer_dht, Identity.generate(), OTHER_HOST, "e8")
        assert publisher.tick(now=2 * MIN_EPOCH_SECONDS) is None
        assert publisher.tick(now=2 * MIN_EPOCH_SECONDS) is None
        attempt["newest"] = 7 + LEAD_ATTEMPTS - 2
        assert publisher.tick(now=2 * MIN_EPOCH_SECONDS) is None
        attempt["newest"] = 7 + LEAD_ATTEMPTS - 1
        third = publisher.tick(now=2 * MIN_EPOCH_SECONDS)
        assert third is not None and third.first_attempt == 7 + LEAD_ATTEMPTS + 1 and third.size == 8


def test_a_directory_signed_by_a_key_that_is_no_aggregator_of_the_task_governs_nothing():
    sybil = Identity.generate()
    with _published(lambda: -1) as (task, publisher, view, desk_dht, peer_dht, peer_end):
        me = Identity.generate()
        _announce(peer_dht, me, HOST, "e1", as_dht=peer_dht)
        publisher.tick(now=0.0)
        real = publisher.tick(now=0.0)
        # the sybil's directory: the same peer alone in a cohort of its naming, a later epoch
        forged = CohortDirectory(
            TASK,
            real.epoch + 1,
            0,
            {"sybil-cohort": [DirectoryMember(peer_id(peer_dht), me.public_key_hex)]},
        )
        wire = seal(forged.header(timestamp=now_ms()), sybil)
        store(peer_dht, directory_key(TASK), wire, ttl=DIRECTORY_TTL, subkey=sybil.public_key_hex)
        assert set(view.headers(fresh=True)) == {ADMITTING_AGGREGATOR.public_key_hex}
        own = view.own_cohort(3)
        assert _same(own.header, real) and own.page.cohort != "sybil-cohort"


def test_a_round_plans_from_the_whole_directory_and_a_peer_it_does_not_list_waits():
    """Every page read in leaf order gives the plan the roster's own assignment would (the same
    cohorts, ranks and members); a peer no page lists is told to wait; a directory whose signer
    stopped re-signing plans nothing; an epoch first published mid-run governs ahead of it."""
    attempt = {"newest": -1}
    with _published(lambda: attempt["newest"]) as (task, publisher, view, desk_dht, peer_dht, peer_end):
        mine = _announce(peer_dht, Identity.generate(), HOST, "e1", as_dht=peer_dht)
        hosts = [HOST] * 4 + [OTHER_HOST] * 2
        ids = [_announce(peer_dht, Identity.generate(), h, f"{i:02x}") for i, h in enumerate(hosts)]
        # a header its aggregator last signed its lifetime ago (the DHT drops it then; this peer
        # still holds it): nothing to plan from
        stale = CohortDirectory(TASK, 1, 0, {"a": [DirectoryMember(mine, "ab" * 32)]})
        signed = now_ms() - int((DIRECTORY_TTL - 2) * 1000)
        wire = seal(stale.header(timestamp=signed), ADMITTING_AGGREGATOR)
        assert store(peer_dht, directory_key(TASK), wire, ttl=1, subkey=ADMITTING_AGGREGATOR.public_key_hex)
        view.headers(fresh=True)
        assert view.governing(0)[1].epoch == stale.epoch
        time.sleep(max(0.0, signed / 1000 + DIRECTORY_TTL + 0.5 - time.time()))
        assert view.whole(0) is None

        attempt["newest"] = 7  # the swarm ran attempts before the aggregator's first epoch
        publisher.tick(now=0.0)
        header = publisher.tick(now=0.0)
        assert header is not None and header.first_attempt == 7 + LEAD_ATTEMPTS
        view.headers(fresh=True)
        assert view.whole(7 + LEAD_ATTEMPTS - 1) is None  # nothing governs the attempt under way
        whole = view.whole(7 + LEAD_ATTEMPTS)
        assert whole is not None and len(whole.pages) == header.cohorts == 3
        assert set(whole.keys()) == {mine, *ids} and view.member_keys() == whole.keys()
        # a round no directory governs plans from its roster, and admits the roster's keys
        assert view.whole(7 + LEAD_ATTEMPTS - 1) is None and view.member_keys() == {}
        assert view.whole(7 + LEAD_ATTEMPTS) is whole and view.member_keys() == whole.keys()

        roster = [RosterEntry(mine, HOST, "e1", None)] + [
            RosterEntry(p, h, f"{i:02x}", None) for i, (p, h) in enumerate(zip(ids, hosts))
        ]
        assigned = assign_cohorts(roster, task.params.max_group_size)
        names = sorted(set(assigned.values()))
        plan = plan_from_directory(whole, mine, 4, 7 + LEAD_ATTEMPTS)
        assert (plan.cohort, plan.cohort_rank, plan.num_cohorts) == (
            assigned[mine],
            names.index(assigned[mine]),
            len(names),
        )
        assert plan.cohorts == tuple(tuple(sorted(p for p in assigned if assigned[p] == n)) for n in names)
        assert sorted(plan.roster) == sorted(assigned) and plan.cohort_size == len(
            plan.cohorts[plan.cohort_rank]
        )

        with pytest.raises(NotListedYet, match=f"no cohort of directory epoch {header.epoch}"):
            plan_from_directory(whole, "12D3KooWnewcomer", 4, 7 + LEAD_ATTEMPTS)
