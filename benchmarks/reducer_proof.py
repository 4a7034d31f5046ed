"""Reducers' proofs on the red team's real gradients: how far an honest reducer's own part lies from
the others (what :data:`robust_aggregation.reducer_proof.OWN_PART_FACTOR` must stay above), and how
large a shift a lying reducer can hide behind its best proof.

Gradients are the digits supernet's (the red team's task, :mod:`benchmarks.simulated_swarm`), one
per peer from its own sample stream, at several sample counts per group. Each round the vector is
cut into hivemind's 512 KiB robust parts; every part is reduced with CenteredClip and every sender
in turn is taken as its reducer:

- honest: the reducer's proof as :class:`~hivemind_adapter.robust_reduce.RobustPartReducer` makes
  it; every other member checks it (:func:`~robust_aggregation.reducer_proof.check_proof`); the own-part
  ratio of each reducer is recorded;
- lying: the result shifted by a random direction ``times`` the centre's length (the red team's
  ``noisy-reducer`` uses 10), with the liar's best proof
  (``tests/adversaries/dishonest_peer.covering_proof``: the others' entries true, its own part
  placed to balance the fixed point); "caught" means every honest member refuses it. The last
  column says what a shift of 1x the centre is worth: the centre's length over one honest peer's
  pull on the group's mean (how far leaving one peer out moves it), median over parts.

The model moves between rounds by the plain mean of three peers, as a swarm's would. Run:

    python -m benchmarks.reducer_proof [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from hivemind_adapter.runtime import prepare_process

prepare_process()

import torch  # noqa: E402

from benchmarks.simulated_swarm import swarm_workload  # noqa: E402
from robust_aggregation.centered_clip import RobustConfig, capped_weights, centered_clip  # noqa: E402
from robust_aggregation.reducer_proof import (  # noqa: E402
    OWN_PART_FACTOR,
    RESULT_FACTOR,
    PartProof,
    check_proof,
    every_members_doubt,
    make_proof,
    noise_level,
    own_part_ratio,
    pair_ratio,
    result_ratio,
    sketch_seed,
)
from supernet.contribution import compute_contribution  # noqa: E402
from supernet.state import init_optimizer_state  # noqa: E402
from supernet.training.optimizer import optimizer_step  # noqa: E402
from supernet.training.schedule import maybe_sort_channels, step_configs  # noqa: E402
from tests.adversaries.dishonest_peer import absent_member_proof, covering_proof  # noqa: E402

GROUPS = {
    "3 x 64": [64, 64, 64],
    "16/64/128": [16, 64, 128],
    "6 x 64": [64] * 6,
    "8/32/64/256": [8, 32, 64, 256],
}
SHIFTS = (10.0, 3.0, 1.0, 0.5, 0.25)  # the lie's length, in lengths of the centre
PART_VALUES = (
    2**19 // 4
)  # hivemind's robust part size (peer.averaging.factory.ROBUST_PART_SIZE_BYTES), in floats
CONFIG = RobustConfig()


def _cap(w: torch.Tensor) -> torch.Tensor:
    return capped_weights(w, CONFIG.max_weight_ratio)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    command = f"python -m benchmarks.reducer_proof {' '.join(sys.argv[1:])}".strip()
    load_before, started = os.getloadavg(), time.monotonic()
    print(f"$ {command}", flush=True)
    torch.set_num_threads(1)
    workload, task_seed = swarm_workload(0, 40)
    cfg = workload.cfg
    net = workload.build()
    optimizer = workload.make_optimizer(net)
    init_optimizer_state(net, optimizer)
    noise = torch.Generator().manual_seed(19)
    ratios: dict = {g: [] for g in GROUPS} | {(g, "result"): [] for g in GROUPS}
    false_refusals: list[str] = []
    caught: dict[tuple[str, float], list[bool]] = {}
    for round_index in range(args.rounds):
        maybe_sort_channels(net, round_index, cfg, optimizer)
        configs = step_configs(net, round_index, cfg)
        means: dict[tuple[int, int], torch.Tensor] = {}
        for group, samples in GROUPS.items():
            for peer, n in enumerate(samples):
                if (peer, n) not in means:
                    work = compute_contribution(
                        workload, net, configs, "cpu", task_seed, round_index, f"peer-{peer}",
                        go_on=lambda s, n=n: s < n,
                    )  # fmt: skip
                    means[(peer, n)] = torch.cat(
                        [t.detach().reshape(-1) / work.samples for t in work.numerator]
                    )
            vectors, weights = [means[(p, n)] for p, n in enumerate(samples)], [float(n) for n in samples]
            for start in range(0, vectors[0].numel(), PART_VALUES):
                parts = [v[start : start + PART_VALUES] for v in vectors]
                if parts[0].numel() < 1024:
                    continue
                _measure(group, round_index, start, parts, weights, noise, ratios, false_refusals, caught)
        plain = torch.stack([means[(p, 64)] for p in range(3)]).mean(0)
        offset = 0
        for p in net.parameters():
            p.grad = plain[offset : offset + p.numel()].reshape(p.shape).clone()
            offset += p.numel()
        optimizer_step(net, optimizer, round_index, cfg)
        print(
            f"round {round_index + 1}/{args.rounds} measured ({time.monotonic() - started:.0f} s)", flush=True
        )

    print(f"\nHonest reducers: own-part ratio (refused above {OWN_PART_FACTOR:g})")
    print(f"{'group (samples)':<16} {'proofs':>7} {'median':>7} {'99th pct':>9} {'max':>6} {'margin':>7}")
    for group in GROUPS:
        values = sorted(ratios[group])
        top = values[int(0.99 * (len(values) - 1))]
        print(f"{group:<16} {len(values):>7} {statistics.median(values):>7.2f} {top:>9.2f} {max(values):>6.2f} "
              f"{OWN_PART_FACTOR / max(values):>6.1f}x")  # fmt: skip
    print(f"\nHonest results: result ratio of each member (refused above {RESULT_FACTOR:g})")
    print(f"{'group (samples)':<16} {'members':>7} {'median':>7} {'99th pct':>9} {'max':>6} {'margin':>7}")
    for group in GROUPS:
        values = sorted(ratios[group, "result"])
        top = values[int(0.99 * (len(values) - 1))]
        print(f"{group:<16} {len(values):>7} {statistics.median(values):>7.2f} {top:>9.2f} {max(values):>6.2f} "
              f"{RESULT_FACTOR / max(values):>6.1f}x")  # fmt: skip
    print(f"honest proofs refused by an honest member: {len(false_refusals)}")
    for line in false_refusals[:5]:
        print("  " + line)
    print("\nLying reducers with their best proof: caught (every honest member refuses) / tried, and the")
    print("smallest own-part ratio its proof showed")
    print(
        f"{'group (samples)':<16} " + " ".join(f"{f'x{s:g}':>16}" for s in SHIFTS) + "   x1 in peers' pulls"
    )
    for group in GROUPS:
        cells = []
        for shift in SHIFTS:
            seen = caught[(group, shift)]
            cells.append(f"{sum(seen)}/{len(seen)} ({min(caught[(group, shift, 'ratio')]):.1f})")
        centre = statistics.median(caught[(group, "centre")])
        print(f"{group:<16} " + " ".join(f"{c:>16}" for c in cells) + f"   {centre:>10.1f}")
    print("\nThe same lies hidden behind a member that never checks (absent_member_proof: the liar's own")
    print("part true, the absent member's placed to balance): caught (every member left refuses) / tried,")
    print("and the smallest result ratio a checking member saw")
    print(f"{'group (samples)':<16} " + " ".join(f"{f'x{s:g}':>16}" for s in SHIFTS))
    for group in GROUPS:
        cells = []
        for shift in SHIFTS:
            seen = caught[(group, shift, "absent")]
            cells.append(f"{sum(seen)}/{len(seen)} ({min(caught[(group, shift, 'absent ratio')]):.1f})")
        print(f"{group:<16} " + " ".join(f"{c:>16}" for c in cells))
    honest_pairs = sorted(caught[("pair", "honest")])
    print(
        "\nA pair of heads (two cohorts of the '6 x 64' gradients), each holding the other to the noise its"
    )
    print(f"cohort stage measured: honest ratio median {statistics.median(honest_pairs):.2f}, max "
          f"{max(honest_pairs):.2f} over {len(honest_pairs)} (refused above {OWN_PART_FACTOR:g}); lies caught / tried (smallest ratio):")  # fmt: skip
    print("  " + "  ".join(
        f"x{s:g}: {sum(caught[('pair', s)])}/{len(caught[('pair', s)])} ({min(caught[('pair', s, 'ratio')]):.1f})"
        for s in SHIFTS
    ))  # fmt: skip
    _costs()
    print(f"\n$ {command}\nload average before: {load_before}   after: {os.getloadavg()}; "
          f"total {time.monotonic() - started:.0f} s on {os.cpu_count()} cores")  # fmt: skip


def _costs(repeats: int = 20) -> None:
    """What a proof costs beside the centre it proves: one 512 KiB part from 3 and 6 senders (time
    per part, one thread: the reducer's worker thread and a member's check run there) and bytes."""
    print(f"\nCost per 512 KiB part (one thread, median of {repeats})")
    print(f"{'senders':>8} {'CenteredClip ms':>16} {'make proof ms':>14} {'check proof ms':>15} {'proof bytes':>12} "
          f"{'of the part':>12}")  # fmt: skip
    g = torch.Generator().manual_seed(3)
    for senders in (3, 6):
        signal = torch.randn(PART_VALUES, generator=g)
        parts = [signal + torch.randn(PART_VALUES, generator=g) for _ in range(senders)]
        weights = [64.0] * senders
        clip_ms, make_ms, check_ms = [], [], []
        for _ in range(repeats):
            t0 = time.perf_counter()
            clip = centered_clip(parts, weights, CONFIG)
            t1 = time.perf_counter()
            seed = sketch_seed(b"cost", 0, clip.value)
            proof = make_proof(dict(enumerate(parts)), dict(enumerate(weights)), senders, clip.value, clip.radius,
                               clip.capped, clip.in_centre, seed)  # fmt: skip
            wire = proof.to_bytes()
            t2 = time.perf_counter()
            doubt = check_proof(PartProof.from_bytes(wire, senders), member=1, own_part=parts[1], own_weight=64.0,
                                reducer=0, result=clip.value, seed=sketch_seed(b"cost", 0, clip.value), cap_rule=_cap)  # fmt: skip
            t3 = time.perf_counter()
            assert doubt is None, doubt
            clip_ms.append(1e3 * (t1 - t0))
            make_ms.append(1e3 * (t2 - t1))
            check_ms.append(1e3 * (t3 - t2))
        print(f"{senders:>8} {statistics.median(clip_ms):>16.1f} {statistics.median(make_ms):>14.1f} "
              f"{statistics.median(check_ms):>15.1f} {len(wire):>12} {len(wire) / (4 * PART_VALUES):>11.2%}")  # fmt: skip


def _measure_pair(group, parts, weight, noise, caught) -> None:
    """Two cohorts of three (the red team's 2 sites) meet as a pair of heads: each head holds the
    other to the noise level its own cohort stage measured (``pair_ratio``)."""
    cohorts = [parts[:3], parts[3:]]
    references = []
    for members in cohorts:
        clip = centered_clip(members, [weight] * 3, CONFIG)
        seed = sketch_seed(b"cohort", 0, clip.value)
        proof = make_proof(dict(enumerate(members)), dict.fromkeys(range(3), weight), 3, clip.value, clip.radius,
                           clip.capped, clip.in_centre, seed)  # fmt: skip
        references.append(noise_level(proof))
    heads = [torch.stack(members).mean(0) for members in cohorts]
    weights = [3 * weight, 3 * weight]
    clip = centered_clip(heads, weights, CONFIG)

    def proof_of(result):
        seed = sketch_seed(b"pair", 0, result)
        return make_proof(dict(enumerate(heads)), dict(enumerate(weights)), 2, result, clip.radius, clip.capped,
                          clip.in_centre, seed), seed  # fmt: skip

    honest, seed = proof_of(clip.value)
    for reducer in (0, 1):
        caught.setdefault(("pair", "honest"), []).append(pair_ratio(honest, reducer, references[1 - reducer]))
    for shift in SHIFTS:
        for reducer in (0, 1):
            direction = torch.randn(clip.value.shape, generator=noise)
            told = clip.value + direction * (shift * clip.value.norm() / direction.norm())
            lie, seed = proof_of(told)
            covered = covering_proof(lie, reducer, told, seed)
            member = 1 - reducer
            doubt = check_proof(covered, member=member, own_part=heads[member], own_weight=weights[member],
                                reducer=reducer, result=told, seed=seed, cap_rule=_cap,
                                noise_reference=references[member])  # fmt: skip
            caught.setdefault(("pair", shift), []).append(doubt is not None)
            caught.setdefault(("pair", shift, "ratio"), []).append(
                pair_ratio(covered, reducer, references[member])
            )


def _measure(group, round_index, start, parts, weights, noise, ratios, false_refusals, caught) -> None:
    clip = centered_clip(parts, weights, CONFIG)
    context = f"{group}/{round_index}/{start}".encode()

    def proof_of(result):
        seed = sketch_seed(context, 0, result)
        proof = make_proof(dict(enumerate(parts)), dict(enumerate(weights)), len(parts), result, clip.radius,
                           clip.capped, clip.in_centre, seed)  # fmt: skip
        return proof, seed

    def doubts(proof, reducer, result, seed):
        return every_members_doubt(proof, parts, weights, reducer, result, seed, _cap)

    # the centre's length in units of one honest peer's pull on the mean (what x1 below amounts to)
    mean = torch.stack([p.double() for p in parts]).mean(0)
    pulls = [
        float(
            torch.linalg.vector_norm(
                mean - torch.stack([p.double() for j, p in enumerate(parts) if j != k]).mean(0)
            )
        )
        for k in range(len(parts))
    ]
    caught.setdefault((group, "centre"), []).append(float(clip.value.norm()) / statistics.median(pulls))
    if len(parts) == 6 and len(set(weights)) == 1:
        _measure_pair(group, parts, weights[0], noise, caught)
    honest, seed = proof_of(clip.value)
    for reducer in range(len(parts)):
        ratio = own_part_ratio(honest, reducer)
        if ratio is not None:
            ratios[group].append(ratio)
        for doubt in doubts(honest, reducer, clip.value, seed):
            if doubt is not None:
                false_refusals.append(
                    f"{group} round {round_index} values {start}+, reducer {reducer}: {doubt}"
                )
    for member, part in enumerate(parts):
        distance = float(torch.linalg.vector_norm(part.double() - clip.value.double()))
        ratio = result_ratio(honest, member, distance)
        if ratio is not None:
            ratios[group, "result"].append(ratio)
    for shift in SHIFTS:
        for reducer in range(len(parts)):
            direction = torch.randn(clip.value.shape, generator=noise)
            told = clip.value + direction * (shift * clip.value.norm() / direction.norm())
            lie, seed = proof_of(told)
            covered = covering_proof(lie, reducer, told, seed)
            refused = all(d is not None for d in doubts(covered, reducer, told, seed))
            caught.setdefault((group, shift), []).append(refused)
            caught.setdefault((group, shift, "ratio"), []).append(own_part_ratio(covered, reducer) or 0.0)
            # the same lie hidden behind a member that never checks: every member left refuses it
            absent = (reducer + 1) % len(parts)
            hidden = absent_member_proof(lie, absent, told, seed)
            verdicts = [d for m, d in enumerate(doubts(hidden, reducer, told, seed)) if m != absent]
            caught.setdefault((group, shift, "absent"), []).append(all(d is not None for d in verdicts))
            lowest = min(
                result_ratio(hidden, m, float(torch.linalg.vector_norm(parts[m].double() - told.double())))
                or 0.0
                for m in range(len(parts))
                if m not in (reducer, absent)
            )
            caught.setdefault((group, shift, "absent ratio"), []).append(lowest)


if __name__ == "__main__":
    main()
