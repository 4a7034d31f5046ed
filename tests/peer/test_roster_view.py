"""A peer's roster merges its reads: a read that misses a live member (a node of the lookup did not
answer in time) does not drop it, and only expiry, a newer announcement or a withdrawal removes one;
on real DHT nodes a member's withdrawal shows at once."""

from __future__ import annotations

import time

from hivemind_adapter.dht import peer_id
from peer.roster_view import LiveAnnouncement, RosterView, read_announcements, read_roster
from protocol.identity import Identity
from protocol.record_lifetimes import ANNOUNCE_TTL, EXPIRY_SLACK_SECONDS
from protocol.records import Affinity, DeviceInfo, PeerAnnouncement
from tests.helpers import announced_member, two_task_dhts, wait_until
from tests.protocol.factories import TASK, task_spec

DEVICES = (DeviceInfo(kind="cpu", name="test cpu", memory_mb=1024),)
AFFINITY = Affinity(host_id="ab" * 8, network_id="cd" * 8)
SPEC = task_spec(Identity.generate())


def _live(name: str, signed: float, available: bool = True, lives: float = ANNOUNCE_TTL) -> LiveAnnouncement:
    record = PeerAnnouncement(
        task_id=TASK, peer_id=f"12D3KooW{name * 44}"[:52], public_key=name * 64, devices=DEVICES,
        throughput_milli=1000 if available else 0, affinity=AFFINITY, cohort_id="auto",
        timestamp=int(signed * 1000),
    )  # fmt: skip
    return LiveAnnouncement(record, len(DEVICES), signed + lives)


def _keys(roster) -> list[str]:
    return [p.announcement.public_key[0] for p in roster]


def test_a_read_that_misses_a_live_member_keeps_it_until_its_announcement_expires():
    view, t = RosterView(None, SPEC), time.time()
    a, b = _live("a", t), _live("b", t)
    assert _keys(view.merge({"a" * 64: a, "b" * 64: b}, frozenset(), t)) == ["a", "b"]
    # the next read reached only the node holding a's refresh: b's announcement still lives
    a_again = _live("a", t + 3)
    assert _keys(view.merge({"a" * 64: a_again}, frozenset(), t + 3)) == ["a", "b"]
    # b was never refreshed: gone once its announcement expired, read or not
    assert _keys(view.merge({}, frozenset(), t + ANNOUNCE_TTL + 1)) == ["a"]
    assert _keys(view.merge({}, frozenset(), t + 3 + ANNOUNCE_TTL + 1)) == []


def test_a_newer_withdrawal_removes_a_member_and_an_older_copy_does_not_bring_it_back():
    view, t = RosterView(None, SPEC), time.time()
    a, b = _live("a", t), _live("b", t)
    view.merge({"a" * 64: a, "b" * 64: b}, frozenset(), t)
    withdrawn = _live("b", t + 1, available=False)
    assert _keys(view.merge({"b" * 64: withdrawn}, frozenset(), t + 1)) == ["a"]
    # a node that had not taken the withdrawal yet answers the next read with b's older copy
    assert _keys(view.merge({"a" * 64: a, "b" * 64: b}, frozenset(), t + 2)) == ["a"]
    # an aggregator's withdrawal of a's key removes it whatever its announcements say
    assert _keys(view.merge({"a" * 64: _live("a", t + 3)}, frozenset({"a" * 64}), t + 3)) == []


def test_on_real_nodes_the_view_is_the_read_and_a_withdrawal_shows_at_once():
    aggregator = Identity.generate()
    spec = task_spec(aggregator)
    with two_task_dhts(TASK) as (first, second):
        announcers = [announced_member(dht, aggregator, TASK) for dht in (first, second)]
        view = RosterView(first, spec)
        both = sorted([peer_id(first), peer_id(second)])
        wait_until(lambda: [p.entry.peer_id for p in view.read()] == both, 15, "both members in the view")
        assert [p.entry.peer_id for p in read_roster(first, spec)] == both
        signed_at = time.time()
        for live in read_announcements(first, spec).values():  # the DHT's expiration, within the signed one
            assert live.expires <= live.announcement.timestamp / 1000 + ANNOUNCE_TTL + EXPIRY_SLACK_SECONDS
            assert live.expires > signed_at
        assert announcers[1].announce(available=False)
        wait_until(lambda: view.peer_ids() == [peer_id(first)], 10, "the withdrawn member to leave the view")
        assert view.keys(max_age=60) == {peer_id(first): announcers[0].identity.public_key_hex}
