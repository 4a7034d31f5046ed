"""hivemind's all-reduce reducer with a robust centre: :class:`RobustPartReducer` keeps every sender's
part of a slice and answers :func:`robust_aggregation.centered_clip.centered_clip` of them, with a
proof that members check (:mod:`robust_aggregation.reducer_proof`)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Sequence

import torch
from hivemind.averaging.partition import AllreduceException, BannedException, TensorPartReducer

from hivemind_adapter.finite_reduce import part_result
from robust_aggregation.alignment import Alignment
from robust_aggregation.centered_clip import ClipResult, RobustConfig, centered_clip, slotted_centre
from robust_aggregation.reducer_proof import make_proof, noise_level, sketch_seed


class RobustPartReducer(TensorPartReducer):
    """hivemind's reducer, but each part's result is :func:`centered_clip` of what the senders sent.

    hivemind accumulates a part's sum as senders' parts arrive; a robust centre needs them all at
    once, so this keeps each sender's part (and weight) of the current part index, and reduces when
    every sender still counted for that index has sent it (the same bookkeeping as hivemind's:
    ``num_parts_received``, ``sender_failed_after``, ``on_sender_failed``). The inputs of a part are
    freed as soon as its result is set: at most one part index per sender is held.

    One difference: a part counts as received once it is held, not as soon as it arrives. hivemind
    counts a part that still waits for the previous one to finish; if its sender's stream is then
    cancelled, the sender is dropped only after that part, which nobody will ever send (the part
    waits for it until the all-reduce's timeout).

    ``outliers`` maps a sender index to the part indices on which it was refused or named;
    ``dropped``, to those on which its part was left out for lying beyond ``drop_factor`` radii
    but not named.
    ``alignments`` holds each sender's cosine with the others' centres over this reducer's whole
    share (its parts of at least ``min_aligned_values`` values together; by sender index): one
    cosine per sender and all-reduce. Not one per part: a sender's parts of one all-reduce come from
    one batch, and late in training a batch with a hard example points against the others in most
    of them at once. ``excluded`` senders (suspected by an
    :class:`~robust_aggregation.alignment.AlignmentRecord`) are left out of every centre.
    ``slotted_parts`` (part indices) are reduced by :func:`slotted_centre`, not robustly: the
    cohort's roll of sample counts, each member's in its own slot.
    Parts are cast to ``part_dtype`` (default: torch's default dtype, the dtype hivemind's reducer
    averages in); a part of the wrong shape is refused and its sender is dropped like a failed one.
    """

    def __init__(
        self,
        part_shapes: Sequence[torch.Size],
        num_senders: int,
        config: RobustConfig,
        part_dtype: torch.dtype | None = None,
        excluded: Collection[int] = (),
        min_aligned_values: int = 1024,
        slotted_parts: Collection[int] = (),
        proof_context: bytes | None = None,
        as_received: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ):
        self.config = config
        # With a context (the all-reduce's group id and this reducer), every robust part's result comes
        # with a proof that members check (robust_aggregation.reducer_proof); ``as_received`` gives what
        # members decode of a result (the wire's codec), which the proof must speak of.
        self.proof_context = proof_context
        self.as_received = as_received or (lambda t: t)
        self.proofs: dict[int, bytes] = {}  # part index -> its proof (b"" for a slotted part)
        self.noise_levels: dict[int, float] = {}  # part index -> reducer_proof.noise_level of its proof
        self.slotted_parts = frozenset(slotted_parts)
        self.part_dtype = part_dtype or torch.get_default_dtype()
        self.excluded = frozenset(excluded)
        self.min_aligned_values = min_aligned_values
        self.outliers: dict[int, set[int]] = {}
        self.dropped: dict[int, set[int]] = {}
        self._alignment_sums: dict[int, Alignment] = {}  # sender index -> over its parts so far
        self._inputs: dict[int, tuple[torch.Tensor, float]] = {}  # sender index -> its current part, weight
        self._reducing: asyncio.Task | None = None  # the current part's reduction, while it runs
        super().__init__(part_shapes, num_senders)  # calls reset_accumulators

    @property
    def alignments(self) -> list[dict[int, float]]:
        """Each sender's cosine over this reducer's share so far, as one record entry (empty before
        any part of at least ``min_aligned_values`` values was reduced)."""
        cosines = {i: c for i, a in sorted(self._alignment_sums.items()) if (c := a.cosine) is not None}
        return [cosines] if cosines else []

    def reset_accumulators(self) -> None:
        if self.current_part_index >= self.num_parts - 1:
            self.finalize()
            return
        self.current_part_index += 1
        self.current_part_accumulated_from = 0
        self.current_part_future = asyncio.Future()
        # senders that failed before this part are not waited for (they failed after fewer parts)
        self.num_current_senders = sum(self.current_part_index < after for after in self.sender_failed_after)
        self._inputs = {}
        self.accumulator = None  # hivemind's finalize deletes it; nothing is accumulated here

    async def accumulate_part(
        self, sender_index: int, part_index: int, tensor_part: torch.Tensor, weight: float = 1.0
    ) -> torch.Tensor:
        """Hold ``tensor_part`` until every counted sender sent its part ``part_index``, then return the
        robust centre (the same tensor to every sender of that part)."""
        if not (0 <= sender_index < self.num_senders and 0 <= part_index < self.num_parts):
            raise AllreduceException(f"no sender {sender_index} or part {part_index} in this reducer")
        if tensor_part.shape != self.part_shapes[part_index]:
            # not counted as received: the caller drops this sender from this part on
            raise AllreduceException(
                f"sender {sender_index} sent part {part_index} of shape {tuple(tensor_part.shape)}, "
                f"not {tuple(self.part_shapes[part_index])}"
            )
        while part_index > self.current_part_index:  # earlier parts are still being gathered
            finished = asyncio.create_task(self.finished.wait())
            try:
                await asyncio.wait({self.current_part_future, finished}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                finished.cancel()
            if self.finished.is_set():
                raise AllreduceException(f"part {part_index} arrived after this reducer finished")
        if self.sender_failed_after[sender_index] != float("inf"):
            raise BannedException(f"sender {sender_index} was dropped")
        assert part_index == self.current_part_index, "a sender's parts arrive in order"
        future = self.current_part_future
        self.num_parts_received[sender_index] += 1
        self._inputs[sender_index] = (tensor_part.to(self.part_dtype), float(weight))
        self.current_part_accumulated_from += 1
        self.check_current_part_finished()
        return await part_result(future)  # shared by the part's senders: one cancelled waiter leaves it

    def check_current_part_finished(self) -> None:
        if self._reducing is not None:  # this part is being reduced already
            return
        assert self.current_part_accumulated_from <= self.num_current_senders
        if self.current_part_accumulated_from < self.num_current_senders:
            return
        if not self._inputs:  # every sender failed before this part: nobody waits for it
            self.current_part_future.cancel()
            self.reset_accumulators()
            return
        inputs, self._inputs = self._inputs, {}
        self._reducing = asyncio.create_task(
            self._reduce(inputs, self.current_part_future, self.current_part_index)
        )

    async def _reduce(
        self, inputs: dict[int, tuple[torch.Tensor, float]], future: asyncio.Future, part_index: int
    ):
        """Set ``future`` to the robust centre of ``inputs``, then move on to the next part. The centre
        is computed in a worker thread, so the loop keeps serving the other streams meanwhile. Later
        parts wait, as they do for hivemind's sum."""
        senders = sorted(inputs)  # by sender index, not arrival: the same inputs give the same bits
        parts, weights = [inputs[s][0] for s in senders], [inputs[s][1] for s in senders]
        del inputs
        try:
            value = None
            if part_index in self.slotted_parts:
                result = slotted_centre(parts, senders, self.num_senders)
                self.proofs[part_index] = b""  # each slot is its owner's value: members check their own
            else:
                excluded = [j for j, sender in enumerate(senders) if sender in self.excluded]
                loop = asyncio.get_running_loop()
                result = await loop.run_in_executor(
                    None, centered_clip, parts, weights, self.config, excluded
                )
                if self.proof_context is not None:
                    value, self.proofs[part_index] = await loop.run_in_executor(
                        None, self.answer, result, parts, senders, weights, part_index
                    )
        except Exception as e:  # no usable part (ValueError), or worse: this slice cannot be averaged
            for j, part in enumerate(parts):
                if not bool(torch.isfinite(part).all()):
                    self.outliers.setdefault(senders[j], set()).add(part_index)
            if not future.done():
                future.set_exception(AllreduceException(f"part {part_index}: {e}"))
        else:
            for j in result.outliers:
                self.outliers.setdefault(senders[j], set()).add(part_index)
            for j in result.dropped:
                self.dropped.setdefault(senders[j], set()).add(part_index)
            if parts[0].numel() >= self.min_aligned_values:
                for j, alignment in enumerate(result.alignments):
                    if alignment is not None:
                        known = self._alignment_sums.get(senders[j])
                        self._alignment_sums[senders[j]] = alignment if known is None else known + alignment
            if not future.done():  # not cancelled by finalize meanwhile
                future.set_result(result.value if value is None else value)
        finally:
            del parts
            self._reducing = None
            if not self.finished.is_set():
                self.reset_accumulators()

    def answer(
        self,
        result: ClipResult,
        parts: Sequence[torch.Tensor],
        senders: Sequence[int],
        weights: Sequence[float],
        part_index: int,
    ) -> tuple[torch.Tensor, bytes]:
        """What this reducer sends back for a part (its centre) and the proof that goes with it (runs
        in a worker thread; the red team's dishonest reducers override it)."""
        received = self.as_received(result.value)
        seed = sketch_seed(self.proof_context, part_index, received)
        proof = make_proof(
            dict(zip(senders, parts)),
            dict(zip(senders, weights)),
            self.num_senders,
            received,
            result.radius,
            {senders[j]: w for j, w in result.capped.items()},
            [senders[j] for j in result.in_centre],
            seed,
        )
        if (level := noise_level(proof)) is not None:
            self.noise_levels[part_index] = level
        return result.value, proof.to_bytes()

    def finalize(self) -> None:
        self._inputs = {}
        super().finalize()
