"""Six peers of the red team's swarm, simulated in one process: what
:mod:`benchmarks.robust_accuracy` trains with.

The pieces are the swarm's own: the task as the aggregator publishes it and a worker builds it, each
peer's gradient from its own sample stream (``compute_contribution``), what a dishonest peer sends
(``tests/adversaries/dishonest_peer.poisoned``), hivemind's partition of the cohort averager's
tensors among the reducers, and MANTA's robust reducer with each reducer's alignment record, as
:class:`~hivemind_adapter.exact_runner.ExactAllReduceRunner` builds them. What is left out is what
needs a network: timing, matchmaking, retries, the members' reply record. Every random draw comes
from an explicit generator, so a run repeats bit for bit.
"""

from __future__ import annotations

import asyncio
import math
import random
import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from hivemind_adapter.runtime import prepare_process

prepare_process()

import torch  # noqa: E402
from hivemind.averaging.load_balancing import load_balance_peers  # noqa: E402
from hivemind.averaging.partition import TensorPartContainer, TensorPartReducer  # noqa: E402

from aggregator.task_publication import build_task_spec  # noqa: E402
from hivemind_adapter.robust_reduce import RobustPartReducer  # noqa: E402
from peer.averaging.factory import PART_SIZE_BYTES, ROBUST_PART_SIZE_BYTES  # noqa: E402
from peer.averaging.known_cohort import new_roll  # noqa: E402
from protocol.identity import Identity  # noqa: E402
from robust_aggregation.alignment import MIN_VALUES, AlignmentRecord  # noqa: E402
from robust_aggregation.centered_clip import RobustConfig  # noqa: E402
from robust_aggregation.reducer_proof import RESULT_FACTOR, reference_rank  # noqa: E402
from robust_aggregation.reply_check import implausible_reply  # noqa: E402
from supernet.contribution import compute_contribution  # noqa: E402
from supernet.workload import Workload, swarm_train_options, workload_for  # noqa: E402
from testbed.local_swarm import SwarmOptions, task_toml  # noqa: E402
from tests.adversaries.dishonest_peer import poisoned  # noqa: E402

PEERS, ATTACKER = 6, 5
TARGET_SAMPLES = 384  # the red team's samples a round
PER_PEER = TARGET_SAMPLES // PEERS  # 64: two mini-batches of 32


def swarm_workload(seed: int, rounds: int) -> tuple[Workload, int]:
    """The red team's task (its ``SwarmOptions``, with ``seed`` and a schedule of ``rounds``) as the
    aggregator publishes it and a peer's workers build it; and the task's seed."""
    options = SwarmOptions(
        peers=PEERS, rounds=rounds, target_samples=TARGET_SAMPLES, batch_size=32, subnets=2,
        width_mult="0.25", head_channels=64, seed=seed,
    )  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "task.toml"
        path.write_text(task_toml(options))
        spec = build_task_spec(str(path), Identity.generate())
    return workload_for(spec.task, swarm_train_options(spec)), spec.seed


def group_order(peers: int, seed: int, round_index: int) -> list[int]:
    """The round's group order (a hivemind leader shuffles its group; here from a seeded generator,
    the same in every row): position i sends as sender i and reduces the i-th share of the vector."""
    order = list(range(peers))
    random.Random(f"robust-accuracy/{seed}/{round_index}").shuffle(order)
    return order


def peer_mean(
    workload: Workload,
    net: torch.nn.Module,
    configs,
    task_seed: int,
    round_index: int,
    peer: int,
    attack: str | None,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """``peer``'s per-sample mean gradient, and what it sends into the round's all-reduce: the same,
    or, for the attacker, the mean of what ``dishonest_peer.poisoned`` makes of its numerator."""
    work = compute_contribution(
        workload, net, configs, "cpu", task_seed, round_index, f"peer-{peer}",
        go_on=lambda s: s < PER_PEER,
    )  # fmt: skip
    factor = 1.0 / work.samples  # peer.averaging.buffers.to_own_mean
    honest = [n.detach() * factor for n in work.numerator]
    if attack is None:
        return honest, honest
    if attack == "nan":  # all NaN whatever it computed
        return honest, [torch.full_like(n, math.nan) for n in honest]
    return honest, [n.detach() * factor for n in poisoned(attack, work.numerator)]


@dataclass(frozen=True)
class Influence:
    """How far one round's applied update lies from what the honest gradients of that very round and
    state call for: a measure of the attack that the drift between trajectories does not blur.
    ``pull``: the distance of the update from the honest five's mean, in units of the distance an
    honest sixth peer's gradient moves that mean (1.0: the attacker moved the update as far as one
    honest peer does; 0: not at all). ``deviation``: its distance from the six honest gradients'
    mean (the clean update), relative to that mean's norm; ``one_peer``: the same for the honest
    five's mean (what one honest peer's leaving changes)."""

    round: int
    pull: float
    deviation: float
    one_peer: float


def influence(
    round_index: int, update: Sequence[torch.Tensor], honest: Sequence[list[torch.Tensor]], attacker: int
) -> Influence:
    """The :class:`Influence` of ``update`` given every position's honest mean gradient."""
    flat = [torch.cat([t.reshape(-1).double() for t in means]) for means in honest]
    five = torch.stack([f for i, f in enumerate(flat) if i != attacker]).mean(0)
    six = torch.stack(flat).mean(0)
    applied = torch.cat([t.reshape(-1).double() for t in update])
    step = float(torch.linalg.vector_norm(six - five))
    size = float(torch.linalg.vector_norm(six))
    return Influence(
        round_index,
        float(torch.linalg.vector_norm(applied - five)) / step if step > 0 else math.nan,
        float(torch.linalg.vector_norm(applied - six)) / size if size > 0 else math.nan,
        step / size if size > 0 else math.nan,
    )


@dataclass
class AllReduce:
    """One round's all-reduce as every member sees it (exact: every member receives the same bytes)."""

    average: list[torch.Tensor] | None  # None: it failed, or its result is not finite
    # per reducer position:
    excluded: list[frozenset[int]]  # the sender positions its record had it leave out
    outliers: list[dict[int, set[int]]]  # per sender position, the parts it refused or named
    sizes: list[list[int]]  # each part's values (the roll's part counted as 0)
    live: list[list[set[int]]]  # per sender position, its parts that were not all zeros
    # per sender position:
    replies_refused: list[int]  # remote replies its reply check (or proof's point 6) would have refused
    # the largest result ratio (robust_aggregation.reducer_proof, point 6: exact distances, not sketched)
    # it saw in a remote reply, over parts of at least MIN_VALUES values
    result_ratios: list[float] = field(default_factory=list)
    # per reducer position, per sender position: the parts it dropped (beyond RobustConfig.drop_factor
    # radii) without naming the sender
    dropped: list[dict[int, set[int]]] = field(default_factory=list)

    def named(self, r: int) -> set[int]:
        """The senders reducer ``r`` names in its commit report (ExactAllReduceRunner.outlier_senders)."""
        return set(self.outliers[r]) | set(self.excluded[r])


def _result_ratio(
    parts: Sequence[torch.Tensor], weights: Sequence[float], member: int, result: torch.Tensor
) -> float:
    """Point 6 of a reducer's proof as ``member`` would see it (exact distances; 0 where it says
    nothing: a part too short to measure, or fewer than two other senders with a weight)."""
    if result.numel() < MIN_VALUES or weights[member] <= 0:
        return 0.0
    own = parts[member].double().reshape(-1)
    gaps = sorted(
        float(torch.linalg.vector_norm(own - parts[t].double().reshape(-1)))
        for t in range(len(parts))
        if t != member and weights[t] > 0 and bool(torch.isfinite(parts[t]).all())
    )
    if len(gaps) < 2 or (reference := gaps[reference_rank(len(gaps))]) <= 0:
        return 0.0
    return (float(torch.linalg.vector_norm(own - result.double().reshape(-1))) / reference) ** 2


def all_reduce(
    means: Sequence[list[torch.Tensor]],
    weights: Sequence[float],
    robust: bool,
    records: Sequence[AlignmentRecord] | None,
    names: Sequence[str],
) -> AllReduce:
    """Average ``means`` (by sender position) as one group's butterfly all-reduce does: hivemind's
    partition of the cohort averager's tensors (the gradient, then the roll of sample counts), each
    reducer's share reduced by MANTA's robust reducer (or hivemind's plain one), its
    ``records[position]`` consulted before and fed after, as ``ExactAllReduceRunner`` does."""
    n = len(means)
    tensors = [
        [*m, new_roll()] for m in means
    ]  # peer.averaging.factory's cohort averager holds the roll last
    total = sum(t.numel() for t in tensors[0])
    fractions = load_balance_peers(total, [None] * n)
    part_size = ROBUST_PART_SIZE_BYTES if robust else PART_SIZE_BYTES
    return asyncio.run(_all_reduce(tensors, fractions, part_size, weights, robust, records, names))


async def _all_reduce(tensors, fractions, part_size, weights, robust, records, names) -> AllReduce:
    # one thread for CenteredClip (RobustPartReducer runs it in the loop's executor)
    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=1))
    n = len(tensors)
    containers = [TensorPartContainer(t, fractions, part_size_bytes=part_size) for t in tensors]
    parts = [[c.get_raw_input_parts(r) for r in range(n)] for c in containers]  # [sender][reducer]
    holds_roll = max(r for r in range(n) if containers[0].num_parts_by_peer[r] > 0)
    live = [
        [{j for j, part in enumerate(parts[s][r]) if bool((part != 0).any())} for s in range(n)]
        for r in range(n)
    ]
    out = AllReduce(
        None, [frozenset()] * n, [{} for _ in range(n)], [[] for _ in range(n)], live, [0] * n, [0.0] * n,
        [{} for _ in range(n)],
    )  # fmt: skip
    replies: list[list[torch.Tensor]] = []
    failed = False
    for r in range(n):
        shapes = [p.shape for p in parts[0][r]]
        if not shapes:
            replies.append([])
            continue
        slotted = [len(shapes) - 1] if r == holds_roll else []
        out.sizes[r] = [0 if j in slotted else shape.numel() for j, shape in enumerate(shapes)]
        if robust:
            suspects = records[r].suspects()
            excluded = [i for i, name in enumerate(names) if name in suspects]
            reducer = RobustPartReducer(
                shapes, n, RobustConfig(), excluded=excluded, min_aligned_values=MIN_VALUES,
                slotted_parts=slotted,
            )  # fmt: skip
        else:
            reducer = TensorPartReducer(shapes, n)

        async def send(s: int, reducer=reducer, r=r) -> list[torch.Tensor]:
            return [
                await reducer.accumulate_part(s, j, part, weight=weights[s])
                for j, part in enumerate(parts[s][r])
            ]

        gathered = await asyncio.gather(*(send(s) for s in range(n)), return_exceptions=True)
        results: list[list[torch.Tensor]] | None = gathered
        if any(isinstance(g, BaseException) for g in gathered):  # no usable part (robust), say
            failed, results = True, None  # the all-reduce fails for every member
        if robust:
            out.excluded[r] = reducer.excluded
            out.outliers[r] = {s: set(indices) for s, indices in reducer.outliers.items()}
            out.dropped[r] = {s: set(indices) for s, indices in reducer.dropped.items()}
            for cosines in reducer.alignments:  # ExactAllReduceRunner.note_alignments
                records[r].note_part({names[i]: c for i, c in cosines.items()})
        if results is None:
            replies.append([])
            continue
        replies.append(results[0])  # every sender was given the same tensors
        if robust:  # what each member's check (robust_aggregation.reply_check) says of a remote reply
            for s in range(n):
                if s != r:
                    out.replies_refused[s] += sum(
                        implausible_reply(own, reply, MIN_VALUES) is not None
                        for own, reply in zip(parts[s][r], results[s])
                    )
                    for j, reply in enumerate(results[s]):
                        ratio = _result_ratio([parts[t][r][j] for t in range(n)], weights, s, reply)
                        out.result_ratios[s] = max(out.result_ratios[s], ratio)
                        out.replies_refused[s] += ratio > RESULT_FACTOR
    if failed:
        return out
    flat = [part for share in replies for part in share]
    average, index = [], 0
    for tensor, count in zip(tensors[0][:-1], containers[0].num_parts_by_tensor):
        pieces = [p.reshape(-1) for p in flat[index : index + count]]
        average.append(torch.cat(pieces).reshape(tensor.shape).to(tensor.dtype))
        index += count
    if all(bool(torch.isfinite(t).all()) for t in average):  # VerifiedAverager applies nothing else
        out.average = average
    return out
