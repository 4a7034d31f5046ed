"""What one read of the commit board and of the progress board costs a peer, under four layouts.

A real hivemind DHT (two nodes, one writes, the other reads) holds what a swarm of N peers leaves
there: every peer's signed progress record, and its signed commit report for each of the last
``--attempts`` attempts (the board's TTL keeps about that many). hivemind's DHT process runs the
record validator on every entry of every lookup's answer, so a read costs signature checks there as
well as in the peer. Each read is timed every way in the same run, on the same entries:

- checked: all attempts' reports under one key, every entry checked at every read, by the peer and by
  its DHT process;
- one key: the same, but the peer verifies each entry once (:mod:`protocol.verified_records`) and
  skips other attempts' reports by subkey;
- buckets, DHT re-checks: the board spread over ``COMMIT_BUCKETS`` keys by attempt (a read fetches
  about one attempt's reports), the DHT process still checking every entry it is handed;
- now: buckets, and the validator keeps its verdicts, so the DHT process checks each entry once (the
  board as peers use it).

The one-key layout is stored under a key of its own, which the bench's validator checks as well.
Prints, per N, the median milliseconds of the read a peer repeats while it waits for a quorum (one
attempt's reports) each way and the ratios, what finding the newest attempt costs (once a round),
how many signature checks a repeated read needs (in the peer, and in the DHT process), and the
progress board's read, checked and now.

    python -m benchmarks.board_reads_bench [--peers 8 16 32 64] [--attempts 18] [--reads 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from functools import partial

from hivemind_adapter.runtime import prepare_process

prepare_process()

from hivemind_adapter.dht import (  # noqa: E402
    dht_time,
    read_entries,
    record_validator_counts,
    speaker,
    start_dht,
    visible_maddrs,
)
from peer.commit.boards import SignedCommitBoard  # noqa: E402
from peer.swarm_view import ProgressBoard  # noqa: E402
from protocol.dht_schema import (  # noqa: E402
    MantaRecordValidator,
    commit_subkey,
    commits_key,
    dht_key_id,
    open_commit_value,
    open_progress_value,
    progress_key,
)
from protocol.identity import Identity  # noqa: E402
from protocol.peer_keys import Libp2pKey, Speaker  # noqa: E402
from protocol.records import PeerProgress, RoundCommit  # noqa: E402
from protocol.sealing import seal  # noqa: E402
from protocol.verified_records import DEFAULT_CAPACITY, VerifiedRecords  # noqa: E402

TASK = "board-bench"
ONE_KEY = f"manta_{TASK}_commits"  # the one-key layout's key (no buckets)


class _WithOneKey(MantaRecordValidator):
    """MANTA's validator, also checking the one-key layout's board."""

    def __init__(self, task_id: str, cache_capacity: int = DEFAULT_CAPACITY):
        super().__init__(task_id, cache_capacity)
        self._checks[dht_key_id(ONE_KEY)] = (ONE_KEY, partial(open_commit_value, task_id))

    def __reduce__(self):
        return (_WithOneKey, (self.task_id, self.cache_capacity))


def _fill(dht, peers: int, attempts: int) -> None:
    """Store what ``peers`` peers leave on both boards after ``attempts`` attempts."""
    now = int(time.time() * 1000)
    for _ in range(peers):
        me = Identity.generate()
        who = Speaker.of(me, Libp2pKey.generate())
        pid, endorsement = who.peer_id, who.endorsement
        for a in range(attempts):
            commit = RoundCommit(
                task_id=TASK, attempt=a, peer_id=pid, public_key=me.public_key_hex,
                endorsement=endorsement, ok=True,
                digest="ab" * 32, timestamp=now, left=False,
            )  # fmt: skip
            for key in (ONE_KEY, commits_key(TASK, a)):
                dht.store(key, seal(commit, me), dht_time() + 600, subkey=commit_subkey(a, me.public_key_hex))
        progress = PeerProgress(
            task_id=TASK, peer_id=pid, public_key=me.public_key_hex, endorsement=endorsement,
            round=attempts, samples=64,
            throughput_milli=50_000, loss_micro=1_000_000, cohort_id="host-a", state_round=attempts,
            timestamp=now, finished_round=attempts - 1, finished_samples=64, finished_loss_micro=1_000_000,
        )  # fmt: skip
        dht.store(progress_key(TASK), seal(progress, me), dht_time() + 600, subkey=me.public_key_hex)


def _median_ms(fn, reads: int) -> float:
    times = []
    for _ in range(reads):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def _open_all(entries: dict, opener) -> int:
    ok = 0
    for sub, value in entries.items():
        try:
            opener(TASK, sub, value)
            ok += 1
        except Exception:  # noqa: BLE001 - a bad entry is skipped, as the boards do
            continue
    return ok


def _one_key_read(dht, attempt: int, cache: VerifiedRecords) -> int:
    """One attempt's reports as the board read them from a single key: every attempt's entries
    fetched, the others skipped by subkey, the rest verified once."""
    ok = 0
    for sub, value in read_entries(dht, ONE_KEY).items():
        if sub.startswith(f"{attempt}/"):
            cache.open(sub, value)
            ok += 1
    return ok


def _one_key_latest(dht, cache: VerifiedRecords) -> int:
    return max(cache.open(sub, value).record.attempt for sub, value in read_entries(dht, ONE_KEY).items())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peers", type=int, nargs="+", default=[8, 16, 32, 64])
    ap.add_argument("--attempts", type=int, default=18, help="attempts whose reports are on the board")
    ap.add_argument("--reads", type=int, default=20)
    args = ap.parse_args()
    print(f"command: python -m benchmarks.board_reads_bench {' '.join(os.sys.argv[1:])}".rstrip())
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores")
    header = (
        f"{'peers':>5} | {'attempt read ms: checked':>24} {'one key':>7} {'buckets':>7} {'now':>6} "
        f"{'vs checked':>10} {'vs one key':>10} | {'checks/read: peer':>17} {'DHT':>9} | "
        f"{'newest attempt ms: one key':>26} {'now':>6} | {'progress ms: checked':>20} {'now':>6} {'ratio':>6}"
    )
    print(header)
    print("-" * len(header))
    for n in args.peers:
        print(_row(n, args.attempts, args.reads), flush=True)


def _row(n: int, attempts: int, reads: int) -> str:
    """One table row: both boards of an ``n``-peer swarm, read ``reads`` times each way."""
    writer = start_dht(host_maddrs=["/ip4/127.0.0.1/tcp/0"], validators=[_WithOneKey(TASK)])
    # Two readers: one whose DHT process re-checks every entry it is handed (the first three
    # layouts), one that keeps verdicts ("now").
    old, new = (
        start_dht(
            initial_peers=visible_maddrs(writer),
            host_maddrs=["/ip4/127.0.0.1/tcp/0"],
            validators=[_WithOneKey(TASK, cache_capacity=capacity)],
        )
        for capacity in (0, DEFAULT_CAPACITY)
    )
    try:
        _fill(writer, n, attempts)
        me = Identity.generate()
        old_board = SignedCommitBoard(old, TASK, speaker(old, me))
        commits = SignedCommitBoard(new, TASK, speaker(new, me))
        progress = ProgressBoard(new, TASK, speaker(new, me))
        one_key = VerifiedRecords(lambda sub, value: open_commit_value(TASK, sub, value))
        attempt = attempts - 1
        assert len(commits.read(attempt)) == n and len(progress.read()) == n, "entries missing"
        assert _one_key_read(old, attempt, one_key) == n, "entries missing under the single key"
        assert commits.latest_attempt() == _one_key_latest(old, one_key) == attempt
        checked_c = _median_ms(lambda: _open_all(read_entries(old, ONE_KEY), open_commit_value), reads)
        one_key_c = _median_ms(lambda: _one_key_read(old, attempt, one_key), reads)
        buckets_c = _median_ms(lambda: old_board.read(attempt), reads)
        now_c = _median_ms(lambda: commits.read(attempt), reads)
        one_key_latest = _median_ms(lambda: _one_key_latest(old, one_key), reads)
        now_latest = _median_ms(commits.latest_attempt, reads)
        checked_p = _median_ms(
            lambda: _open_all(read_entries(old, progress_key(TASK)), open_progress_value), reads
        )
        now_p = _median_ms(lambda: progress.read(), reads)
        peer_checks = commits.verified.counts[0]
        dht_checks = record_validator_counts(new)[0]
        commits.read(attempt)
        peer_checks = commits.verified.counts[0] - peer_checks
        dht_checks = record_validator_counts(new)[0] - dht_checks
        return (
            f"{n:>5} | {checked_c:>24.1f} {one_key_c:>7.1f} {buckets_c:>7.1f} {now_c:>6.1f} "
            f"{checked_c / now_c:>9.1f}x {one_key_c / now_c:>9.1f}x | "
            f"{f'{n * attempts} -> {peer_checks}':>17} {f'{n * attempts} -> {dht_checks}':>9} | "
            f"{one_key_latest:>26.1f} {now_latest:>6.1f} | {checked_p:>20.1f} {now_p:>6.1f} {checked_p / now_p:>5.1f}x"
        )  # fmt: skip
    finally:
        for dht in (new, old, writer):
            dht.shutdown()


if __name__ == "__main__":
    main()
