"""The member's half of the exact butterfly all-reduce behind
:class:`hivemind_adapter.allreduce.VerifiedAverager` (:mod:`hivemind_adapter.reducer_replies` is the
reducer's half): every member receives the same bytes for every part, the reducer's average itself.
With robust averaging, reducers take a robust centre and members check each reply and each reducer's
proofs before taking its parts. The one place that overrides hivemind's all-reduce protocol.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools

import torch
from hivemind.averaging.allreduce import AllreduceException
from hivemind.compression import NoCompression, deserialize_torch_tensor
from hivemind.p2p import PeerID
from hivemind.proto import averaging_pb2
from hivemind.utils.asyncio import aiter_with_timeout, attach_event_on_finished

from hivemind_adapter.finite_reduce import FiniteMeanReducer
from hivemind_adapter.part_layout import PartLayout, part_layout, slotted_parts
from hivemind_adapter.reducer_replies import ReducerReplies
from hivemind_adapter.robust_reduce import RobustPartReducer
from hivemind_adapter.wire_codecs import rounding_bound, roundtrip
from protocol.identity import Identity
from protocol.proof_attestation import ProofAttestation, group_tag, proofs_digest
from robust_aggregation.alignment import MIN_VALUES, AlignmentRecord
from robust_aggregation.centered_clip import RobustConfig, capped_weights
from robust_aggregation.reducer_proof import (
    NoiseMap,
    OwnPartDoubt,
    PartProof,
    check_proof,
    noise_level,
    pack_proofs,
    sketch_seed,
    unpack_proofs,
)
from robust_aggregation.reply_check import implausible_reply, reply_cosine

# The fewest reducers of one all-reduce whose reply cosines are compared (see note_reply_alignments).
MIN_REDUCERS_TO_JUDGE = 3


class ExactAllReduceRunner(ReducerReplies):
    """A butterfly all-reduce whose outputs are the reducers' averages, not deltas against local parts.
    Without ``robust``, this member reduces with a :class:`~hivemind_adapter.finite_reduce.FiniteMeanReducer`;
    with it, this member reduces with a :class:`~hivemind_adapter.robust_reduce.RobustPartReducer`,
    the last ``slotted_tensors`` tensors as slotted parts (see
    :func:`~robust_aggregation.centered_clip.slotted_centre`; each must fit in one part)."""

    def __init__(
        self,
        *args,
        robust: RobustConfig | None = None,
        alignment: AlignmentRecord | None = None,
        reply_alignment: AlignmentRecord | None = None,
        slotted_tensors: int = 0,
        signer: Identity | None = None,
        public_keys: dict[str, str] | None = None,
        **kwargs,
    ):
        super().__init__(*args, signer=signer, **kwargs)
        # Robust: a member checks a reducer's signature under ``public_keys`` (the roster's, peer id
        # -> hex key; a reducer not in it, or no roster: not checked). ``attestations`` also holds
        # the signed digests of the proofs messages this member accepted (protocol.proof_attestation).
        self.public_keys = public_keys
        self.alignment = alignment if robust is not None else None
        # how each reducer's replies pointed against this member's parts, across all-reduces: a
        # reducer it names is refused from its first reply on
        self.reply_alignment = reply_alignment if robust is not None else None
        self.lying_reducers = self.reply_alignment.suspects() if self.reply_alignment is not None else set()
        self.check_replies = robust is not None  # doubt a reducer's reply against our own part
        # and, robust, take a remote reducer's parts only with a proof that they are its centre
        self.robust = robust
        self._slotted_tensors = slotted_tensors
        if robust is not None:
            unused = self.tensor_part_reducer
            suspects = self.alignment.suspects() if self.alignment is not None else set()
            excluded = [i for i, p in enumerate(self.sender_peer_ids) if p.to_base58() in suspects]
            compression = self.tensor_part_container.compression
            exact_wire = isinstance(compression, NoCompression)
            self.tensor_part_reducer = self.reducer_type(
                unused.part_shapes,
                unused.num_senders,
                robust,
                excluded=excluded,
                min_aligned_values=MIN_VALUES,
                slotted_parts=self._slotted_parts_of(self.peer_id),
                proof_context=self._proof_context(self.peer_id),
                as_received=None if exact_wire else functools.partial(roundtrip, compression),
            )
            unused.finished.set()  # never used: its finalize would report "received 0% of input tensors"
        else:
            unused = self.tensor_part_reducer
            self.tensor_part_reducer = FiniteMeanReducer(
                unused.part_shapes, unused.num_senders, self._slotted_parts_of(self.peer_id)
            )
            unused.finished.set()
        # With absolute outputs, a part whose reducer failed falls back to the local part, not to a zero delta.
        self.tensor_part_container.return_deltas = False
        self.reducer_errors: list[str] = []  # why each remote reducer failed this member, if one did
        # the sampling noise this member measured in another stage, what a pair's reducer is held
        # to (None: pairs are not held to anything); and what the proofs it accepted here measured
        self.noise_reference: NoiseMap | None = None
        self.noise_measured: list[tuple[int, int, float]] = []
        # where each part lies in the flat vector: taken now, since the container's finalize drops its
        # parts (a member that checks no remote proof would look too late)
        self._layout: PartLayout = part_layout(self.tensor_part_container)
        # reducers whose replies this member refused as implausible, and those of them refused only
        # for their own part's place (reducer_proof.OwnPartDoubt: barred for less by the owner)
        self.refused_reducers: set[PeerID] = set()
        self.refused_for_own_part: set[PeerID] = set()
        # per reducer (base58), the cosine of each reply with the part this member sent (robust only)
        self.reply_cosines: dict[str, list[float]] = {}

    reducer_type: type[RobustPartReducer] = RobustPartReducer  # (the red team's liars replace it)

    def _slotted_parts_of(self, reducer: PeerID) -> frozenset[int]:
        """Indices, among the parts ``reducer`` reduces, of the last ``slotted_tensors`` tensors' parts."""
        if self._slotted_tensors <= 0:
            return frozenset()
        index = self.ordered_peer_ids.index(reducer)
        return slotted_parts(self.tensor_part_container, index, self._slotted_tensors)

    def _proof_context(self, reducer: PeerID) -> bytes:
        """What binds a reducer's proofs to this all-reduce and to that reducer (their sketches' seed)."""
        return bytes(self.group_id) + reducer.to_bytes()

    async def _communicate_with_peer(self, peer_id: PeerID):
        if peer_id != self.peer_id:
            try:
                return await self._exchange_with_reducer(peer_id)
            except Exception as e:
                # hivemind logs why at DEBUG only: the round's abort reason says it
                self.reducer_errors.append(f"{str(peer_id)[-8:]}: {type(e).__name__}: {str(e)[:120]}")
                raise
        peer_index = self.ordered_peer_ids.index(peer_id)
        sender_index = self.sender_peer_ids.index(peer_id)
        container = self.tensor_part_container
        part_infos = [info for _part, info in container._input_parts_by_peer[peer_index]]
        lossless = isinstance(container.compression, NoCompression)
        for part_index, local_part in enumerate(self.parts_for_local_averaging):
            try:
                averaged = await self.tensor_part_reducer.accumulate_part(
                    sender_index, part_index, local_part, weight=self.weight
                )
                # Other members receive this part through the compression; so must we, or we would differ.
                if lossless:
                    mine = averaged.clone()
                else:
                    mine = deserialize_torch_tensor(
                        container.compression.compress(averaged, part_infos[part_index])
                    )
                if (
                    self.reply_alignment is not None
                    and (c := reply_cosine(local_part, mine, MIN_VALUES)) is not None
                ):
                    # the honest reference
                    self.reply_cosines.setdefault(self.peer_id.to_base58(), []).append(c)
                container.register_processed_part(peer_index, part_index, mine)
            except Exception as e:  # e.g. no usable part to reduce (robust): never leave the outputs waiting
                self.reducer_errors.append(f"this peer: {type(e).__name__}: {str(e)[:120]}")
                container.register_failed_reducer(peer_index)
                raise

    async def _exchange_with_reducer(self, peer_id: PeerID) -> None:
        """Stream this member's parts of ``peer_id``'s shard to it and take back exactly that many
        averaged parts, then close this side of the stream first.

        Raises ``AllreduceException`` for a reply that is not an averaged part, an implausible reply,
        too few replies or (robust) refused proofs; the reducer's parts are then registered as failed.
        Why the member closes first: a reducer's close arrives as a stream reset, which drops replies
        not passed on yet (the reducer waits for the member: :meth:`ReducerReplies.rpc_aggregate_part`)."""
        container = self.tensor_part_container
        peer_index = self.ordered_peer_ids.index(peer_id)
        expected = container.num_parts_by_peer[peer_index]
        sent_all = asyncio.Event()
        inputs = attach_event_on_finished(self._counted(self._generate_input_for_peer(peer_index)), sent_all)
        replies = None
        received = 0
        # robust: parts are held back until the reducer's proof of them checked out (a part once
        # registered counts as averaged, whatever happens next)
        held: list[torch.Tensor] | None = [] if self.robust is not None else None
        proof = None
        try:
            replies = await self._get_peer_stub(peer_id).rpc_aggregate_part(inputs)
            if self.should_delay_results(self.peer_id):  # a member that reduces nothing sends first
                await sent_all.wait()
            loop = asyncio.get_running_loop()
            async for message in aiter_with_timeout(replies, self.reducer_timeout):
                if message.code != averaging_pb2.AVERAGED_PART:
                    raise AllreduceException(f"{peer_id} sent {averaging_pb2.MessageCode.Name(message.code)}")
                self._count(received=len(message.tensor_part.buffer))
                if received == expected:  # after the parts, their proofs
                    proof = message.tensor_part
                    break
                # decoded and checked off the event loop (the check reads the part twice in float64)
                own = container._input_parts_by_peer[peer_index][received][0] if self.check_replies else None
                part, doubt, cosine = await loop.run_in_executor(None, _take_reply, message.tensor_part, own)
                if cosine is not None:
                    self.reply_cosines.setdefault(peer_id.to_base58(), []).append(cosine)
                if doubt is None and peer_id.to_base58() in self.lying_reducers:
                    doubt = "its replies kept pointing against this member's parts (across all-reduces)"
                if doubt is not None:
                    self.refused_reducers.add(peer_id)
                    await self._finish_reducing()
                    raise AllreduceException(f"implausible reply to part {received}: {doubt}")
                if held is None:
                    container.register_processed_part(peer_index, received, part)
                else:
                    held.append(part)
                received += 1
                if received == expected and held is None:
                    break
            if received != expected:
                raise AllreduceException(f"peer {peer_id} sent {received} parts, but we expected {expected}")
            if held is not None:
                doubt = "sent no proof of its parts" if proof is None else None
                if doubt is None:
                    doubt = await loop.run_in_executor(None, self._doubt_proofs, peer_id, proof, held)
                if doubt is not None:
                    self.refused_reducers.add(peer_id)
                    if isinstance(doubt, OwnPartDoubt):
                        self.refused_for_own_part.add(peer_id)
                    await self._finish_reducing()
                    raise AllreduceException(f"refused its parts: {doubt}")  # (the error names the reducer)
                for index, part in enumerate(held):
                    container.register_processed_part(peer_index, index, part)
        except BaseException:
            container.register_failed_reducer(peer_index)
            raise
        finally:
            if replies is not None:
                with contextlib.suppress(RuntimeError):  # it is still running only if it was cancelled
                    await replies.aclose()

    def progress_lines(self) -> list[str]:
        """What this member's all-reduce holds so far: per reducer, its output parts in; this peer's
        reducer's part, senders and bans; the reducer errors so far (what a stall report shows)."""
        container = self.tensor_part_container
        lines = []
        for index, peer in enumerate(self.ordered_peer_ids):
            if wanted := container.num_parts_by_peer[index]:
                name = "this peer" if peer == self.peer_id else str(peer)[-8:]
                lines.append(
                    f"outputs from {name}: {container._outputs_registered_by_peer[index]} of {wanted} in"
                )
        reducer = self.tensor_part_reducer
        if reducer.num_parts and reducer.current_part_index < reducer.num_parts:
            part = reducer.current_part_index
            missing = [
                str(sender)[-8:]
                for sender, received, failed in zip(
                    self.sender_peer_ids, reducer.num_parts_received, reducer.sender_failed_after
                )
                if received <= part < failed
            ]
            lines.append(
                f"this peer's reducer: part {part} of {reducer.num_parts}, from {reducer.current_part_accumulated_from}"
                f" of {reducer.num_current_senders} sender(s), waiting for {missing}; senders started"
                f" {len(self.active_senders)} of {len(self.sender_peer_ids)}, banned"
                f" {[str(p)[-8:] for p in self.banned_senders]}"
            )
        if self.reducer_errors:
            lines.append("reducer errors: " + "; ".join(self.reducer_errors))
        return lines

    def _doubt_proofs(self, reducer: PeerID, message_part, results: list[torch.Tensor]) -> str | None:
        """Why ``reducer``'s proofs (one message after its parts) do not show that ``results`` are the
        robust centres of what its senders sent, or None (runs in a worker thread). An
        :class:`~robust_aggregation.reducer_proof.OwnPartDoubt` where only its own part's place failed."""
        try:
            proofs = unpack_proofs(deserialize_torch_tensor(message_part))
        except ValueError as e:
            return f"sent a malformed proof ({e})"
        if len(proofs) != len(results) + 1:  # the proofs, then the reducer's signature
            return f"sent {len(proofs) - 1} proofs for {len(results)} parts"
        *proofs, signature = proofs
        attestation = ProofAttestation(
            group_tag(bytes(self.group_id)),
            reducer.to_base58(),
            proofs_digest(pack_proofs(proofs).numpy().tobytes()),
            signature.hex(),
        )
        key = None if self.public_keys is None else self.public_keys.get(reducer.to_base58())
        if key is not None and not attestation.verifies(key):
            return "its proofs do not carry its valid signature"
        container = self.tensor_part_container
        peer_index = self.ordered_peer_ids.index(reducer)
        slotted = self._slotted_parts_of(reducer)
        context = self._proof_context(reducer)
        member, by = self.sender_peer_ids.index(self.peer_id), self.sender_peer_ids.index(reducer)
        cap = functools.partial(capped_weights, max_weight_ratio=self.robust.max_weight_ratio)
        exact_wire = isinstance(container.compression, NoCompression)
        measured = []
        for index, (data, result) in enumerate(zip(proofs, results)):
            if index in slotted:
                continue  # each slot is its owner's value, checked by its owner (peer.averaging.known_cohort)
            start, end = self._part_range(peer_index, index)
            own, info = container._input_parts_by_peer[peer_index][index]
            if not exact_wire:  # what the reducer decoded of this member's part
                own = deserialize_torch_tensor(container.compression.compress(own, info))
            try:
                proof = PartProof.from_bytes(data, len(self.sender_peer_ids))
            except ValueError as e:
                return f"sent a malformed proof of part {index} ({e})"
            why = check_proof(
                proof,
                member=member,
                own_part=own,
                own_weight=float(self.weight),
                reducer=by,
                result=result,
                seed=sketch_seed(context, index, result),
                cap_rule=cap,
                rounding=None if exact_wire else rounding_bound(container.compression, result),
                like_parts=self.robust.like_parts,
                noise_reference=None
                if self.noise_reference is None
                else self.noise_reference.over(start, end),
            )
            if why is not None:
                return (
                    OwnPartDoubt(f"part {index}: {why}")
                    if isinstance(why, OwnPartDoubt)
                    else f"part {index}: {why}"
                )
            if (level := noise_level(proof)) is not None:
                measured.append((start, end, level / (end - start)))
        self.noise_measured += measured  # only once every proof of this reducer checked out
        self.attestations.append(attestation)
        return None

    async def _finish_reducing(self) -> None:
        """Wait (bounded) until this member's own reducer has reduced every part. A member that
        refuses a reply has its outputs early (the refused parts fall back at once), and the runner
        stops its reducer as soon as its outputs are complete: the other senders, honest ones
        included, would lose the parts this member reduces for them."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.tensor_part_reducer.finished.wait(), self.reducer_timeout or 60.0)

    def outlier_senders(self) -> list[str]:
        """Base58 ids of the peers whose values this member refused or named: senders its reducer
        refused or named an outlier on any part it reduced (without ``robust``: sent NaN or infinite
        values in), then reducers whose replies it refused."""
        reducer = self.tensor_part_reducer
        named = set(getattr(reducer, "outliers", {})) | set(getattr(reducer, "excluded", ()))
        senders = [self.sender_peer_ids[i].to_base58() for i in sorted(named)]
        return senders + sorted(p.to_base58() for p in self.refused_reducers if p.to_base58() not in senders)

    def measured_noise(self) -> NoiseMap | None:
        """The sampling noise along the vector that this all-reduce's proofs showed: those this member
        accepted and those its own reducer made (None: none had three parts or more)."""
        own = self.ordered_peer_ids.index(self.peer_id)
        ranges = list(self.noise_measured)
        for index, level in getattr(self.tensor_part_reducer, "noise_levels", {}).items():
            start, end = self._part_range(own, index)
            ranges.append((start, end, level / (end - start)))
        return NoiseMap(tuple(sorted(ranges))) if ranges else None

    def _part_range(self, peer_index: int, index: int) -> tuple[int, int]:
        """Where the ``index``-th part that peer ``peer_index`` reduces lies in the flat vector."""
        return self._layout.part_range(peer_index, index)

    def note_alignments(self) -> None:
        """Add the cosines this member's reducer measured to the averager's alignment record."""
        if self.alignment is None:
            return
        for cosines in getattr(self.tensor_part_reducer, "alignments", []):
            self.alignment.note_part({self.sender_peer_ids[i].to_base58(): c for i, c in cosines.items()})

    def note_reply_alignments(self) -> None:
        """Add how each reducer's replies pointed against this member's parts to the averager's
        record: the j-th reply of every reducer together, so the record's spread compares reducers
        of one all-reduce (this member's own reducer among them)."""
        if self.reply_alignment is None:
            return
        longest = max((len(c) for c in self.reply_cosines.values()), default=0)
        for j in range(longest):
            cosines = {r: c[j] for r, c in self.reply_cosines.items() if len(c) > j}
            # Two cosines have no middle: their spread is each one's distance to their mean, far less
            # than one cosine's real scatter.
            if len(cosines) >= MIN_REDUCERS_TO_JUDGE:
                self.reply_alignment.note_part(cosines)

    def incomplete_reason(self) -> str | None:
        """Why this member's view of the all-reduce is incomplete, or None if it is complete."""
        container, reducer = self.tensor_part_container, self.tensor_part_reducer
        if container.failed_size:
            why = f": {'; '.join(self.reducer_errors)}" if self.reducer_errors else ""
            return f"{container.failed_size / max(container.total_size, 1):.1%} of results missing (a reducer failed{why})"
        if self.banned_senders:
            return f"{len(self.banned_senders)} sender(s) dropped out while this peer reduced its shard"
        expected = reducer.num_parts * reducer.num_senders
        if expected and sum(reducer.num_parts_received) != expected:
            return f"received {sum(reducer.num_parts_received)}/{expected} input parts as a reducer"
        return None


def _take_reply(message_part, own: torch.Tensor | None) -> tuple[torch.Tensor, str | None, float | None]:
    """A reducer's reply decoded, why it cannot be an honest centre of ``own`` (None: it can, or
    ``own`` is None: replies are not checked), and its cosine with ``own`` (None: says nothing)."""
    part = deserialize_torch_tensor(message_part)
    if own is None:
        return part, None, None
    return part, implausible_reply(own, part, MIN_VALUES), reply_cosine(own, part, MIN_VALUES)
