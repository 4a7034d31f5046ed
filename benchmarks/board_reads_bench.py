"""What one read of the commit board and of the progress board costs a peer, before and during issue 16.

A real hivemind DHT (two nodes, one writes, the other reads) holds what a swarm of N peers leaves
there: every peer's signed progress record, and its signed commit report for each of the last
``--attempts`` attempts (the board's TTL keeps about that many). Each read is timed every way in the
same run, on the same entries:

- checked: every entry opened and its Ed25519 signature checked at every read, all attempts' reports
  under one key (the boards before issue 16);
- one key: entries verified once (:mod:`hivemind_adapter.verified_records`), other attempts' reports
  skipped by their subkey, still all attempts under one key (the first step of issue 16; the same
  reports are stored under that key too, which the validator no longer knows and lets through);
- buckets: the board as it is now, spread over ``COMMIT_BUCKETS`` keys by attempt, so a read fetches
  about one attempt's reports.

Prints, per N, the median milliseconds of the read a peer repeats while it waits for a quorum (one
attempt's reports) each way and the ratios, what finding the newest attempt costs (once a round: one
key, or every bucket at once), how many signature checks a repeated read needs, and the progress
board's read, checked and cached.

    python -m benchmarks.board_reads_bench [--peers 8 16 32 64] [--attempts 18] [--reads 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from hivemind_adapter.runtime import prepare_process

prepare_process()

from hivemind_adapter.dht import dht_time, peer_id, read_entries, start_dht, visible_maddrs  # noqa: E402
from hivemind_adapter.verified_records import VerifiedRecords  # noqa: E402
from peer.swarm_view import ProgressBoard, SignedCommitBoard  # noqa: E402
from protocol.dht_schema import (  # noqa: E402
    MantaRecordValidator,
    commit_subkey,
    commits_key,
    open_commit_value,
    open_progress_value,
    progress_key,
)
from protocol.identity import Identity  # noqa: E402
from protocol.records import PeerProgress, RoundCommit, seal  # noqa: E402
from tests.protocol.factories import fake_peer_id  # noqa: E402

TASK = "board-bench"
ONE_KEY = f"manta_{TASK}_commits"  # the board's single key before it was spread over buckets


def _fill(dht, peers: int, attempts: int) -> None:
    """Store what ``peers`` peers leave on both boards after ``attempts`` attempts."""
    now = int(time.time() * 1000)
    for i in range(peers):
        me = Identity.generate()
        pid = fake_peer_id(b"bench-%d" % i)
        for a in range(attempts):
            commit = RoundCommit(
                task_id=TASK, attempt=a, peer_id=pid, public_key=me.public_key_hex, ok=True,
                digest="ab" * 32, timestamp=now, left=False,
            )  # fmt: skip
            for key in (ONE_KEY, commits_key(TASK, a)):
                dht.store(key, seal(commit, me), dht_time() + 600, subkey=commit_subkey(a, me.public_key_hex))
        progress = PeerProgress(
            task_id=TASK, peer_id=pid, public_key=me.public_key_hex, round=attempts, samples=64,
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
        f"{'peers':>5} | {'attempt read ms: checked':>24} {'one key':>7} {'buckets':>7} "
        f"{'vs checked':>10} {'vs one key':>10} {'checks/read':>12} | "
        f"{'newest attempt ms: one key':>26} {'buckets':>7} | {'progress ms: checked':>20} {'cached':>6}"
    )
    print(header)
    print("-" * len(header))
    for n in args.peers:
        print(_row(n, args.attempts, args.reads), flush=True)


def _row(n: int, attempts: int, reads: int) -> str:
    """One table row: both boards of an ``n``-peer swarm, read ``reads`` times each way."""
    validator = [MantaRecordValidator(TASK)]
    writer = start_dht(host_maddrs=["/ip4/127.0.0.1/tcp/0"], validators=validator)
    reader = start_dht(
        initial_peers=visible_maddrs(writer), host_maddrs=["/ip4/127.0.0.1/tcp/0"], validators=validator
    )
    try:
        _fill(writer, n, attempts)
        me = Identity.generate()
        commits = SignedCommitBoard(reader, TASK, me, peer_id(reader))
        progress = ProgressBoard(reader, TASK, me, peer_id(reader))
        one_key = VerifiedRecords(lambda sub, value: open_commit_value(TASK, sub, value))
        attempt = attempts - 1
        assert len(commits.read(attempt)) == n and len(progress.read()) == n, "entries missing"
        assert _one_key_read(reader, attempt, one_key) == n, "entries missing under the single key"
        assert commits.latest_attempt() == _one_key_latest(reader, one_key) == attempt
        checked_c = _median_ms(lambda: _open_all(read_entries(reader, ONE_KEY), open_commit_value), reads)
        one_key_c = _median_ms(lambda: _one_key_read(reader, attempt, one_key), reads)
        buckets_c = _median_ms(lambda: commits.read(attempt), reads)
        one_key_latest = _median_ms(lambda: _one_key_latest(reader, one_key), reads)
        buckets_latest = _median_ms(commits.latest_attempt, reads)
        checked_p = _median_ms(
            lambda: _open_all(read_entries(reader, progress_key(TASK)), open_progress_value), reads
        )
        cached_p = _median_ms(lambda: progress.read(), reads)
        before = commits.verified.counts[0]
        commits.read(attempt)
        checks = commits.verified.counts[0] - before
        return (
            f"{n:>5} | {checked_c:>24.1f} {one_key_c:>7.1f} {buckets_c:>7.1f} "
            f"{checked_c / buckets_c:>9.1f}x {one_key_c / buckets_c:>9.1f}x {n * attempts:>5} -> {checks:<4} | "
            f"{one_key_latest:>26.1f} {buckets_latest:>7.1f} | {checked_p:>20.1f} {cached_p:>6.1f}"
        )  # fmt: skip
    finally:
        reader.shutdown()
        writer.shutdown()


if __name__ == "__main__":
    main()
