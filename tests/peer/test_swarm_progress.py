"""What a peer reads of the swarm's progress on a real hivemind DHT: which round the others compute,
and which round they still work on once their computation is over and they average."""

from __future__ import annotations

import time

import pytest

from peer.swarm_progress import FRESH_MS, READ_EVERY, READ_EVERY_MAX, SwarmProgress
from peer.swarm_view import PROGRESS_TTL, ProgressBoard
from protocol.identity import Identity
from tests.helpers import progress_readers, wait_until
from tests.protocol.factories import speaker_of

TASK = "digits-progress-test"


@pytest.fixture
def two_peers():
    with progress_readers(TASK) as readers:
        yield readers


def test_a_round_the_others_average_is_still_theirs_after_their_last_compute_record(two_peers):
    """A newcomer decides from this whether the swarm is busy with the round it would join: averaging
    over slow links can take longer than a compute record stays fresh."""
    worker, newcomer = two_peers
    assert newcomer.swarm_round() == -1  # nobody has published anything
    worker.begin(6, "cohort-a", state_round=5)
    worker.look(32, 1.0)  # publishes at once: its first record of round 6
    wait_until(lambda: newcomer.swarm_round() == 6, 15, "the newcomer to see round 6 computed", poll=0.2)
    worker.finish(48, 2.0)  # its computation is over; outside averaging() it publishes nothing more
    finished = time.monotonic()
    time.sleep(FRESH_MS / 1000 + 0.6 - (time.monotonic() - finished))  # + one read interval
    assert newcomer.swarm_round() == -1, "a record older than FRESH_MS still shows computing"
    assert newcomer.swarm_round(fresh_ms=int(PROGRESS_TTL * 1000)) == 6
    assert worker.swarm_round(fresh_ms=int(PROGRESS_TTL * 1000)) == -1  # a peer's own record never counts


def test_a_peer_averaging_keeps_its_round_fresh_without_counting_as_computing(two_peers):
    """Averaging can take most of a round: meanwhile the peer republishes its final record, marked
    averaging, so a newcomer sees the round busy; a peer still computing the round counts that record's
    final samples and does not extrapolate them by its throughput. The republishing stops with it."""
    worker, reader = two_peers
    worker.begin(6, "cohort-a", state_round=5)
    worker.finish(48, 2.0)  # computed in a moment: its measured throughput is huge
    fresh_ms = 3000
    with worker.averaging(every=1.0):
        time.sleep(fresh_ms / 1000 + 1.0)
        wait_until(
            lambda: any(r.averaging for r in reader._read(max_age=0)), 10, "the averaging record", poll=0.2
        )
        assert reader.swarm_round(fresh_ms=fresh_ms, max_age=0) == 6
        reader.begin(6, "cohort-a", state_round=5)
        assert reader.look(16, 1.0).others == 48  # its final count; extrapolated it would reach the cap
    ended = time.monotonic()
    time.sleep(fresh_ms / 1000 + 1.0 - (time.monotonic() - ended))
    assert reader.swarm_round(fresh_ms=fresh_ms, max_age=0) == -1, "it still publishes after averaging"


def test_a_huge_sample_count_in_a_signed_record_cannot_end_the_round_for_everyone(two_peers):
    """A record's count is its peer's word: it counts for at most half the target until the peer has
    committed rounds, then for at most twice what those showed (plus two batches)."""
    honest, liar = two_peers
    honest.begin(6, "cohort-a", state_round=5)
    liar.begin(6, "cohort-a", state_round=5)
    liar.throughput = 100.0  # what it announces alongside
    liar.look(10**9, 1.0)  # published at once
    wait_until(lambda: honest.look(0, 0.0).others > 0, 15, "the honest peer to read the record", poll=0.2)
    estimate = honest.look(16, 1.0)
    assert estimate.others == honest.target / 2 and not honest.target_reached(estimate)
    honest.note_committed([(liar.peer_id, 40), (honest.peer_id, 60)])
    estimate = honest.look(16, 1.0)
    assert estimate.others == 2 * 40 + 2 * honest.batch_size and not honest.target_reached(estimate)


def test_a_liar_publishing_alone_while_the_others_average_is_not_the_swarms_round(two_peers):
    """While the honest peers are between rounds, their records go stale and a liar that keeps
    publishing a far-off round is the only fresh reporter: it must not make a reader believe it is
    behind the swarm. A peer that is the reader's only partner (on the board and in the roster)
    still counts alone."""
    honest, liar = two_peers
    me = speaker_of(Identity.generate())
    reader = SwarmProgress(ProgressBoard(honest.board.dht, TASK, me), me.peer_id, 16, 1, 256)
    liar.begin(10**9, "cohort-a", state_round=10**9 - 1)
    liar.look(32, 1.0)
    wait_until(lambda: reader.swarm_round() == 10**9, 15, "the reader to see the liar's record", poll=0.2)
    reader.roster_peers = 3  # the round's roster: the liar is not the reader's only partner
    assert reader.swarm_round() == -1  # its record is the only one on the board yet: a swarm's start
    reader.roster_peers = 2  # a swarm of two: nobody else can corroborate, and its partner's word stands
    assert reader.swarm_round() == 10**9
    honest.begin(6, "cohort-a", state_round=5)
    honest.look(32, 1.0)
    honest.finish(48, 2.0)  # now averaging: its record goes stale
    wait_until(
        lambda: honest.peer_id in {r.peer_id for r in reader._read()}, 15, "the honest record", poll=0.2
    )
    time.sleep(1.2)
    liar.look(64, 1.0)  # keeps publishing
    wait_until(
        lambda: any(r.peer_id == liar.peer_id and r.samples == 64 for r in reader._read()),
        15,
        "the liar's new record",
        poll=0.2,
    )
    assert reader.swarm_round(fresh_ms=1000) == -1  # the liar alone is fresh; the honest peer is on the board
    assert reader.swarm_round(fresh_ms=int(PROGRESS_TTL * 1000)) == 6  # both count: the second highest


def test_the_board_is_read_often_near_the_rounds_target_and_seldom_far_from_it(two_peers):
    """Each read fetches every peer's record: a peer reads as often as the round's end needs, every
    READ_EVERY s near the target, and at most every READ_EVERY_MAX s while the target is far off."""
    reader, _ = two_peers
    reads = []
    read = reader.board.read
    reader.board.read = lambda: reads.append(time.monotonic()) or read()  # the real read, counted
    reader.throughput = 16.0  # samples/s, as its last round measured; the target is 256

    def look_for(seconds: float, samples: int) -> int:
        reads.clear()
        reader.begin(3, "cohort-a", state_round=2)
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            reader.look(samples, 0.0)
            time.sleep(0.1)
        return len(reads)

    far = look_for(5.0, 16)  # 224 samples to go at 16 samples/s: 14 s away
    near = look_for(5.0, 224)  # one second away
    assert far <= 1 + 5.0 / READ_EVERY_MAX, far
    assert near >= 5.0 / READ_EVERY / 2 and near > 2 * far, (near, far)
