"""A reducer that sends each member a proof of its own: every member's check passes (each proof is true
about that member), so only the reducer's signed digests, compared across members, show the lie."""

from __future__ import annotations

import functools
import math

import pytest
import torch

from hivemind_adapter.allreduce import VerifiedAverager
from hivemind_adapter.dht import speaker
from hivemind_adapter.group_keys import DeclarationSigner
from hivemind_adapter.known_groups import known_group_id
from protocol.identity import Identity
from protocol.proof_attestation import find_equivocation, proofs_fingerprint
from robust_aggregation.centered_clip import RobustConfig, capped_weights, centered_clip
from robust_aggregation.reducer_proof import every_members_doubt, make_proof, sketch_seed
from tests.adversaries.dishonest_peer import NOISE_TIMES, covering_proof, equivocating_proof, lying_averager
from tests.hivemind_adapter.averager_group import (
    ALLREDUCE_TIMEOUT,
    ARRIVAL_TIMEOUT,
    step_known_group_repeatedly,
)

CONFIG = RobustConfig()
CAP = functools.partial(capped_weights, max_weight_ratio=CONFIG.max_weight_ratio)
GROUPS = {"three": [64, 64, 64], "four mixed": [8, 32, 64, 256], "six": [64] * 6}


def _means(samples: list[int], size: int, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    signal = 0.3 * torch.randn(size, generator=g)
    return [signal + torch.randn(size, generator=g) / math.sqrt(n) for n in samples]


def _noisy(result: torch.Tensor, times: float) -> torch.Tensor:
    direction = torch.randn(result.shape, generator=torch.Generator().manual_seed(1))
    return result + direction * (
        times * torch.linalg.vector_norm(result) / torch.linalg.vector_norm(direction)
    )


@pytest.mark.parametrize("group", GROUPS)
def test_a_proof_for_each_member_passes_that_members_check_where_one_proof_for_all_is_refused(group):
    samples = GROUPS[group]
    parts, weights = _means(samples, 20_000, seed=5), [float(n) for n in samples]
    clip = centered_clip(parts, weights, CONFIG)
    told = _noisy(clip.value, NOISE_TIMES)  # the red team's noisy lie: ten times the centre's length
    seed = sketch_seed(b"test", 0, told)
    honest = make_proof(dict(enumerate(parts)), dict(enumerate(weights)), len(parts), told, clip.radius,
                        clip.capped, clip.in_centre, seed)  # fmt: skip
    for reducer in range(len(parts)):
        # one proof for everyone: the best cover is refused by every member
        covered = covering_proof(honest, reducer, told, seed)
        assert all(
            d is not None for d in every_members_doubt(covered, parts, weights, reducer, told, seed, CAP)
        )
        # a proof per member: each member's own check passes
        members = [m for m in range(len(parts)) if m != reducer]
        told_each = {m: equivocating_proof(honest, m, told, seed) for m in members}
        for m in members:
            doubts = every_members_doubt(told_each[m], parts, weights, reducer, told, seed, CAP)
            assert doubts[members.index(m)] is None, (m, doubts)
        assert len({told_each[m].to_bytes() for m in members}) == len(members)


def _signed_averager(identities: list[Identity], kinds: list[type[VerifiedAverager]]):
    return (
        lambda i: dict(robust=CONFIG),
        lambda i: kinds[i],
        lambda i, dht: DeclarationSigner("equivocation-test", speaker(dht, identities[i])),
    )


def _step_and_attest(i: int, averager: VerifiedAverager, peer_ids: list[str], group) -> object:
    try:
        averager.step_in_known_group(
            group, sorted(peer_ids), weight=1.0, arrival_timeout=ARRIVAL_TIMEOUT,
            allreduce_timeout=ALLREDUCE_TIMEOUT,
        )  # fmt: skip
        outcome = None
    except Exception as e:
        outcome = e
    return outcome, averager.take_attestations()


@pytest.mark.parametrize("liar", [False, True])
def test_real_averagers_take_an_equivocating_reducers_lie_and_its_own_signatures_show_it(liar):
    """Four real averagers with MANTA keys, the last an honest reducer or one that tells the noise lie
    with a proof per member. Honest: every member holds the same signed attestations (one per
    reducer, its own included), so their fingerprints agree. The liar: every honest member accepts
    its parts (the lie is written), and the attestations they hold convict it under its own key."""
    size = 4
    parts = _means([64] * size, 4 * 65536, seed=8)
    identities = [Identity.generate() for _ in range(size)]
    kinds = [VerifiedAverager] * (size - 1) + [lying_averager("equivocate") if liar else VerifiedAverager]
    kwargs, types, signer = _signed_averager(identities, kinds)

    def take_step(i, averager, peer_ids):
        return _step_and_attest(i, averager, peer_ids, known_group_id("equivocation", *sorted(peer_ids)))

    history, peer_ids = step_known_group_repeatedly(
        size,
        1,
        lambda i: [parts[i]],
        kwargs,
        types,
        take_step=take_step,
        signer=signer,
        part_size_bytes=256 * 1024,
        prefix=f"equivocation-{liar}",
    )
    results, outcomes, _named = history[0]
    keys = {p: identities[i].public_key_hex for i, p in enumerate(peer_ids)}
    honest = range(size - 1)
    assert all(outcomes[i][0] is None for i in honest), [outcomes[i][0] for i in honest]
    attested = {peer_ids[i]: outcomes[i][1] for i in range(size)}
    assert all(torch.equal(results[i][0], results[0][0]) for i in honest)
    mean = sum(parts) / size
    off = float(torch.linalg.vector_norm(results[0][0] - mean) / torch.linalg.vector_norm(mean))
    # what the honest members hold (a liar would not post its own words against itself)
    found = find_equivocation(((peer_ids[i], attested[peer_ids[i]]) for i in honest), keys)
    if not liar:
        assert off < 1e-5, off
        assert found is None
        assert all(a.verifies(keys[a.reducer]) for held in attested.values() for a in held)
        tokens = {p: [a.to_token() for a in held] for p, held in attested.items()}
        assert all(len(t) == size for t in tokens.values()), tokens  # one per reducer
        assert len({proofs_fingerprint("ab" * 32, t) for t in tokens.values()}) == 1
    else:
        assert off > 1.0, f"the lie did not get through ({off:.2f}): nothing to show"
        assert found is not None and found.reducer == peer_ids[-1], found
        assert found.first.verifies(keys[found.reducer]) and found.second.verifies(keys[found.reducer])
