"""A reducer's account of one part's robust centre, and each member's check of it (BTARD's idea of
verifying reducers by random projections, made to fit MANTA's butterfly all-reduce).

A reducer decides its part's result for every member alike. The member-side checks of
:mod:`robust_aggregation.reply_check` bound a reply by the part the member sent (its length, its
direction), but a reducer that adds a random direction a few times the centre's length to every
result passes them all.

What an honest result is: the CenteredClip fixed point. With ``c`` the result, ``r`` the radius,
``w_i`` the capped weights of the parts in the centre and ``a_i = min(1, r / |x_i - c|)``,

    sum_i  w_i a_i (x_i - c) = 0          (exactly a weighted mean where no part is clipped)

No member holds the others' parts, but the equation survives a linear projection ``S``. So with every
reply the reducer sends a :class:`PartProof`: the radius, each sender's weight, capped weight and
distance ``|x_i - c|``, and each sender's part projected by a count sketch ``S`` of
:data:`SKETCH_SIZE` buckets, whose seed is drawn from the result's own bytes (the reducer cannot pick
a result whose error the sketch misses: changing the result changes the sketch). Each member then
checks (:func:`check_proof`):

1. its own entry: the weight it sent, its part's sketch and its distance to the result, exactly;
2. the capped weights follow the cap rule from the weights listed;
3. the projected fixed point holds: ``|sum_i w_i a_i (S x_i - S c)|`` is a rounding error of the
   forces ``sum_i |w_i a_i (S x_i - S c)|`` (plus what the wire's codec may round);
4. no listed distance is far from its sketch's (a sketch keeps a vector's length within a factor
   1.5 at this size; the band here is 4);
5. the reducer's own part (the one entry nobody else can check), where it is in the centre, lies
   among the others: measured
   by ``D_ij = |S x_i - S x_j|^2 / (1/w_i + 1/w_j)``, the squared distance of two per-sample means
   in units of their expected sampling noise, the reducer's lower median ``D`` against the others
   must stay within :data:`OWN_PART_FACTOR` times the others' upper median ``D`` among themselves.

6. the result lies among the parts, seen from this member: its exact distance to the result is
   within :data:`RESULT_FACTOR` times (squared) its sketched distance to the other parts' lower
   median (the second-nearest in groups of up to five; :func:`reference_rank`). Points 1-5 hold
   only the entries of members that check the proof: a member that never does
   (the reducer held its results back until the others committed, or it left) can be listed
   anywhere, and its entry alone then balances any result. An honest centre is a weighted mean of
   the parts, never farther from a member's part than they are.

In a pair (the reducer and one other part: two cohorts' heads) there are no others to compare
with; there point 5 holds the reducer's own part to the sampling noise the member measured in
another stage (:class:`NoiseMap`, :func:`pair_ratio`).

Points 1-4 and 6 fail only for a reducer that misreported what it did. Point 5 fails as well for a
reducer whose own part is far from the others for a reason of its own: in a cross stage a head's
part is its cohort's result, which a liar inside that cohort may have bent (a cohort stage of two
is held to nothing). Its doubt is therefore an :class:`OwnPartDoubt`, which a peer bars for less.

Point 3 forces a reducer that shifted the result to list parts that balance the shift; the honest
members' entries are checked by their owners (1), so the balance must come from its own part, which
then lies far from everybody's (5): a shift of about the members' own sampling noise is caught.
The same bytes of a proof go to every member; that a reducer cannot tell each member a different
story about the others' entries needs the members to compare what they were sent, which
this module does not do (:mod:`protocol.proof_attestation` and docs/security.md).

Pure torch, no hivemind: :mod:`robust_aggregation.centered_clip` builds proofs,
:mod:`hivemind_adapter.exact_runner` carries and checks them.
"""

from __future__ import annotations

import hashlib
import math
import statistics
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

# Buckets of the count sketch: a sketch's squared length is its vector's times a chi-square of this
# many degrees over their number (for a dense vector), so lengths agree within ~18 % (one sigma).
SKETCH_SIZE = 64
# The projected fixed point's residual, relative to the sum of the forces' lengths, an honest reducer
# never exceeds: CenteredClip converges to ~1e-7 of the radius and the result is cast to float32.
RESIDUAL_TOLERANCE = 1e-3
# A listed distance may differ from its part's sketched distance by at most this factor.
DISTANCE_BAND = 4.0
# How much farther (in squared noise units) the reducer's own part may lie from the others than they
# lie from each other (point 5); set from honest and lying proofs
# (benchmarks/RESULTS.md, "Reducer proofs, offline").
OWN_PART_FACTOR = 10.0
# How much farther (squared) the result may lie from a member's part than the other parts' lower
# median does (point 6); set the same way (benchmarks/RESULTS.md, "Reducer proofs, offline").
RESULT_FACTOR = 4.0
# Parts of fewer values are held to points 1-3 only: their sketches say little about lengths.
MIN_VALUES_TO_MEASURE = 1024

_HEADER = struct.Struct("<4sHHd")
_MAGIC = b"MRP1"


class OwnPartDoubt(str):
    """A doubt of point 5: the reducer's own listed part lies too far from the others (or, in a pair,
    beyond the noise measured elsewhere). Either the reducer moved its entry to balance a wrong
    result, or the part itself is off: then the reducer may be an honest cohort head carrying what a
    liar in its cohort made of its cohort stage. A member cannot tell these apart, so a peer bars a
    cross stage's reducer refused so briefly and longer each time
    (:meth:`peer.guard.admission.AdmissionMemory.bar_again`), not for the full term that a misreported
    proof earns."""


@dataclass(frozen=True)
class PartProof:
    """What a reducer says about one part's centre. Per sender index: ``weights``, the weight it sent
    (0: no part, or a zero-weight follower); ``capped``, its weight after the cap rule (0: not in the
    cap's set, e.g. refused or left out as a suspect); ``in_centre``, whether its part is in the final
    centre (not named far); ``distances``, ``|x_i - c|``; ``points``, its part's sketch
    (``senders x SKETCH_SIZE``, float64). ``radius``: CenteredClip's clipping radius."""

    radius: float
    weights: tuple[float, ...]
    capped: tuple[float, ...]
    in_centre: tuple[bool, ...]
    distances: tuple[float, ...]
    points: torch.Tensor

    def to_bytes(self) -> bytes:
        n, k = self.points.shape
        columns = torch.tensor(
            [self.weights, self.capped, [float(b) for b in self.in_centre], self.distances],
            dtype=torch.float64,
        ).t()
        body = torch.cat([columns, self.points.to(torch.float64)], dim=1).contiguous()
        return _HEADER.pack(_MAGIC, n, k, float(self.radius)) + body.numpy().tobytes()

    @classmethod
    def from_bytes(cls, data: bytes, senders: int) -> PartProof:
        """The proof in ``data`` for a group of ``senders``; ValueError if it is not one."""
        if len(data) < _HEADER.size:
            raise ValueError("a proof too short for its header")
        magic, n, k, radius = _HEADER.unpack_from(data)
        if magic != _MAGIC or n != senders or k != SKETCH_SIZE:
            raise ValueError(f"not a proof of {senders} senders and {SKETCH_SIZE} buckets")
        if len(data) != _HEADER.size + 8 * n * (4 + k):
            raise ValueError(f"a proof of {len(data)} bytes for {n} senders")
        body = torch.frombuffer(bytearray(data[_HEADER.size :]), dtype=torch.float64).reshape(n, 4 + k)
        return cls(
            radius,
            tuple(body[:, 0].tolist()),
            tuple(body[:, 1].tolist()),
            tuple(bool(v) for v in body[:, 2].tolist()),
            tuple(body[:, 3].tolist()),
            body[:, 4:].clone(),
        )


def sketch_seed(context: bytes, part_index: int, result: torch.Tensor) -> int:
    """The seed of a part's sketch: from the all-reduce (``context``: its group id and reducer), the
    part's index and the result's bytes as members receive them. The result fixes the sketch, so a
    reducer cannot choose a wrong result that the sketch happens to miss."""
    h = hashlib.sha256(context + part_index.to_bytes(4, "little"))
    h.update(result.detach().reshape(-1).to(torch.float32).contiguous().numpy().tobytes())
    return int.from_bytes(h.digest()[:8], "little") & (2**63 - 1)


def sketch(values: torch.Tensor, seed: int, size: int = SKETCH_SIZE) -> torch.Tensor:
    """The count sketch of ``values``: each value, with a random sign, added into one of ``size``
    random buckets (float64). Linear, so it keeps the fixed point's equation; O(values) to compute."""
    return sketches([values], seed, size)[0]


def sketches(vectors: Sequence[torch.Tensor], seed: int, size: int = SKETCH_SIZE) -> list[torch.Tensor]:
    """:func:`sketch` of each of ``vectors`` (all of one length), drawing the buckets and signs once."""
    n = vectors[0].numel()
    generator = torch.Generator().manual_seed(seed)
    buckets = torch.randint(size, (n,), generator=generator)
    signs = torch.randint(2, (n,), generator=generator, dtype=torch.int8).to(torch.float64) * 2 - 1
    return [
        torch.zeros(size, dtype=torch.float64).index_add_(
            0, buckets, v.detach().reshape(-1).to(torch.float64) * signs
        )
        for v in vectors
    ]


def make_proof(
    parts: Mapping[int, torch.Tensor],
    weights: Mapping[int, float],
    num_senders: int,
    result: torch.Tensor,
    radius: float,
    capped: Mapping[int, float],
    in_centre: Sequence[int],
    seed: int,
) -> PartProof:
    """An honest reducer's proof of ``result`` (as members receive it) over ``parts`` (by sender
    index; senders absent from it sent nothing), with the clip's ``radius``, its ``capped`` weights
    (by sender index) and the senders ``in_centre``."""
    c = result.detach().reshape(-1).to(torch.float64)
    points = torch.zeros(num_senders, SKETCH_SIZE, dtype=torch.float64)
    distances = [0.0] * num_senders
    senders = sorted(parts)
    for i, point in zip(senders, sketches([parts[i] for i in senders], seed) if senders else []):
        points[i] = point
        distances[i] = float(torch.linalg.vector_norm(parts[i].detach().reshape(-1).to(torch.float64) - c))
    return PartProof(
        float(radius),
        tuple(float(weights.get(i, 0.0)) for i in range(num_senders)),
        tuple(float(capped.get(i, 0.0)) for i in range(num_senders)),
        tuple(i in set(in_centre) for i in range(num_senders)),
        tuple(distances),
        points,
    )


def check_proof(
    proof: PartProof,
    *,
    member: int,
    own_part: torch.Tensor,
    own_weight: float,
    reducer: int,
    result: torch.Tensor,
    seed: int,
    cap_rule: Callable[[torch.Tensor], torch.Tensor],
    rounding: torch.Tensor | None = None,
    like_parts: bool = True,
    noise_reference: float | None = None,
) -> str | None:
    """Why ``proof`` is not an honest reducer's account of ``result`` (what this member received for
    the part it sent as ``own_part`` with ``own_weight``), or None. ``member`` and ``reducer`` are
    sender indices; ``cap_rule`` caps a vector of weights as the reducer must have
    (:func:`~robust_aggregation.centered_clip.capped_weights` with the group's ratio); ``rounding``:
    per value, how far the wire's codec may have moved the result from the centre the reducer
    computed (None: only float32's rounding); ``like_parts``: the parts
    estimate one vector (:class:`~robust_aggregation.centered_clip.RobustConfig`), so point 5 applies;
    ``noise_reference``: this part's sampling noise as this member measured it elsewhere
    (:meth:`NoiseMap.over` of its own cohort stage), what point 5 holds a reducer to where it has
    one other part to compare with (a pair: two cohorts' heads)."""
    c = result.detach().reshape(-1).to(torch.float64)
    points = proof.points
    # (a refused sender's entry may hold anything: NaN parts, weights that are no number)
    counted = [i for i, w in enumerate(proof.capped) if w != 0]
    numbers = [proof.radius, *(proof.capped[i] for i in counted), *(proof.weights[i] for i in counted),
               *(proof.distances[i] for i in counted)]  # fmt: skip
    if not all(math.isfinite(v) and v >= 0 for v in numbers) or not bool(
        torch.isfinite(points[counted]).all()
    ):
        return "its proof holds a negative or non-finite number"
    # 1. this member's own entry
    if proof.weights[member] != float(own_weight) and math.isfinite(own_weight):
        return f"its proof lists this member's weight as {proof.weights[member]:g}, not {own_weight:g}"
    x = own_part.detach().reshape(-1).to(torch.float64)
    mine, sc = sketches([x, c], seed)
    # this member's exact distance to the result (points 1 and 6), where it sent a part that counts
    own_distance = (
        float(torch.linalg.vector_norm(x - c)) if own_weight > 0 and bool(torch.isfinite(x).all()) else None
    )
    if own_distance is not None:
        if not _close(points[member], mine):
            return "its proof misstates this member's part"
        if not _close_number(proof.distances[member], own_distance):
            return "its proof misstates this member's distance to the result"
    # 2. the cap rule, over the senders it counted
    if any(i not in counted for i, inside in enumerate(proof.in_centre) if inside):
        return "its proof puts a part in the centre without a weight"
    if counted:
        expected = cap_rule(torch.tensor([proof.weights[i] for i in counted], dtype=torch.float64))
        if not all(_close_number(proof.capped[i], float(e)) for i, e in zip(counted, expected.tolist())):
            return "its proof's capped weights do not follow the cap rule"
    # 3. the projected fixed point
    centre = [i for i, inside in enumerate(proof.in_centre) if inside]
    if not centre:
        return "its proof names no part in the centre"
    forces = torch.stack(
        [
            proof.capped[i] * min(1.0, proof.radius / max(proof.distances[i], 1e-300)) * (points[i] - sc)
            for i in centre
        ]
    )
    residual = float(torch.linalg.vector_norm(forces.sum(0)))
    total = float(torch.linalg.vector_norm(forces, dim=1).sum())
    pull = sum(proof.capped[i] for i in centre)
    moved = (
        c.abs() * 2.0**-24
        if rounding is None
        else rounding.reshape(-1).to(torch.float64) + c.abs() * 2.0**-24
    )
    moved_length = float(torch.linalg.vector_norm(moved))
    allowed = RESIDUAL_TOLERANCE * total + pull * (2.0 * moved_length + 1e-5 * proof.radius)
    if residual > allowed:
        return f"the result is not the centre its proof lists (residual {residual / max(total, 1e-300):.2g} of the forces)"
    if c.numel() < MIN_VALUES_TO_MEASURE:
        return None
    # 4. listed distances against the sketched ones
    for i in centre:
        sketched = float(torch.linalg.vector_norm(points[i] - sc))
        listed = proof.distances[i]
        if sketched > DISTANCE_BAND * listed + 1e-12 or listed > DISTANCE_BAND * sketched + 1e-12:
            return (
                f"its proof lists sender {i}'s distance as {listed:.3g} where its sketch says {sketched:.3g}"
            )
    # 5. the reducer's own part among the others (or, in a pair, against the noise measured elsewhere)
    if not like_parts:
        return None
    ratio = own_part_ratio(proof, reducer)
    if ratio is not None and ratio > OWN_PART_FACTOR:
        return OwnPartDoubt(
            f"its own part lies {ratio:.1f}x farther from the others' than they lie from each other"
        )
    ratio = pair_ratio(proof, reducer, noise_reference)
    if ratio is not None and ratio > OWN_PART_FACTOR:
        return OwnPartDoubt(
            f"in a pair, its own part lies {ratio:.1f}x beyond the sampling noise measured elsewhere"
        )
    # 6. the result near this member's part, as near as the nearest other part lies
    ratio = (
        None if own_distance is None else result_ratio(proof, member, max(0.0, own_distance - moved_length))
    )
    if ratio is not None and ratio > RESULT_FACTOR:
        return (
            f"the result lies {ratio:.1f}x farther from this member's part than the other parts' median does"
        )
    return None


@dataclass(frozen=True)
class NoiseMap:
    """Sampling noise per value over ranges ``(start, end, level)`` of an averager's flat vector, as
    one all-reduce's proofs showed it (:func:`noise_level` over a part's values). Gradient noise is
    far from even along a model (it differs severalfold between parts), so a part is held to the
    noise of its own values, not to an average."""

    ranges: tuple[tuple[int, int, float], ...]

    def over(self, start: int, end: int) -> float | None:
        """The noise level a part of values ``[start, end)`` has where these ranges cover at least
        :data:`NOISE_MAP_COVERAGE` of it (their level times the values they share), else None."""
        level, covered = 0.0, 0
        for s, e, per_value in self.ranges:
            shared = min(end, e) - max(start, s)
            if shared > 0:
                level += per_value * shared
                covered += shared
        return level if end > start and covered >= NOISE_MAP_COVERAGE * (end - start) else None


# A part is held to a noise map only where the map covers this much of its values.
NOISE_MAP_COVERAGE = 0.9


def every_members_doubt(
    proof: PartProof,
    parts: Sequence[torch.Tensor],
    weights: Sequence[float],
    reducer: int,
    result: torch.Tensor,
    seed: int,
    cap_rule: Callable[[torch.Tensor], torch.Tensor],
    **options,
) -> list[str | None]:
    """What each sender other than ``reducer`` says of ``proof`` (:func:`check_proof`), each from its
    own part and weight: a whole group's verdict where one process holds every part (simulations,
    benchmarks and tests). ``options`` go to every check."""
    return [
        check_proof(
            proof,
            member=m,
            own_part=parts[m],
            own_weight=weights[m],
            reducer=reducer,
            result=result,
            seed=seed,
            cap_rule=cap_rule,
            **options,
        )  # fmt: skip
        for m in range(len(parts))
        if m != reducer
    ]


def noise_level(proof: PartProof) -> float | None:
    """The median over pairs of listed parts of ``D_ij`` (point 5 of the module's docstring): the
    sampling noise of one unit of weight, in squared units of the parts, as the senders' spread
    shows it (None with fewer than three parts: one pair's distance is no spread). A head measures
    it in its cohort stage and holds the other head of a pair to it in the cross stage."""
    valid = _valid(proof)
    if len(valid) < 3:
        return None
    return statistics.median(_d(proof, i, j) for a, i in enumerate(valid) for j in valid[a + 1 :])


def pair_ratio(proof: PartProof, reducer: int, reference: float | None) -> float | None:
    """In a pair (the reducer and one other sender), how far the reducer's own listed part lies
    from the other's, in units of ``reference`` (:func:`noise_level` measured elsewhere); None where
    it says nothing: no reference, not a pair, or the reducer's part not in the centre."""
    if reference is None or not math.isfinite(reference) or reference <= 0 or not proof.in_centre[reducer]:
        return None
    valid = _valid(proof)
    if reducer not in valid or len(valid) != 2:
        return None
    other = valid[0] if valid[1] == reducer else valid[1]
    return _d(proof, reducer, other) / reference


def _valid(proof: PartProof) -> list[int]:
    """Senders that sent a part with a weight, whose listed sketch is finite."""
    return [i for i, w in enumerate(proof.weights) if w > 0 and bool(torch.isfinite(proof.points[i]).all())]


def _d(proof: PartProof, i: int, j: int) -> float:
    """``|S x_i - S x_j|^2 / (1/w_i + 1/w_j)``: two per-sample means' squared distance over their
    expected sampling noise (the same for every pair of honest parts)."""
    gap = float(torch.linalg.vector_norm(proof.points[i] - proof.points[j])) ** 2
    return gap / (1.0 / proof.weights[i] + 1.0 / proof.weights[j])


def own_part_ratio(proof: PartProof, reducer: int) -> float | None:
    """How far (squared, in sampling-noise units) the reducer's own listed part lies from the others,
    over how far they lie from each other (point 5 of the module's docstring); None where it says
    nothing: the reducer's part is not in the centre (then it moves nothing: a reducer that sent a
    poisoned part and named it far is no liar as a reducer), or fewer than two others sent one."""
    if not proof.in_centre[reducer]:
        return None
    valid = _valid(proof)
    if reducer not in valid:
        return None
    others = [i for i in valid if i != reducer]
    if len(others) < 2:
        return None
    own = sorted(_d(proof, reducer, j) for j in others)[(len(others) - 1) // 2]  # the lower median
    pairs = sorted(_d(proof, i, j) for a, i in enumerate(others) for j in others[a + 1 :])
    reference = pairs[len(pairs) // 2]  # the upper median
    if reference <= 0:
        return None if own <= 0 else math.inf
    return own / reference


def result_ratio(proof: PartProof, member: int, distance: float) -> float | None:
    """How far the result lies from ``member``'s part (``distance``, measured exactly), over how far
    the other listed parts lie from it (sketched; their lower median, never nearer than the second:
    :func:`reference_rank`), both squared (point 6 of the module's docstring); None where it says
    nothing (fewer than two other parts).

    Lengths, not noise units as in point 5: the result carries the capped mean's noise, which for a
    member of many samples is most of its distance to the result. A reducer can list the entry of a
    member that never checks it (one whose results it held back, or that left) anywhere: placed far,
    it raises the median by one rank; placed near, it only makes the check stricter. Not the
    nearest: one dishonest member whose part lies next to this member's would then make it refuse
    honest results."""
    valid = _valid(proof)
    if member not in valid:
        return None
    others = [j for j in valid if j != member]
    if len(others) < 2:
        return None
    gaps = sorted(float(torch.linalg.vector_norm(proof.points[member] - proof.points[j])) for j in others)
    reference = gaps[reference_rank(len(gaps))] ** 2
    own = distance**2
    if reference <= 0:
        return None if own <= 0 else math.inf
    return own / reference


def reference_rank(others: int) -> int:
    """Which of a member's sorted gaps to the ``others`` other parts point 6 measures the result by
    (0-based): the lower median, never below the second-nearest. The second-nearest alone is too
    tight late in training, where parts cluster (most members' samples are all learned, a few hold a
    hard example): near-zero parts are each other's nearest, while the centre lies among all of them.
    One made-up entry moves the median by at most one rank, and a twin placed next to a victim's part
    moves only its nearest gap."""
    return max(1, (others - 1) // 2)


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return float(torch.linalg.vector_norm(a - b)) <= 1e-9 * (float(torch.linalg.vector_norm(b)) + 1e-300)


def _close_number(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-9 * max(abs(a), abs(b), 1e-300)


def pack_proofs(proofs: Sequence[bytes]) -> torch.Tensor:
    """The proofs of a reducer's parts (b"" where a part has none) as one uint8 tensor for the wire."""
    header = struct.pack(f"<I{len(proofs)}I", len(proofs), *(len(p) for p in proofs))
    return torch.frombuffer(bytearray(header + b"".join(proofs)), dtype=torch.uint8)


def unpack_proofs(packed: torch.Tensor) -> list[bytes]:
    """What :func:`pack_proofs` packed; ValueError if ``packed`` is not such a tensor."""
    if packed.dtype != torch.uint8 or packed.dim() != 1:
        raise ValueError("proofs travel as a flat uint8 tensor")
    data = packed.numpy().tobytes()
    if len(data) < 4:
        raise ValueError("no proof count")
    (count,) = struct.unpack_from("<I", data)
    if len(data) < 4 + 4 * count:
        raise ValueError(f"{count} proofs announced in {len(data)} bytes")
    lengths = struct.unpack_from(f"<{count}I", data, 4)
    offset = 4 + 4 * count
    if offset + sum(lengths) != len(data):
        raise ValueError("proof lengths do not add up to the message")
    proofs = []
    for n in lengths:
        proofs.append(data[offset : offset + n])
        offset += n
    return proofs
