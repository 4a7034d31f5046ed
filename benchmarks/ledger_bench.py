"""Ledger benchmark: intake throughput, inclusion proofs vs recomputing the root, full verify.

Prints, side by side in one run:

1. verified receipts per second through ``ContributionIntake.admit`` in batches of 1,000 (open_sealed
   with signature and canonical-form checks, task/window/sequence checks, one SQLite transaction with
   ``synchronous=FULL`` and a signed checkpoint per batch), pinned to one CPU; target >= 5,000/s;
2. inclusion-proof time from the stored hashes at 10^4, 10^5 and 10^6 entries against recomputing the
   root from all leaf hashes (the O(n) way); target < 5 ms at 10^6;
3. the time of a full ``verify`` of the 10^6-entry ledger (``manta-ledger verify``); target < 3 min;
4. one ``credits`` answer for a key with 10 receipts in that ledger: reading the whole ledger (how the
   desk answered before :class:`aggregator.receipt_answers.CreditsBook`) against the book, after
   1,000 new entries.

Usage: ``python -m benchmarks.ledger_bench [--quick] [--verify-jobs 1,2] [--dir DIR] [--keep]``.
``--quick`` uses 10^3/10^4/10^5 entries and a smaller intake run (about a minute).

The big ledger is built without the intake checks (they are measured in part 1): its receipts are
sealed from a template by worker processes, which is the only shortcut; every signature is real and
``verify`` checks all of them. Figures are for the machine it runs on, which is noisy when shared:
the load average is printed at the start and the end.
"""

from __future__ import annotations

import argparse
import hashlib
import multiprocessing
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from aggregator.intake import ContributionIntake
from aggregator.receipt_answers import CreditsBook, inclusion
from ledger.rewards import compute_rewards
from ledger.store import LedgerStore
from ledger.verify import default_jobs, verify_ledger
from protocol.averaging_group import group_membership
from protocol.canonical import ascii_canonical_json
from protocol.identity import Identity
from protocol.merkle import root_from_leaf_hashes, verify_inclusion
from protocol.records import ContributionReceipt, Revocation
from protocol.sealing import Sealed, open_sealed, parse_sealed, seal
from tests.protocol.factories import fake_peer_id as _peer_id

TASK = "bench-task"
ORIGIN = "manta.bench/ledger"
PEERS = 256


def _peers() -> list[Identity]:
    return [Identity.from_seed(hashlib.sha256(b"bench-peer-%d" % i).digest()) for i in range(PEERS)]


# The receipt's optional claims at their defaults: the canonical encoding writes every field, defaults
# included, so the fast encoder must too (taken from the model, so a new field cannot break the check).
_OPTIONAL = {n: f.default for n, f in ContributionReceipt.model_fields.items() if not f.is_required()}


def _fields(peer: Identity, seq: int, now_ms: int) -> dict:
    pid = _peer_id(peer.public_key)
    return {
        **_OPTIONAL,
        "task_id": TASK,
        "round": seq,
        "peer_id": pid,
        "public_key": peer.public_key_hex,
        "seq": seq,
        "cohort_id": f"host-{peer.fingerprint[:4]}",
        "subnet_hashes": (hashlib.sha256(b"subnet-%d" % (seq % 4)).hexdigest(),),
        "samples": 256,
        "flops_per_sample": 120_000_000 * (1 + seq % 4),
        "grad_commitment": hashlib.sha256(b"g%d-%s" % (seq, peer.public_key)).hexdigest(),
        "state_digest": hashlib.sha256(b"s%d" % seq).hexdigest(),
        "group_id": hashlib.sha256(b"group%d" % seq).hexdigest()[:32],
        **_group_of_four(pid),
        "timestamp": now_ms,
    }


def _group_of_four(pid: str) -> dict:
    """The receipt's group fields: this peer and three others, 256 samples each (a proof of 2 hashes)."""
    members = sorted({pid, _peer_id(b"m1"), _peer_id(b"m2"), _peer_id(b"m3")})
    view = group_membership([(m, 256) for m in members], pid)
    return {
        "group_root": view.root,
        "group_size": view.size,
        "group_index": view.index,
        "group_proof": view.proof,
    }


_PREFIX = ContributionReceipt.prefix()


def _fast_seal(peer: Identity, fields: dict) -> bytes:
    """``seal`` with the fast encoder (checked equal to ``seal`` at start-up)."""
    message = _PREFIX + ascii_canonical_json(fields)
    return message + b"\ned25519 " + peer.public_key_hex.encode() + b" " + peer.sign(message).hex().encode()


def _entry(i: int, peers: list[Identity], now_ms: int) -> tuple[bytes, int, int]:
    p = i % len(peers)
    seq = i // len(peers) + 1
    return _fast_seal(peers[p], _fields(peers[p], seq, now_ms)), p, seq


_WORKER_PEERS: list[Identity] = []


def _gen_chunk(args: tuple[int, int, int]) -> list[tuple[bytes, int, int]]:
    start, stop, now_ms = args
    return [_entry(i, _WORKER_PEERS, now_ms) for i in range(start, stop)]


class Progress:
    """A progress line on stderr: rewritten in place on a terminal, one line per 10% otherwise."""

    def __init__(self, label: str, total: int):
        self.label, self.total, self.start = label, total, time.monotonic()
        self.tty = sys.stderr.isatty()
        self.next_tenth = 1

    def __call__(self, done: int, total: int | None = None) -> None:
        total = total or self.total
        line = f"  {self.label}: {done:,}/{total:,} ({time.monotonic() - self.start:.0f} s)"
        if self.tty:
            print("\r" + line, end="", file=sys.stderr, flush=True)
        elif done * 10 >= self.next_tenth * total:
            print(line, file=sys.stderr, flush=True)
            self.next_tenth = done * 10 // total + 1

    def done(self) -> None:
        if self.tty:
            print(file=sys.stderr)


def _cpu_with_children() -> float:
    """CPU seconds of this process and its finished children (verify's worker processes)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f}, {five:.2f}, {fifteen:.2f}"


# -- part 1: intake ---------------------------------------------------------------------------------


def bench_intake(workdir: Path, total: int) -> tuple[float, float]:
    """(receipts per wall-clock second, receipts per CPU second of this process) through ``admit``."""
    peers = _peers()[:100]
    aggregator = Identity.from_seed(b"\x42" * 32)
    now = int(time.time() * 1000)
    wires = []
    progress = Progress("sealing receipts for intake", total)
    for i in range(total):
        p = peers[i % len(peers)]
        wires.append(seal(ContributionReceipt(**_fields(p, i // len(peers) + 1, now)), p))
        if i % 1000 == 999:
            progress(i + 1)
    progress.done()
    path = workdir / "intake.db"
    affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    if affinity:
        os.sched_setaffinity(0, {min(affinity)})  # one core
    try:
        with LedgerStore.open(
            path, create=True, origin=ORIGIN, log_public_key=aggregator.public_key
        ) as store:
            intake = ContributionIntake(store, aggregator, TASK, max_age_ms=3_600_000)
            progress = Progress("intake, batches of 1,000", total)
            elapsed = cpu = 0.0
            for lo in range(0, total, 1000):
                batch = wires[lo : lo + 1000]
                t0, c0 = time.perf_counter(), time.process_time()
                result = intake.admit(batch)
                elapsed += time.perf_counter() - t0
                cpu += time.process_time() - c0
                assert len(result.accepted) == len(batch), result.rejected[:3]
                progress(lo + len(batch))
            progress.done()
    finally:
        if affinity:
            os.sched_setaffinity(0, affinity)
    return total / elapsed, total / cpu


# -- part 2: proofs ---------------------------------------------------------------------------------


def _measure_proofs(store: LedgerStore, rng: random.Random, samples: int = 200) -> tuple[float, float, float]:
    """(mean proof ms, p99 proof ms, root-from-all-leaves ms) at the store's current size."""
    size, root = store.size, store.root()
    times = []
    for index in rng.sample(range(size), min(samples, size)):
        t0 = time.perf_counter()
        proof = store.inclusion_proof(index)
        times.append(time.perf_counter() - t0)
        assert verify_inclusion(store.entry(index), index, size, proof, root)
    t0 = time.perf_counter()
    leaves = [row[0] for row in store._conn.execute("SELECT leaf_hash FROM entries ORDER BY idx")]
    recomputed = root_from_leaf_hashes(leaves)
    full = time.perf_counter() - t0
    assert recomputed == root
    times.sort()
    return statistics.mean(times) * 1e3, times[int(len(times) * 0.99) - 1] * 1e3, full * 1e3


def bench_build_and_proofs(
    path: Path, sizes: list[int]
) -> tuple[list[tuple[int, float, float, float]], float]:
    global _WORKER_PEERS
    peers = _peers()
    _WORKER_PEERS = peers
    now = int(time.time() * 1000)
    sample = _entry(12345, peers, now)[0]
    assert sample == seal(
        ContributionReceipt(**_fields(peers[12345 % PEERS], 12345 // PEERS + 1, now)), peers[12345 % PEERS]
    )
    aggregator = Identity.from_seed(b"\x43" * 32)
    rng = random.Random(0)
    results, target = [], sorted(sizes)
    chunk = 10_000
    appended_time = 0.0
    progress = Progress("building the ledger", target[-1])
    ctx = multiprocessing.get_context("fork")
    with (
        LedgerStore.open(path, create=True, origin=ORIGIN, log_public_key=aggregator.public_key) as store,
        ctx.Pool(max(1, default_jobs())) as pool,
    ):
        # Generate in segments of at most 100,000 entries, so that the worker pool is idle (and memory
        # bounded) while proofs are measured.
        bounds = sorted({*target, *range(0, target[-1], 100_000)} - {0})
        lo = 0
        for hi in bounds:
            tasks = [(a, min(a + chunk, hi), now) for a in range(lo, hi, chunk)]
            for entries in pool.imap(_gen_chunk, tasks):
                batch = [
                    # The store reads only the wire bytes, the key and the receipt's seq.
                    Sealed(ContributionReceipt.model_construct(seq=seq), peers[p].public_key, b"", b"", wire)
                    for wire, p, seq in entries
                ]
                t0 = time.perf_counter()
                store.append_batch(batch, aggregator)
                appended_time += time.perf_counter() - t0
                progress(store.size)
            lo = hi
            if store.size in target:
                progress.done()
                results.append((store.size, *_measure_proofs(store, rng)))
                print(
                    f"  at {store.size:>9,}: proof {results[-1][1]:.3f} ms (p99 {results[-1][2]:.3f}), "
                    f"root from all leaves {results[-1][3]:.1f} ms",
                    file=sys.stderr,
                )
    return results, target[-1] / appended_time


# -- part 4: credits answers ------------------------------------------------------------------------


def _whole_ledger_answer(store: LedgerStore, key: str) -> tuple[list[dict], object]:
    """A credits answer read from every entry, as the desk made it before the book (the baseline)."""
    rows = []
    for index, data in store.entries():
        sealed = parse_sealed(data, (ContributionReceipt, Revocation))
        if isinstance(sealed.record, ContributionReceipt) and sealed.public_key.hex() == key:
            rows.append({"index": index, "credit": sealed.record.credit, **inclusion(store, index)})
    return rows, compute_rewards((d for _, d in store.entries()), store.log_public_key)


def bench_credits(path: Path) -> tuple[int, float, float, float]:
    """(entries, whole-ledger answer s, the book's first answer s, its answer after 1,000 entries s)."""
    aggregator = Identity.from_seed(b"\x43" * 32)
    newcomer = Identity.from_seed(b"\x44" * 32)
    now = int(time.time() * 1000)
    with LedgerStore.open(path) as store:
        mine = [seal(ContributionReceipt(**_fields(newcomer, seq, now)), newcomer) for seq in range(1, 11)]
        store.append_batch([open_sealed(w, ContributionReceipt) for w in mine], aggregator)
        key, book = newcomer.public_key_hex, CreditsBook(aggregator.public_key)
        t0 = time.perf_counter()
        whole_rows, whole_rewards = _whole_ledger_answer(store, key)
        whole = time.perf_counter() - t0
        t0 = time.perf_counter()
        book.entries_of(store, key)
        first = time.perf_counter() - t0
        peers = _peers()
        more = [_entry(i, peers, now) for i in range(10**7, 10**7 + 1_000)]
        store.append_batch(
            [
                Sealed(ContributionReceipt.model_construct(seq=q), peers[p].public_key, b"", b"", w)
                for w, p, q in more
            ],
            aggregator,
        )
        t0 = time.perf_counter()
        rows, rewards = book.entries_of(store, key)
        later = time.perf_counter() - t0
        assert [r["index"] for r in rows] == [r["index"] for r in whole_rows] and len(rows) == 10
        assert rewards.total_credits > whole_rewards.total_credits  # the 1,000 new entries counted
        return store.size, whole, first, later


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10^3/10^4/10^5 entries and a short intake run")
    parser.add_argument(
        "--verify-jobs", default=None, help="comma-separated job counts for verify [default: CPUs]"
    )
    parser.add_argument(
        "--dir", type=Path, default=None, help="where to put the ledger files [default: a temp dir]"
    )
    parser.add_argument("--keep", action="store_true", help="keep the ledger files")
    args = parser.parse_args(argv)
    sizes = [1_000, 10_000, 100_000] if args.quick else [10_000, 100_000, 1_000_000]
    intake_total = 5_000 if args.quick else 20_000
    jobs_list = [int(j) for j in args.verify_jobs.split(",")] if args.verify_jobs else [default_jobs()]
    if args.dir:
        Path(args.dir).mkdir(parents=True, exist_ok=True)  # a fresh --dir is fine, not a traceback
    workdir = Path(tempfile.mkdtemp(prefix="manta-ledger-bench-", dir=args.dir))
    print(
        f"ledger benchmark ({'quick' if args.quick else 'full'}), {os.cpu_count()} CPUs, load {_load()}",
        flush=True,
    )
    try:
        rate, cpu_rate = bench_intake(workdir, intake_total)
        print(f"  intake: {rate:,.0f} verified receipts/s ({cpu_rate:,.0f} per CPU second)", file=sys.stderr)
        big = workdir / "big.db"
        proofs, build_rate = bench_build_and_proofs(big, sizes)
        verifies = []
        for jobs in jobs_list:
            progress = Progress(f"verify ({jobs} job{'s' if jobs > 1 else ''})", sizes[-1])
            t0, c0 = time.perf_counter(), _cpu_with_children()
            result = verify_ledger(big, jobs=jobs, progress=progress)
            verifies.append((jobs, time.perf_counter() - t0, _cpu_with_children() - c0))
            progress.done()
            assert result.ok, result.summary
        credits = bench_credits(big)
        size_mb = big.stat().st_size / 2**20
        sys.stderr.flush()
        print()
        print(f"{'measure':<58} {'result':>16}   target")
        label = "intake: verified receipts/s, batches of 1,000, one core"
        print(f"{label:<58} {rate:>14,.0f}/s   >= 5,000/s")
        label = "  the same per CPU-second of this process"
        print(f"{label:<58} {cpu_rate:>14,.0f}/s   (independent of others' load)")
        for size, mean_ms, p99_ms, full_ms in proofs:
            label = f"inclusion proof at {size:,} entries (mean)"
            target = "< 5 ms" if size == 1_000_000 else ""
            print(f"{label:<58} {mean_ms:>12.3f} ms   {target:<8} (p99 {p99_ms:.3f} ms)")
            label = f"  vs root recomputed from all {size:,} leaves"
            print(f"{label:<58} {full_ms:>12.1f} ms   proof is {full_ms / mean_ms:,.0f}x faster")
        for jobs, seconds, cpu_seconds in verifies:
            label = f"full verify of {sizes[-1]:,} entries, {jobs} job{'s' if jobs > 1 else ''}"
            target = "< 180 s" if sizes[-1] == 1_000_000 else ""
            print(f"{label:<58} {seconds:>13.1f} s   {target:<8} ({cpu_seconds:.1f} CPU-s in all processes)")
        entries, whole, first, later = credits
        label = f"credits answer at {entries:,} entries: whole ledger read"
        print(f"{label:<58} {whole:>13.2f} s   (how it was answered before)")
        label = "  the desk's book: its first answer (reads it once)"
        print(f"{label:<58} {first:>13.2f} s")
        label = "  the book after 1,000 new entries"
        print(f"{label:<58} {later * 1000:>12.1f} ms   {whole / later:,.0f}x faster than a whole read")
        print(
            f"(ledger of {sizes[-1]:,} entries: {size_mb:,.0f} MiB; unverified bulk append {build_rate:,.0f} entries/s)"
        )
        print(f"load at the end: {_load()}")
    finally:
        if args.keep:
            print(f"ledger files kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
