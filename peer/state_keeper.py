"""The state a peer holds, serves and catches up with: :class:`StateKeeper`."""

from __future__ import annotations

import logging
from dataclasses import replace

import torch

from hivemind_adapter.p2p import Endpoint
from hivemind_adapter.state_archive import StateArchive
from peer.catch_up import anchored_rounds, anchored_state, committed_state, peer_tiebreak, trusted_round
from peer.commit.committer import RoundCommitter
from peer.outer_repair import missed_outer_state
from peer.outer_round import OuterStepper
from peer.roster_view import read_roster
from peer.swarm_progress import SwarmProgress
from peer.worker_pool import WorkerPool
from peer.worker_protocol import SharedBuffers
from protocol.cohort_assignment import assign_cohorts
from protocol.task_spec import TaskSpec
from supernet.outer_state import adopted_state, served_consensus, served_layout, split_served
from supernet.state import digest

logger = logging.getLogger("manta.peer")

MISSED_STEP_LOOKS = 3  # rounds that look for an outer step the others took and this peer missed


class StateKeeper:
    """What this peer's state is (``state_round``: the round it is the result of, -1 for the initial
    state; ``state_digest``), what it serves (the workers' state, with the outer state in outer
    tasks), and how it is replaced by the swarm's: catch-up (:meth:`catch_up`) and outer steps this
    peer missed (:meth:`take_missed_outer_step`). Only the round loop's thread uses it."""

    def __init__(
        self,
        task: TaskSpec,
        dht,
        endpoint: Endpoint,
        peer_id: str,
        shared: SharedBuffers,
        consensus: int,
        workers: WorkerPool,
        outer: OuterStepper | None,
        archive: StateArchive,
        commits: RoundCommitter,
        progress: SwarmProgress,
    ):
        self.task, self.dht, self.endpoint, self.peer_id = task, dht, endpoint, peer_id
        self.shared, self.consensus, self.workers, self.outer = shared, consensus, workers, outer
        self.archive, self.commits, self.progress = archive, commits, progress
        self.tiebreak = peer_tiebreak(peer_id)
        self.state_round = -1
        self.state_digest = digest(self.served()[: self.served_consensus()])
        # (attempt, looks left) of an outer exchange the others may have committed without this peer
        self.missed_outer: tuple[int, int] | None = None

    def committed(self, round_index: int) -> None:
        """The round loop applied the result of ``round_index``: the state is now that round's."""
        self.state_round = round_index

    def served(self) -> list[torch.Tensor]:
        """What this peer serves and digests (:func:`supernet.outer_state.served_layout`)."""
        return served_layout(self.shared.state, self.consensus, self.outer.state if self.outer else None)

    def served_consensus(self) -> int:
        return served_consensus(self.consensus, self.outer.state if self.outer else None)

    def publish(self, round_index: int, attempt: int) -> None:
        """Keep the current state, by digest, for whoever needs it (catch-up, audits, checkpoints)."""
        served = self.served()
        self.state_digest = digest(served[: self.served_consensus()])
        self.archive.add(round_index, attempt, self.state_digest, served, self.served_consensus())

    def catch_up(self) -> bool:
        """Adopt the newest state a quorum committed, fetched from all the peers that hold it
        (:mod:`peer.catch_up`); when the board knows none, the newest state an aggregator of the
        task anchored. Either only if it is ahead of ours (a newer round, or
        the same round and a quorum's result or the fixed tie-break's winner). Returns whether the
        state was replaced; the attempt counter moves past the attempt that produced it."""
        task_id, board = self.task.task_id, self.commits.board
        roster = self.catch_up_roster()
        result, got = committed_state(
            board, roster, self.endpoint, task_id, self.served(), self.served_consensus(), self.state_digest
        )
        if result is not None and result.digest == self.state_digest:
            self.commits.skip_past(result.attempt)
            return False  # this peer holds what the swarm committed last
        if result is None and self.outer is not None:
            # Between outer steps each cohort holds its own state: the newest state one of its own
            # peers reports wins over another cohort's.
            result, got = committed_state(
                board, roster, self.endpoint, task_id, self.served(), self.served_consensus(), self.state_digest,
                any_holder=True,
            )  # fmt: skip
            if result is not None and result.digest == self.state_digest:
                return False
        if got is None:
            got = anchored_state(
                self.dht, self.task, self.endpoint, self.served(), self.served_consensus(), self.state_digest
            )
        if got is None:
            return False
        quorum = result is not None and got.digest == result.digest
        anchored: int | None = None
        if not quorum and got.digest != self.state_digest:
            anchored = anchored_rounds(self.dht, self.task).get(got.digest)
            if anchored is None:
                logger.warning(
                    f"a state served by one node (round {got.round}, digest {got.digest[:12]}) that no quorum "
                    "committed and no aggregator anchored: not loaded"
                )
                return False
        round_index = trusted_round(got.round, anchored, self.progress.swarm_round())
        if round_index != got.round:
            logger.warning(
                f"a state served as the result of round {got.round} (digest {got.digest[:12]}) is taken for "
                f"round {round_index}: its round is not its server's to say"
            )
            got = replace(got, round=round_index)
        self.commits.skip_past(got.attempt)  # whatever we keep, the swarm has moved past that attempt
        if got.digest == self.state_digest or (got.round, got.tiebreak) <= (self.state_round, self.tiebreak):
            return False
        worker_state, outer = split_served(
            got.tensors, self.consensus, len(self.shared.state), len(self.shared.grads)
        )
        if (outer is None) != (self.outer is None):
            logger.warning("a served state of another synchronisation mode: ignored")
            return False
        own_cohort = quorum  # in outer tasks the catch-up roster is this peer's cohort
        worker_state, outer = adopted_state(
            worker_state, outer, self.shared.state, self.outer.state if self.outer else None, self.consensus,
            own_cohort,
        )  # fmt: skip
        self.workers.load(worker_state)
        if self.outer is not None:
            self.outer.replace_state(outer)
        self.state_round = got.round
        self.publish(got.round, got.attempt)
        source = f"from {len(result.holders)} holder(s)" if quorum else "anchored by the aggregator"
        logger.info(f"loaded the swarm's state after round {got.round} (digest {got.digest[:12]}, {source})")
        return True

    def catch_up_roster(self) -> list[str]:
        """Whose committed states this peer may catch up with: the roster; in outer tasks only its
        cohort's peers (between outer steps each cohort holds its own state), when it has one."""
        entries = [p.entry for p in read_roster(self.dht, self.task)]
        roster = [e.peer_id for e in entries]
        if self.outer is None:
            return roster
        assignment = assign_cohorts(entries, self.task.params.max_group_size)
        mine = assignment.get(self.peer_id)
        return roster if mine is None else [p for p in roster if assignment.get(p) == mine]

    def note_outer_step(self, attempt: int, committed: bool) -> None:
        """An outer exchange ended here: if it did not commit, the others may have taken it, and the
        next :data:`MISSED_STEP_LOOKS` rounds look for the state they reached."""
        self.missed_outer = None if committed else (attempt, MISSED_STEP_LOOKS)

    def take_missed_outer_step(self, outer_board) -> None:
        """Before a round, after an outer exchange that did not commit here: if the others committed
        it, take the outer state they reached (:mod:`peer.outer_repair`); look at most
        :data:`MISSED_STEP_LOOKS` times (overlapped, they serve it a round later)."""
        if self.missed_outer is None or self.outer is None:
            return
        attempt, tries = self.missed_outer
        self.missed_outer = (attempt, tries - 1) if tries > 1 else None
        try:
            roster = [p.entry.peer_id for p in read_roster(self.dht, self.task)]
            reached = missed_outer_state(
                outer_board, self.commits.board, self.endpoint, self.task.task_id, attempt, roster, self.peer_id,
                self.outer.outer_digest(), self.served(), self.served_consensus(),
                (self.consensus, len(self.shared.state), len(self.outer.state.anchor)),
            )  # fmt: skip
        except Exception as e:  # the DHT may fail a read; the next round looks again
            logger.debug(f"could not look for outer step {attempt}'s state: {e}")
            return
        if reached is None:
            return
        self.outer.adopt_global(reached.global_params, reached.momentum)
        self.missed_outer = None
        self.publish(self.state_round, self.commits.attempt)
        logger.info(
            f"outer step (attempt {attempt}) missed here: took the outer state the others reached "
            f"({self.outer.outer_digest()[:12]})"
        )
