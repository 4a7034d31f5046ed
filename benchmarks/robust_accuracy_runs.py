"""One run of the paired accuracy benchmark (:mod:`benchmarks.robust_accuracy`): a row (how the
six simulated peers' gradients are aggregated, and what peer 5 sends) trained from one seed for a
number of rounds, and what it measured.

:func:`run` takes a :class:`Row`, a seed and a round count and returns a :class:`RunResult`. A
(row, seed, rounds) triple gives the same bits every time when torch runs on one thread: every
random draw comes from an explicit generator. Rows differ only in the aggregation and in what peer 5
sends.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

# simulated_swarm prepares the process for hivemind (hivemind_adapter.runtime) before it is imported
from benchmarks.simulated_swarm import (
    ATTACKER,
    PEERS,
    PER_PEER,
    AllReduce,
    Influence,
    all_reduce,
    group_order,
    influence,
    peer_mean,
    swarm_workload,
)
from robust_aggregation.alignment import AlignmentRecord
from supernet.state import digest, init_optimizer_state, state_tensors
from supernet.training.optimizer import optimizer_step
from supernet.training.schedule import maybe_sort_channels, step_configs

KINDS = ("largest", "smallest")


@dataclass(frozen=True)
class Row:
    """One way of aggregating: robust (CenteredClip) or plain, an attack by peer 5 or none, and how
    many peers take part (``clean-5``: the five honest ones alone)."""

    name: str
    robust: bool
    attack: str | None = None
    peers: int = PEERS


def rows_for(attacks: Sequence[str], clean_5: bool) -> list[Row]:
    """The table's rows: clean, plain, ``clean-5`` if asked, each attack robust, then each under the
    plain mean."""
    rows = [Row("clean", True), Row("plain", False)]
    if clean_5:
        rows.append(Row("clean-5", True, peers=PEERS - 1))
    rows += [Row(a, True, a) for a in attacks]
    return rows + [Row(f"plain+{a}", False, a) for a in attacks]


@dataclass
class RunResult:
    """What one (row, seed) run measured."""

    row: str
    seed: int
    accuracy: dict[str, float]  # largest / smallest, in %
    wall: float
    digest: str  # of the final parameters and optimizer state: the determinism check compares these
    skipped: list[int] = field(default_factory=list)  # rounds whose average was refused (not finite)
    diverged_at: int | None = None  # the round after whose step the parameters were no longer finite
    # Values the attacker sent in parts that were not all zeros (a zero part, which the supernet's
    # unused weights give, is the same flipped or scaled: no attack there), the roll left out ...
    attacker_values: int = 0
    attacker_excluded: int = 0  # ... of which a reducer's AlignmentRecord had it left out
    attacker_named: int = 0  # ... of which a reducer refused or named it (ClipResult.outliers)
    attacker_dropped: int = 0  # ... of which a reducer dropped it without naming it (ClipResult.dropped)
    first_kept_out: int | None = None  # the first round any reducer excluded or named it
    first_refused_receipt: int | None = None  # the first round two reducers named it (its receipt refused)
    honest_named: int = 0  # (round, reducer, honest sender) namings, outliers or excluded
    honest_refused_receipts: int = 0  # (round, honest sender) pairs named by two reducers or more
    honest_replies_refused: int = 0  # replies an honest member's reply check would have refused
    honest_dropped: int = 0  # (round, reducer, honest sender, part) drops without naming
    honest_result_ratio: float = 0.0  # the largest result ratio (proof point 6) an honest member saw
    influence: list[Influence] = field(default_factory=list)  # per applied round, with an attacker


def run(row: Row, seed: int, rounds: int) -> RunResult:
    """Train ``rounds`` rounds with ``row``'s aggregation from ``seed``'s task; evaluate the result."""
    started = time.monotonic()
    workload, task_seed = swarm_workload(seed, rounds)
    cfg = workload.cfg
    net = workload.build()
    optimizer = workload.make_optimizer(net)
    init_optimizer_state(net, optimizer)
    params = list(net.parameters())
    peers = list(range(row.peers))
    records = {p: AlignmentRecord() for p in peers} if row.robust else None
    result = RunResult(row.name, seed, {}, 0.0, "")
    for round_index in range(rounds):
        maybe_sort_channels(net, round_index, cfg, optimizer)  # peer/worker.py, before its compute
        configs = step_configs(net, round_index, cfg)  # data-parallel: every peer the same sub-networks
        order = group_order(row.peers, seed, round_index)
        attacker = order.index(ATTACKER) if row.attack else None
        honest: list[list[torch.Tensor]] = [[] for _ in order]
        means: list[list[torch.Tensor]] = [[] for _ in order]
        # the attacker's first: computing a gradient moves batch norm's running statistics in the
        # shared model, so the order is part of what makes a run repeat bit for bit
        first = [] if attacker is None else [attacker]
        for position in first + [i for i in range(len(order)) if i != attacker]:
            peer = order[position]
            honest[position], means[position] = peer_mean(
                workload, net, configs, task_seed, round_index, peer, row.attack if peer == ATTACKER else None
            )
        if (
            attacker is not None
            and not row.robust
            and not all(bool(torch.isfinite(t).all()) for t in means[attacker])
        ):
            result.skipped.append(round_index)  # a plain mean with a NaN in it: nothing is applied
            continue
        names = [f"peer-{p}" for p in order]
        reduced = all_reduce(
            means, [float(PER_PEER)] * len(order), row.robust,
            [records[p] for p in order] if records is not None else None, names,
        )  # fmt: skip
        count_round(result, reduced, round_index, attacker)
        if reduced.average is None:
            result.skipped.append(round_index)
            continue
        if attacker is not None:
            result.influence.append(influence(round_index, reduced.average, honest, attacker))
        for p, g in zip(params, reduced.average):  # peer/worker.py, Apply
            p.grad = g.clone()
        optimizer_step(net, optimizer, round_index, cfg)
        if not all(bool(torch.isfinite(p).all()) for p in params):
            # Every later gradient is computed through these weights (every sub-network of the
            # sandwich shares them), so none would be finite and no later step would be applied.
            result.diverged_at = round_index
            break
    result.digest = digest(state_tensors(net, optimizer))
    rows = workload.evaluate(net, {"largest": net.largest_config(), "smallest": net.smallest_config()})
    result.accuracy = {r["name"]: 100.0 * float(r[workload.metric_name]) for r in rows}
    result.wall = time.monotonic() - started
    return result


def count_round(result: RunResult, reduced: AllReduce, round_index: int, attacker: int | None) -> None:
    """Add one round's namings (robust rows) to ``result``."""
    n = len(reduced.excluded)
    for s in range(n):
        reducers = sum(s in reduced.named(r) for r in range(n))
        if s == attacker:
            if reducers and result.first_kept_out is None:
                result.first_kept_out = round_index
            if reducers >= 2 and result.first_refused_receipt is None:
                result.first_refused_receipt = round_index
            continue
        result.honest_named += reducers
        result.honest_dropped += sum(len(reduced.dropped[r].get(s, ())) for r in range(n))
        result.honest_refused_receipts += reducers >= 2
        result.honest_replies_refused += reduced.replies_refused[s]
        result.honest_result_ratio = max(result.honest_result_ratio, reduced.result_ratios[s])
    if attacker is None:
        return
    for r in range(n):
        sizes, live = reduced.sizes[r], reduced.live[r][attacker]
        sent = sum(sizes[j] for j in live)
        result.attacker_values += sent
        if attacker in reduced.excluded[r]:
            result.attacker_excluded += sent
        else:
            named, dropped = reduced.outliers[r].get(attacker, ()), reduced.dropped[r].get(attacker, ())
            result.attacker_named += sum(sizes[j] for j in named if j in live)
            result.attacker_dropped += sum(sizes[j] for j in dropped if j in live)
