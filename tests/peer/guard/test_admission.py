"""Which peers a peer's matchmaking admits, across roster reads that come back short."""

from __future__ import annotations

from peer.guard.admission import AdmissionMemory


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_peer_stays_admitted_through_short_reads_and_leaves_after_the_memory():
    clock = Clock()
    memory = AdmissionMemory(memory=60.0, clock=clock)
    assert memory.update({"me": "k0", "a": "k1", "b": "k2"}, "me") == {"me": "k0", "a": "k1", "b": "k2"}
    clock.now = 10.0
    assert memory.update({"me": "k0", "a": "k1"}, "me") is None  # b missing from one read: still admitted
    clock.now = 20.0
    assert memory.update({"a": "k1", "c": "k3"}, "me") is None  # incomplete (no "me"): c is not admitted
    clock.now = 65.0
    assert memory.update({"me": "k0", "a": "k1"}, "me") == {"me": "k0", "a": "k1"}  # b last read at 0


def test_a_key_read_later_replaces_the_one_read_before():
    memory = AdmissionMemory(clock=Clock())
    memory.update({"me": "k0", "a": "k1"}, "me")
    assert memory.update({"me": "k0", "a": "k9"}, "me") == {"me": "k0", "a": "k9"}


def test_nothing_is_admitted_before_a_complete_read():
    memory = AdmissionMemory(clock=Clock())
    assert memory.update({"a": "k1"}, "me") is None
    assert memory.update({}, "me") is None


def test_a_barred_peer_is_left_out_until_its_bar_ends():
    clock = Clock()
    memory = AdmissionMemory(clock=clock)
    roster = {"me": "k0", "a": "k1", "liar": "k2"}
    memory.update(roster, "me")
    memory.bar("liar", 60.0)
    assert memory.update(roster, "me") == {"me": "k0", "a": "k1"}
    assert memory.barred() == {"liar"}
    clock.now = 61.0
    assert memory.update(roster, "me") == roster


def test_a_bar_can_be_lifted_but_not_a_barred_key():
    memory = AdmissionMemory()
    read = {"QmHonestHead": "aa" * 32, "QmLiar": "bb" * 32, "QmSelf": "cc" * 32}
    memory.update(read, "QmSelf")
    memory.bar("QmHonestHead", 600)
    memory.bar("QmLiar", 600)
    memory.bar_key("bb" * 32)
    assert set(memory.update(read, "QmSelf")) == {"QmSelf"}
    memory.unbar("QmHonestHead")  # its refused averages carried another reducer's lie
    memory.unbar("QmLiar")  # a convicted key stays out whatever its peer id's bar says
    assert set(memory.update(read, "QmSelf")) == {"QmSelf", "QmHonestHead"}
    assert memory.barred() == {"QmLiar"}


def test_a_peer_refused_for_its_own_part_is_barred_briefly_and_longer_each_time():
    """A head refused only for its own part may carry its cohort's lie: 60 s, then 120, 240, ... up
    to the full bar, while it is refused again soon after each bar; a quiet spell starts it over."""
    clock = Clock()
    memory = AdmissionMemory(clock=clock)
    roster = {"me": "k0", "head": "k1"}
    memory.update(roster, "me")
    terms = []
    for _ in range(6):
        terms.append(memory.bar_again("head", 60.0, 600.0))
        assert memory.barred() == {"head"}
        assert memory.bar_again("head", 60.0, 600.0) == terms[-1]  # the same refusal again: no new bar
        clock.now += terms[-1] + 1.0  # met again a second after its bar ended, and refused again
    assert terms == [60.0, 120.0, 240.0, 480.0, 600.0, 600.0]
    assert memory.barred_for() == {}
    clock.now += 601.0  # admitted for longer than the longest bar: its record is forgotten
    assert memory.bar_again("head", 60.0, 600.0) == 60.0
    memory.unbar("head")  # its refusals were explained: nothing of them counts any more
    assert memory.bar_again("head", 60.0, 600.0) == 60.0
    assert memory.barred_for() == {"head": 60.0}
