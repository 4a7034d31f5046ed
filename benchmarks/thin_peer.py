"""A thin peer of :mod:`benchmarks.swarm_scale`: everything of a round that crosses the network, run
exactly as a real peer runs it, and a fixed stand-in for the training step.

Per round it plans its cohort as a real peer does (from the cohort directory that governs the attempt
where ``plan`` is ``directory``, else from the roster it reads, by node affinity), "computes" for
``compute`` seconds while it reads and writes the progress board, averages a random gradient of the real size through the
hierarchy (cohort, cross-cohort tree, broadcast) and waits for the signed commit board's quorum. With
``trace`` set, it appends one JSON line per round to that file (:class:`RoundTrace`): which attempt,
cohort and head, the result's digest and contributors, each stage's seconds, why it aborted. With
``logs`` set, each peer writes its stages' and hivemind's matchmaking DEBUG log to that folder.
"""

from __future__ import annotations

import collections
import functools
import json
import os
import random
import time
from dataclasses import asdict, dataclass, field

from hivemind_adapter.runtime import prepare_process

prepare_process()

import hivemind  # noqa: E402
import torch  # noqa: E402
from hivemind.dht.protocol import DHTProtocol  # noqa: E402

from benchmarks.certificates_beside import CertificateFigures, CertificatesBeside  # noqa: E402
from benchmarks.peer_accounts import CGROUP_ROOT  # noqa: E402
from hivemind_adapter.control_traffic import ControlTraffic, control_traffic  # noqa: E402
from hivemind_adapter.dht import DHT_BUCKET_SIZE, peer_id, speaker, start_dht  # noqa: E402
from hivemind_adapter.group_keys import DeclarationSigner  # noqa: E402
from hivemind_adapter.p2p import Endpoint  # noqa: E402
from peer.averaging.factory import build_averager, committer_for  # noqa: E402
from peer.averaging.outcome import AveragingOutcome  # noqa: E402
from peer.averaging.stage import AveragingTimeouts  # noqa: E402
from peer.commit.boards import SignedCommitBoard  # noqa: E402
from peer.commit.certificate_channel import CertificateChannel  # noqa: E402
from peer.commit.certificate_relay import RelaySettings  # noqa: E402
from peer.commit.certified import CertificateVotes  # noqa: E402
from peer.directory_plan import NotListedYet, governing_directory, plan_from_directory  # noqa: E402
from peer.directory_view import DirectoryView  # noqa: E402
from peer.roster_view import ADMISSION_READ_AGE, RosterView  # noqa: E402
from peer.round_types import RoundPlan  # noqa: E402
from peer.swarm_progress import SwarmProgress  # noqa: E402
from peer.swarm_view import Announcer, ProgressBoard  # noqa: E402
from protocol.cohort_assignment import assign_cohorts, cohort_sizes  # noqa: E402
from protocol.dht_schema import MantaRecordValidator  # noqa: E402
from protocol.identity import Identity  # noqa: E402
from protocol.membership import MembershipCertificate  # noqa: E402
from protocol.records import Affinity, DeviceInfo  # noqa: E402
from protocol.sealing import seal  # noqa: E402
from testbed.peer_logs import log_to_file  # noqa: E402
from tests.protocol.factories import task_spec  # noqa: E402

TASK = "scale"
BENCH_AGGREGATOR = Identity.from_seed(
    b"swarm-scale benchmark aggregator"
)  # signs the thin peers' memberships
SPEC = task_spec(BENCH_AGGREGATOR, TASK)
LOOK_EVERY = 0.25  # as the real round looks at the swarm's progress while its workers train
TIMEOUTS = AveragingTimeouts(
    matchmaking=2.0, request=1.0, next_chunk=10.0, allreduce=120.0, step=60.0, commit=20.0
)

# DHT requests this process's DHT node makes, by kind (counted inside the DHT's own process).
_REQUESTS: collections.Counter[str] = collections.Counter()


def _counted(kind: str, call):
    @functools.wraps(call)
    async def counting(self, *args, **kwargs):
        _REQUESTS[kind] += 1
        return await call(self, *args, **kwargs)

    return counting


for _kind in ("call_ping", "call_store", "call_find"):
    setattr(DHTProtocol, _kind, _counted(_kind, getattr(DHTProtocol, _kind)))


async def _request_counts(_dht, _node) -> dict[str, int]:
    return dict(_REQUESTS)


# DHT reads and writes the round's own code asks for, in the thin peer's main process (the averagers'
# matchmaking makes its own, in their processes): what the requests above serve.
_ROUND_CALLS: collections.Counter[str] = collections.Counter()


def _counted_sync(kind: str, call):
    @functools.wraps(call)
    def counting(self, key, *args, **kwargs):
        # by the key's family: manta_TASK_progress -> "get progress", manta_TASK_commits_3 -> "get commits"
        family = key.removeprefix(f"manta_{TASK}_").split("_")[0] if isinstance(key, str) else "?"
        _ROUND_CALLS[f"{kind} {family}"] += 1
        return call(self, key, *args, **kwargs)

    return counting


hivemind.DHT.get = _counted_sync("get", hivemind.DHT.get)
hivemind.DHT.store = _counted_sync("store", hivemind.DHT.store)


@dataclass(frozen=True)
class ThinOptions:
    shapes: tuple[tuple[int, ...], ...]
    rounds: int
    compute: float
    cross_group: int
    cohort_size: int = 4
    bucket_size: int = DHT_BUCKET_SIZE  # the DHT's k and lookup beam (hivemind_adapter.dht)
    store_search: str = "nodes"  # "values": a store's search for nodes downloads values, as hivemind's
    trace: str = ""  # a file each peer appends a RoundTrace line to per round ("": none)
    logs: str = ""  # a folder each peer writes its DEBUG log to, peer-INDEX.log ("": none)
    certificates: bool = False  # also relay commit certificates beside the board (measured, deciding nothing)
    commit: str = "board"  # what decides a round: "board" or "certificates" (SwarmParams.commit)
    plan: str = "roster"  # where a round's cohorts come from: "roster" or "directory" (with certificates)

    @property
    def variant(self) -> str:
        planned = f" by {self.plan}" if self.commit == "certificates" else ""
        return f"k={self.bucket_size}, {self.store_search}, {self.commit}{planned}"


@dataclass
class PeerFigures:
    """What one thin peer measured over its rounds (sent back to the benchmark)."""

    round_seconds: list[float] = field(default_factory=list)
    committed: int = 0
    reasons: list[str] = field(default_factory=list)
    dht_requests: int = 0
    requests_by_kind: dict[str, int] = field(default_factory=dict)
    round_calls: dict[str, int] = field(default_factory=dict)
    cohorts: int = 0
    control: ControlTraffic = ControlTraffic()  # coordination it sent over its rounds
    certificates: CertificateFigures | None = None  # with ThinOptions.certificates


@dataclass(frozen=True)
class RoundTrace:
    """One thin peer's round, as written to the trace file (peer ids and digests shortened)."""

    peer: str
    round: int
    attempt: int
    cohort: str
    head: str  # the cohort leader it followed (itself if it led)
    cohort_members: int  # the members its cohort stage gathered
    known_group: bool  # its cohort met as a group known from the roster, without matchmaking
    contributors: int  # the peers behind the result it ended with
    digest: str
    committed: bool
    reason: str
    seconds: dict[str, float]
    ended: float  # wall clock (time.time())

    @classmethod
    def of(
        cls, me: str, round_index: int, attempt: int, cohort: str, outcome: AveragingOutcome
    ) -> RoundTrace:
        return cls(
            me[-8:], round_index, attempt, cohort, outcome.leader[-8:], len(outcome.cohort_members),
            outcome.known_group, len(outcome.contributors), outcome.digest[:8], outcome.committed, outcome.reason,
            {k: round(v, 2) for k, v in outcome.seconds.items()}, round(time.time(), 2),
        )  # fmt: skip

    def append_to(self, path: str) -> None:
        with open(path, "a") as f:  # one short write per line: lines of concurrent peers stay whole
            f.write(json.dumps(asdict(self)) + "\n")


def _certificate(identity: Identity, peer: str, serial: int) -> bytes:
    """A thin peer's membership, issued by the benchmark's stand-in aggregator key (admission itself
    is not what this benchmark measures)."""
    now = int(time.time() * 1000)
    certificate = MembershipCertificate(
        task_id=TASK, member_key=identity.public_key_hex, peer_id=peer, serial=serial, policy="allow",
        issued_ms=now, expires_ms=now + 6 * 3600 * 1000,
    )  # fmt: skip
    return seal(certificate, BENCH_AGGREGATOR)


def plan_thin_round(
    me: str,
    round_index: int,
    attempt: int,
    roster_view: RosterView,
    view: DirectoryView | None,
    cohort_size: int,
) -> tuple[RoundPlan, dict[str, str]]:
    """The round's plan and the keys it admits, as :func:`peer.round.plan_round` takes them: from the
    directory that governs ``attempt`` (NotListedYet where it does not list ``me``), or from the
    roster read now where none does."""
    whole = governing_directory(view, attempt)
    if whole is not None:
        return plan_from_directory(whole, me, round_index, attempt), view.member_keys()
    roster = roster_view.read()
    assignment = assign_cohorts([p.entry for p in roster], cohort_size)
    cohort = assignment.get(me, f"solo-{me[-8:]}")
    cohort_ids = sorted(set(assignment.values()) | {cohort})
    peers_of: dict[str, list[str]] = {cohort: [me]} if me not in assignment else {}
    for peer, name in sorted(assignment.items()):
        peers_of.setdefault(name, []).append(peer)
    plan = RoundPlan(
        round_index, attempt, cohort, cohort_ids.index(cohort), len(cohort_ids), cohort_sizes(assignment).get(cohort, 1),
        tuple(p.entry.peer_id for p in roster), tuple(tuple(peers_of[name]) for name in cohort_ids),
    )  # fmt: skip
    return plan, roster_view.keys(ADMISSION_READ_AGE)


def thin_peer(
    index, initial_peers, opts: ThinOptions, cgroup: str, ready, go, done, results, directory_peer: str = ""
) -> None:
    """``directory_peer``: the node that serves the cohort directory (with ``opts.plan`` ``directory``)."""
    (CGROUP_ROOT / cgroup / "cgroup.procs").write_text(str(os.getpid()))  # its p2pd and children follow
    torch.set_num_threads(1)
    if opts.logs:
        log_to_file(os.path.join(opts.logs, f"peer-{index}.log"))
    dht = start_dht(
        initial_peers=initial_peers, host_maddrs=["/ip4/127.0.0.1/tcp/0"], bucket_size=opts.bucket_size,
        nodes_only_store_search=opts.store_search == "nodes",
    )  # fmt: skip
    averager, beside, votes = None, None, None
    try:
        dht.add_validators([MantaRecordValidator(TASK, aggregator_keys=SPEC.aggregator_keys)])
        identity, me = Identity.generate(), peer_id(dht)
        certificate = _certificate(identity, me, index)
        announcer = Announcer(
            dht, speaker(dht, identity), TASK, (DeviceInfo(kind="cpu", name="thin", memory_mb=0),),
            Affinity(host_id="0" * 16, network_id="0" * 16), "auto", lambda: certificate, throughput=1.0,
        )  # fmt: skip
        announcer.announce()
        announcer.keep_fresh()
        progress = SwarmProgress(ProgressBoard(dht, TASK, speaker(dht, identity)), me, 64, 1, 10**9)
        roster_view = RosterView(dht, SPEC)
        votes, view, admitted = None, None, {}

        def admitted_keys() -> dict[str, str]:  # the keys the current round's plan admits
            return admitted

        if opts.commit == "certificates":
            endpoint = Endpoint(dht, "certificates")
            channel = CertificateChannel(endpoint, TASK, RelaySettings(), random.Random(index))
            if opts.plan == "directory":
                view = DirectoryView(dht, endpoint, SPEC, me, lambda key: directory_peer)
            # as a real peer: the directory's members where one governs (peer.startup), else the roster's
            votes = CertificateVotes(channel, identity, admitted_keys)
        committer = committer_for(
            SignedCommitBoard(dht, TASK, speaker(dht, identity)), TIMEOUTS, certificates=votes
        )  # fmt: skip
        if opts.certificates:
            beside = CertificatesBeside(dht, TASK, identity, committer, seed=index)
        ready.put(index)
        if not go.wait(timeout=900):
            return
        start_counts, start_calls = dht.run_coroutine(_request_counts), dict(_ROUND_CALLS)
        start_control = control_traffic()
        figures, attempt = PeerFigures(), -1
        generator = torch.Generator().manual_seed(index)
        for round_index in range(opts.rounds):
            started = time.perf_counter()
            attempt = committer.next_attempt(attempt)
            try:
                plan, admitted = plan_thin_round(
                    me, round_index, attempt, roster_view, view, opts.cohort_size
                )
            except NotListedYet as e:  # as a real peer, it waits for an epoch that lists it
                figures.reasons.append(str(e))
                figures.round_seconds.append(time.perf_counter() - started)
                time.sleep(5.0)
                continue
            cohort = plan.cohort
            if averager is None or averager.cohort != cohort:
                if averager is not None:
                    averager.shutdown()
                averager = build_averager(
                    dht, TASK, cohort, [torch.zeros(s) for s in opts.shapes], timeouts=TIMEOUTS,
                    committer=committer, cross_group_size=opts.cross_group,
                    # as a real peer: signed matchmaking declarations, met only with the roster's peers
                    declarations=DeclarationSigner(TASK, speaker(dht, identity)),
                    admitted=admitted_keys,
                )  # fmt: skip
            if beside is not None:
                ranks = {p: f"c{rank:04d}" for rank, members in enumerate(plan.cohorts) for p in members}
                beside.begin(attempt, admitted, ranks)
            progress.begin(round_index, cohort, round_index - 1)
            samples, computing = 0, time.perf_counter()
            while samples == 0 or time.perf_counter() - computing < opts.compute:
                samples += 16
                progress.look(samples, 0.0)
                time.sleep(LOOK_EVERY)
            progress.finish(samples, 0.0)
            numerator = [torch.randn(s, generator=generator) for s in opts.shapes]
            outcome = averager.average(
                attempt, numerator, samples, cohort_size=plan.cohort_size, num_cohorts=plan.num_cohorts,
                cohort_rank=plan.cohort_rank, expected_peers=list(plan.roster), cohorts=list(plan.cohorts),
            )  # fmt: skip
            if beside is not None:
                beside.end(attempt, outcome)
            if opts.trace:
                RoundTrace.of(me, round_index, attempt, cohort, outcome).append_to(opts.trace)
            if outcome.committed:
                figures.committed += 1
                committer.report_state(attempt, outcome.report(), outcome.digest)
            else:
                figures.reasons.append(outcome.reason)
                averager.settle(attempt, list(plan.roster))
            figures.round_seconds.append(time.perf_counter() - started)
            figures.cohorts = plan.num_cohorts
        end_counts = dht.run_coroutine(_request_counts)
        figures.control = control_traffic() - start_control
        figures.dht_requests = sum(end_counts.values()) - sum(start_counts.values())
        figures.requests_by_kind = {k: v - start_counts.get(k, 0) for k, v in end_counts.items()}
        figures.round_calls = {k: v - start_calls.get(k, 0) for k, v in _ROUND_CALLS.items()}
        if beside is not None:  # it relays on for peers still in their last round
            figures.certificates = beside.so_far()
        results.put((index, figures))
        done.wait(timeout=600)  # stay in the swarm until every peer has finished its rounds
    finally:
        if beside is not None:
            beside.close()
        if votes is not None:
            votes.channel.close()
            votes.channel.endpoint.close()
        if averager is not None:
            averager.shutdown()
        dht.shutdown()
