"""One attempt's commit at 100 to 1,000 peers: the real certificate code over an in-process transport.

Every peer runs :class:`peer.commit.certificate_relay.CertificateRelay` with its own Ed25519 key:
votes, certificates and their checks are the real ones. The transport is a discrete-event queue:
a message leaves when its sender's uplink is free, takes ``size / uplink`` to send and ``latency``
to arrive; a receiver is busy for the real time its relay took plus one Ed25519 check per vote it
checked (votes found valid before are cached process-wide here, so their check is charged, not
timed). Tests use a fixed time per call instead, so their figures do not depend on the machine. Churn: a share of the peers die at random moments of the attempt (before or after they
vote) and drop everything sent to them.

    python -m benchmarks.coordination_sim --peers 100 300 1000 --churn 0 0.05 [--vote-spread 0.2]

prints, per swarm size and churn, the bytes and messages each peer sent and received, the votes it
checked, the share of live voters that committed and when (seconds from the first vote).
"""

from __future__ import annotations

import argparse
import hashlib
import heapq
import os
import random
import statistics
import time
from dataclasses import dataclass, field

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from peer.commit.certificate_relay import CertificateRelay, Outgoing, RelayPlan, RelaySettings
from protocol.commit_certificate import CommitCertificate, RosterSnapshot, sign_vote
from protocol.identity import Identity
from protocol.peer_keys import Libp2pKey

TASK = "coordination-sim"
ATTEMPT = 1
RESULT = hashlib.sha256(b"the attempt's result").hexdigest()
GROUP = hashlib.sha256(b"the attempt's averaging group").hexdigest()


@dataclass(frozen=True)
class LinkModel:
    latency: float = 0.030  # seconds one way
    uplink_bits: float = 20e6  # bits per second a peer sends at
    vote_check: float = 0.00015  # seconds one Ed25519 check costs (the benchmark measures it)
    # a receiver is busy for the real time its relay took (True), or for ``handling`` seconds per
    # call (False: the same run gives the same figures on any machine and under any load, as tests need)
    timed: bool = False
    handling: float = 0.0005


@dataclass(frozen=True)
class SimConfig:
    peers: int
    cohort_size: int = 4
    churn: float = 0.0  # share of peers that die during the attempt
    vote_spread: float = 0.2  # seconds over which the peers' results (votes) come
    time_limit: float = 60.0
    seed: int = 0
    root_dies_at: float | None = None  # kill the tree's root at this time: cohort 0's first member
    root_leaders_dying: int = 1  # ... or its first members, this many (the relay's settings.leaders lead)
    root_votes: bool = True  # False: the root lives but has no result to vote for
    settings: RelaySettings = field(default_factory=RelaySettings)
    link: LinkModel = field(default_factory=LinkModel)


@dataclass
class _Node:
    relay: CertificateRelay
    vote_at: float
    dies_at: float
    up_free: float = 0.0
    cpu_free: float = 0.0
    tick_at: float | None = None
    sent_bytes: int = 0
    sent_messages: int = 0
    received_bytes: int = 0
    received_messages: int = 0


@dataclass(frozen=True)
class SimResult:
    config: SimConfig
    live_voters: int
    committed: int
    commit_seconds: list[float]
    sent_bytes: list[int]
    sent_messages: list[int]
    received_bytes: list[int]
    received_messages: list[int]
    votes_checked: list[int]
    wrong_results: int
    wall_seconds: float


def measure_vote_check(repeats: int = 200) -> float:
    """Seconds one Ed25519 check takes on this machine (uncached)."""
    key = Ed25519PrivateKey.generate()
    public, message = key.public_key(), b"m" * 120
    signature = key.sign(message)
    start = time.perf_counter()
    for _ in range(repeats):
        public.verify(signature, message)
    return (time.perf_counter() - start) / repeats


def make_swarm(peers: int, cohort_size: int, seed: int) -> tuple[dict[str, Identity], RosterSnapshot]:
    """``peers`` identities in cohorts of ``cohort_size`` (the last may be smaller)."""
    identities: dict[str, Identity] = {}
    cohorts: dict[str, str] = {}
    for i in range(peers):
        identity = Identity.from_seed(hashlib.sha256(f"sim {seed} peer {i}".encode()).digest())
        peer = Libp2pKey.from_seed(hashlib.sha256(b"libp2p" + identity.public_key).digest()).peer_id
        identities[peer], cohorts[peer] = identity, f"cohort-{i // cohort_size:04d}"
    keys = {peer: identity.public_key_hex for peer, identity in identities.items()}
    return identities, RosterSnapshot(keys, cohorts)


def simulate(config: SimConfig) -> SimResult:
    """One attempt of ``config.peers`` peers, every live one voting for the same result."""
    started = time.perf_counter()
    rng = random.Random(config.seed)
    identities, roster = make_swarm(config.peers, config.cohort_size, config.seed)
    plan = RelayPlan.of(roster, config.settings.fanout)
    nodes: dict[str, _Node] = {}
    for peer in sorted(identities):
        relay = CertificateRelay(
            peer, TASK, ATTEMPT, roster, config.settings, random.Random(rng.random()), plan
        )
        dies = rng.uniform(0, config.vote_spread + 2.0) if rng.random() < config.churn else float("inf")
        nodes[peer] = _Node(relay, rng.uniform(0, config.vote_spread), dies)
    if config.root_dies_at is not None:
        for leader in plan.cohorts[0][: config.root_leaders_dying]:
            nodes[leader].dies_at = config.root_dies_at
    if not config.root_votes:
        nodes[plan.cohorts[0][0]].vote_at = float("inf")
    events: list[tuple[float, int, str, str, object]] = []
    sequence = 0

    def push(at: float, kind: str, peer: str, payload: object = None) -> None:
        nonlocal sequence
        sequence += 1
        heapq.heappush(events, (at, sequence, kind, peer, payload))

    def schedule_tick(node: _Node, peer: str) -> None:
        due = node.relay.next_due()
        if due is not None and (node.tick_at is None or due < node.tick_at):
            node.tick_at = due
            push(due, "tick", peer)

    def send(sender: _Node, sender_id: str, at: float, outgoing: list[Outgoing]) -> None:
        for out in outgoing:
            size = out.message.size
            depart = max(at, sender.up_free) + size * 8 / config.link.uplink_bits
            sender.up_free = depart
            sender.sent_bytes += size
            sender.sent_messages += 1
            push(depart + config.link.latency, "message", out.to, (sender_id, out.message))

    for peer, node in nodes.items():
        push(node.vote_at, "vote", peer)
    while events:
        at, _, kind, peer, payload = heapq.heappop(events)
        if at > config.time_limit:
            break
        node = nodes[peer]
        if at >= node.dies_at:
            continue
        start = max(at, node.cpu_free)
        checked_before = node.relay.tally.votes_checked
        clock = time.perf_counter()
        if kind == "vote":
            signature = sign_vote(identities[peer], TASK, ATTEMPT, RESULT, GROUP)
            certificate = CommitCertificate(TASK, ATTEMPT, node.relay.scope, RESULT, GROUP, {peer: signature})
            outgoing = node.relay.vote(start, certificate)
        elif kind == "message":
            sender, message = payload  # type: ignore[misc]
            node.received_bytes += message.size
            node.received_messages += 1
            outgoing = node.relay.receive(start, sender, message)
        else:
            if node.tick_at != at:
                continue  # superseded by an earlier tick
            node.tick_at = None
            outgoing = node.relay.tick(start)
        cost = time.perf_counter() - clock if config.link.timed else config.link.handling
        cost += (node.relay.tally.votes_checked - checked_before) * config.link.vote_check
        node.cpu_free = start + cost
        send(node, peer, node.cpu_free, outgoing)
        schedule_tick(node, peer)

    live = [n for n in nodes.values() if n.dies_at > config.time_limit]
    voters = [n for n in live if n.vote_at < config.time_limit]
    done = [n for n in voters if n.relay.committed is not None]
    first_vote = min(n.vote_at for n in nodes.values())
    return SimResult(
        config=config,
        live_voters=len(voters),
        committed=len(done),
        commit_seconds=sorted(n.relay.committed_at - first_vote for n in done),  # type: ignore[operator]
        sent_bytes=[n.sent_bytes for n in live],
        sent_messages=[n.sent_messages for n in live],
        received_bytes=[n.received_bytes for n in live],
        received_messages=[n.received_messages for n in live],
        votes_checked=[n.relay.tally.votes_checked for n in live],
        wrong_results=sum(1 for n in done if n.relay.committed != RESULT),
        wall_seconds=time.perf_counter() - started,
    )


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def report(results: list[SimResult]) -> str:
    header = (
        "| peers | churn | committed | commit s (median / p95 / max) | KB sent / peer (median / max) "
        "| KB received / peer (median / max) | messages / peer (median / max) | votes checked / peer | wall s |"
    )
    lines = [header, "|" + "---|" * 9]
    for r in results:
        c = r.config
        times = r.commit_seconds
        lines.append(
            f"| {c.peers} | {c.churn:.0%} | {r.committed} of {r.live_voters} "
            f"| {_quantile(times, 0.5):.2f} / {_quantile(times, 0.95):.2f} / {max(times, default=float('nan')):.2f} "
            f"| {statistics.median(r.sent_bytes) / 1e3:.1f} / {max(r.sent_bytes) / 1e3:.1f} "
            f"| {statistics.median(r.received_bytes) / 1e3:.1f} / {max(r.received_bytes) / 1e3:.1f} "
            f"| {statistics.median(m + n for m, n in zip(r.sent_messages, r.received_messages)):.0f} "
            f"/ {max(m + n for m, n in zip(r.sent_messages, r.received_messages))} "
            f"| {statistics.median(r.votes_checked):.0f} | {r.wall_seconds:.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--peers", type=int, nargs="+", default=[100, 300, 1000])
    parser.add_argument("--churn", type=float, nargs="+", default=[0.0, 0.05])
    parser.add_argument("--cohort-size", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--vote-spread",
        type=float,
        default=0.2,
        help="seconds over which the peers' votes come (their results)",
    )
    args = parser.parse_args(argv)
    if any(p < 2 for p in args.peers) or any(not 0 <= c < 1 for c in args.churn) or args.cohort_size < 1:
        parser.error("--peers must be at least 2, --churn in [0, 1), --cohort-size at least 1")
    if args.vote_spread < 0:
        parser.error("--vote-spread must not be negative")
    link = LinkModel(vote_check=measure_vote_check(), timed=True)
    print(
        f"load before: {os.getloadavg()[0]:.1f}; one Ed25519 check: {link.vote_check * 1e3:.3f} ms",
        flush=True,
    )
    results = []
    for peers in args.peers:
        for churn in args.churn:
            config = SimConfig(peers, args.cohort_size, churn, args.vote_spread, seed=args.seed, link=link)
            results.append(simulate(config))
            r = results[-1]
            print(
                f"  {peers} peers, churn {churn:.0%}: {r.committed} of {r.live_voters} committed "
                f"({r.wall_seconds:.0f} s)",
                flush=True,
            )
    print(report(results))
    print(f"load after: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
