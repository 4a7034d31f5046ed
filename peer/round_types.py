"""The typed values a round passes between its stages, its report, and the context it runs in
(:mod:`peer.round` runs the stages)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from peer.averaging.hierarchy import HierarchicalAverager
from peer.commit.committer import RoundCommitter
from peer.directory_view import DirectoryView
from peer.progress_display import ProgressDisplay
from peer.receipts import ReceiptOutbox
from peer.roster_view import RosterView
from peer.swarm_progress import SwarmProgress
from peer.swarm_view import Announcer
from peer.worker_pool import WorkerPool
from peer.worker_protocol import HostContribution
from protocol.identity import Identity
from protocol.records import ContributionReceipt
from protocol.task_spec import TaskSpec
from supernet.training.config import TrainConfig

if TYPE_CHECKING:  # outer_round uses these types: imported for annotations only
    from peer.data_feed import DataFeed
    from peer.outer_round import OuterStepper


@dataclass(frozen=True)
class RoundPlan:
    """Where this peer stands in a round: its cohort among the roster's, and whom it expects."""

    round_index: int  # the training step: data stream, sub-networks, learning rate
    attempt: int  # the swarm-wide averaging attempt (never repeats; a retried step gets a new one)
    cohort: str
    cohort_rank: int  # this cohort's position among the round's cohorts (model-parallel shares)
    num_cohorts: int
    cohort_size: int
    roster: tuple[str, ...]  # peer ids online at the start: a quorum of them must hold the result
    cohorts: tuple[tuple[str, ...], ...] = ()  # the roster's peers of each cohort, by rank

    def cohort_only(self) -> RoundPlan:
        """The plan of an inner step (``sync = "outer"``): this cohort alone is the round's swarm, its
        roster the quorum that commits the cohort's result."""
        own = self.cohorts[self.cohort_rank] if self.cohorts else self.roster
        return replace(self, cohort_rank=0, num_cohorts=1, roster=tuple(own), cohorts=(tuple(own),))


@dataclass(frozen=True)
class Commitments:
    """What this peer's receipt commits to, taken from the host's gradient before averaging."""

    grad_commitment: str  # digest of the host's gradient numerator
    grad_sketch: tuple[int, ...]  # a random projection an audit replay is compared with (empty: non-finite)
    worker_samples: tuple[int, ...]  # samples per worker of this host


@dataclass
class RoundReport:
    """One round as this peer saw it (a line of ``<data dir>/rounds.jsonl``)."""

    round: int
    committed: bool
    samples: int
    loss: float
    cohort: str
    state_digest: str
    seconds: float
    contributors: int = 0
    reason: str = ""
    phase: str = ""
    lr: float | None = None
    swarm_samples: int = 0  # what the whole swarm processed in the round (from the contributors)
    subnets: list[str] = field(default_factory=list)  # hashes of the sub-networks this peer trained
    # where this peer's time went: its own mini-batches, the all-reduce stages (which include waiting
    # in matchmaking for the other peers), and the rest (commit reports, roster, optimizer step)
    times: dict[str, float] = field(default_factory=dict)
    # the same split by stage: compute, cohort, cross, broadcast, commit, other (and, when known, the
    # roster read, the receipt's commitments, the optimizer step and what is published after it:
    # roster, commitments, apply, publish)
    stages: dict[str, float] = field(default_factory=dict)
    attempt: int = -1  # the swarm-wide averaging attempt this round ran in
    late: bool = False  # committed after the round had ended aborted: its result found a quorum later
    sat_out: bool = False  # no part in its attempt's result: its state was older than the swarm's round
    outer: OuterReport | None = None  # the outer step taken at this round's end (sync = "outer")
    # payload bytes this peer's all-reduces moved across cohorts since it started
    cross_cohort_bytes: int = 0
    known_group: bool = False  # the cohort averaged in a group known from the roster (no matchmaking)
    # coordination this peer sent since its previous report (hivemind_adapter.control_traffic): DHT
    # requests and replies, matchmaking's join messages; their count and protobuf payload bytes
    control_messages: int = 0
    control_bytes: int = 0

    def describe(self) -> str:
        """The round in one log line."""
        times = self.times or {"compute": 0.0, "averaging": 0.0, "waiting": 0.0}
        return (
            f"round {self.round}: {'committed' if self.committed else 'aborted'}, loss {self.loss:.4f}, "
            f"{self.samples} samples in {self.seconds:.1f} s, {self.contributors} contributor(s), "
            f"cohort {self.cohort}, state {self.state_digest[:12]}, swarm {self.swarm_samples} samples, "
            f"phase {self.phase}, time compute {times['compute']:.1f} s / averaging "
            f"{times['averaging']:.1f} s / other {times['waiting']:.1f} s"
            + (f" ({self.reason})" if self.reason else "")
            + (" (late: its result found a quorum after the round ended)" if self.late else "")
        )


@dataclass
class OuterReport:
    """One outer step (``sync = "outer"``) as this peer saw it."""

    attempt: int
    committed: bool
    reason: str = ""
    contributors: int = 0
    cohorts: int = 0
    seconds: float = 0.0  # the exchange itself, start to outcome (overlapped: it ran in the background)
    blocked_seconds: float = 0.0  # what it held the round up: all of it blocking, the wait for it overlapped
    result_digest: str = ""  # the averaged pseudo-gradient's digest (what the commit board decided on)
    outer_digest: str = (
        ""  # global parameters and outer momentum after it: the same on every peer that committed
    )
    stages: dict[str, float] = field(default_factory=dict)


@dataclass
class RoundContext:
    """The collaborators of a round, built once by the agent. Callables are the agent's: the round
    asks for an averager and publishes states without knowing how those are kept."""

    task: TaskSpec
    train_config: TrainConfig
    peer_id: str
    identity: Identity
    dht: object
    roster: RosterView  # this peer's roster, every read merged into the earlier ones
    workers: WorkerPool
    progress: SwarmProgress
    announcer: Announcer
    outbox: ReceiptOutbox
    display: ProgressDisplay
    stop: threading.Event  # set by Ctrl-C: close the computation early, finish the round
    averager_for: Callable[[str], HierarchicalAverager]  # the averager of a cohort (kept across rounds)
    state_digest: Callable[[], str]  # digest of the state the round starts from
    state_round: Callable[[], int]  # the round that state is the result of
    publish_state: Callable[[int, int], None]  # (round, attempt): serve the state just committed
    seal_receipt: Callable[[ContributionReceipt], bytes | None]  # the wire bytes (None: honest seal)
    commits: RoundCommitter  # the rounds' board: posting, waiting, late commits, the attempt counter
    roster_size: int = 0  # peers online in the last round's roster (for the progress display)
    # sync = "outer": takes the outer step after every inner_steps rounds (None: every-step tasks)
    outer: OuterStepper | None = None
    # (when it was started, the read) of the roster for the next inner step, read while this one computes
    roster_ahead: tuple[float, Future] | None = None
    # tasks on an operator's dataset: the shards this peer trains on, fetched and cached (None: built-in data)
    data: DataFeed | None = None
    # the cohort directory the rounds plan from, where the task's aggregator publishes one (None: the roster)
    directory: DirectoryView | None = None


@dataclass(frozen=True)
class RoundWork:
    """What this peer brought to a round before averaging: its place, its host's contribution, what its
    receipt commits to, and the state it started from."""

    plan: RoundPlan
    host: HostContribution
    commitments: Commitments
    start_digest: str  # only from this state does the round's result make the step the others took
