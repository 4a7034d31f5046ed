"""The butterfly all-reduce runner behind :class:`hivemind_adapter.allreduce.VerifiedAverager`:
reducers send back the averaged part itself (not a delta), so every member receives the same bytes
for every part; with robust averaging, reducers take a robust centre and members check what they are
sent. The one place that overrides hivemind's all-reduce protocol.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
from collections.abc import AsyncIterator

import torch
from hivemind.averaging.allreduce import AllreduceException, AllReduceRunner, BannedException
from hivemind.compression import NoCompression, deserialize_torch_tensor, serialize_torch_tensor
from hivemind.p2p import PeerID
from hivemind.proto import averaging_pb2
from hivemind.utils.asyncio import aiter_with_timeout, amap_in_executor, attach_event_on_finished

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

# How long a reducer keeps a sender's stream open after its last reply, waiting for the sender to
# close it (it does as soon as it holds every reply): a bound for a sender that died meanwhile.
REPLY_LINGER_SECONDS = 30.0


class ExactAllReduceRunner(AllReduceRunner):
    """A butterfly all-reduce whose outputs are the reducers' averages, not deltas against local parts.
    With ``robust``, this member reduces with a :class:`~hivemind_adapter.robust_reduce.RobustPartReducer`,
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
        super().__init__(*args, **kwargs)
        # Robust: this reducer signs the digest of its proofs message with its MANTA key (None: it
        # has none, a test swarm), and a member checks a reducer's signature under ``public_keys``
        # (the roster's, peer id -> hex key; a reducer not in it, or no roster: not checked).
        self.signer, self.public_keys = signer, public_keys
        # (digest, message): the proofs message as last sealed, the same for every sender
        self._sealed_proofs: tuple[str, averaging_pb2.AveragingData] | None = None
        # the signed digests of the proofs messages this member accepted and of those its own reducer
        # sent (protocol.proof_attestation)
        self.attestations: list[ProofAttestation] = []
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
        # With absolute outputs, a part whose reducer failed falls back to the local part, not to a zero delta.
        self.tensor_part_container.return_deltas = False
        self.reducer_errors: list[str] = []  # why each remote reducer failed this member, if one did
        self.wire_bytes = None  # VerifiedAverager's shared [sent, received] payload byte counters
        # the sampling noise this member measured in another stage, what a pair's reducer is held
        # to (None: pairs are not held to anything); and what the proofs it accepted here measured
        self.noise_reference: NoiseMap | None = None
        self.noise_measured: list[tuple[int, int, float]] = []
        self._part_starts: list[int] | None = None  # where each part begins in the flat vector
        self._served_whole: set[PeerID] = set()  # senders that were handed every reply of this reducer
        # reducers whose replies this member refused as implausible, and those of them refused only
        # for their own part's place (reducer_proof.OwnPartDoubt: barred for less by the owner)
        self.refused_reducers: set[PeerID] = set()
        self.refused_for_own_part: set[PeerID] = set()
        # per reducer (base58), the cosine of each reply with the part this member sent (robust only)
        self.reply_cosines: dict[str, list[float]] = {}

    reducer_type: type[RobustPartReducer] = RobustPartReducer  # (the red team's liars replace it)

    def _slotted_parts_of(self, reducer: PeerID) -> frozenset[int]:
        """Indices, among the parts ``reducer`` reduces, of the last ``slotted_tensors`` tensors' parts.
        hivemind never splits a part across tensors and deals parts to reducers in order, so the
        last tensors' parts are the last parts of the vector."""
        if self._slotted_tensors <= 0:
            return frozenset()
        container = self.tensor_part_container
        by_tensor = container.num_parts_by_tensor[-self._slotted_tensors :]
        if any(n != 1 for n in by_tensor):
            raise ValueError("a slotted tensor must fit in one part")
        total = sum(container.num_parts_by_tensor)
        index = self.ordered_peer_ids.index(reducer)
        first = sum(container.num_parts_by_peer[:index])
        theirs = range(first, first + container.num_parts_by_peer[index])
        return frozenset(i - first for i in range(total - len(by_tensor), total) if i in theirs)

    def _proof_context(self, reducer: PeerID) -> bytes:
        """What binds a reducer's proofs to this all-reduce and to that reducer (their sketches' seed)."""
        return bytes(self.group_id) + reducer.to_bytes()

    async def _communicate_with_peer(self, peer_id: PeerID):
        if peer_id != self.peer_id:
            try:
                return await self._exchange_with_reducer(peer_id)
            except Exception as e:
                # hivemind logs why at DEBUG only; the round's abort reason says it (a partial all-reduce
                # that only one member sees is rare and otherwise leaves no trace of its cause)
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
            except Exception as e:  # e.g. no usable part to reduce (robust): never leave the outputs waiting
                self.reducer_errors.append(f"this peer: {type(e).__name__}: {str(e)[:120]}")
                container.register_failed_reducer(peer_index)
                raise
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
                self.reply_cosines.setdefault(self.peer_id.to_base58(), []).append(c)  # the honest reference
            container.register_processed_part(peer_index, part_index, mine)

    async def _exchange_with_reducer(self, peer_id: PeerID) -> None:
        """Stream this member's parts of ``peer_id``'s shard to it and take back exactly that many
        averaged parts, then close this side of the stream first.

        The order of the closes is the point. hivemind reads replies until the reducer closes; the
        reducer's p2p daemon turns that close into a stream reset, and a reset makes the receiving
        daemon drop what it holds and has not passed on yet: over a 40 ms link under load the last
        reply was lost now and then, and the member alone saw a partial all-reduce ("sent 175 parts,
        but we expected 176", the churn benchmark). Here the member closes once it holds every reply,
        and the reducer waits for that (:meth:`rpc_aggregate_part`)."""
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

    async def rpc_aggregate_part(
        self, stream: AsyncIterator[averaging_pb2.AveragingData], context
    ) -> AsyncIterator[averaging_pb2.AveragingData]:
        sender, replies = context.remote_id, 0
        async for message in super().rpc_aggregate_part(stream, context):
            yield message  # resumed once the transport took it
            if message.code == averaging_pb2.AVERAGED_PART:
                replies += 1
                if replies == self.tensor_part_reducer.num_parts:
                    self._served_whole.add(sender)
        if sender in self._served_whole:
            # Every reply is on its way: the sender closes the stream once it holds them all, and
            # closing it here first could drop the last ones (see _exchange_with_reducer). The
            # wait ends, cancelled, when the sender's close arrives.
            await asyncio.sleep(REPLY_LINGER_SECONDS)

    async def _ban_sender(self, peer_id: PeerID):
        # A sender that holds every reply closes its stream at once, maybe before this side has read
        # its end-of-stream: hivemind takes that cancellation for a drop-out. It is not one (measured:
        # the reducer alone saw "1 sender(s) dropped out", its all-reduce failed, and the group split).
        if peer_id not in self._served_whole:
            await super()._ban_sender(peer_id)

    async def _accumulate_parts_streaming(
        self, stream: AsyncIterator[averaging_pb2.AveragingData], sender_index: int
    ) -> AsyncIterator[averaging_pb2.AveragingData]:
        loop = asyncio.get_event_loop()
        parts_done = 0
        try:
            async for part, weight, compression in amap_in_executor(
                lambda msg: (
                    deserialize_torch_tensor(msg.tensor_part),
                    msg.weight,
                    msg.tensor_part.compression,
                ),
                self._counted(stream, sent=False),
                max_prefetch=self.tensor_part_container.prefetch,
            ):
                try:
                    averaged = await self.tensor_part_reducer.accumulate_part(
                        sender_index, parts_done, part, weight=weight
                    )
                except BannedException:
                    break  # this sender was already excluded; nothing more to reduce for it
                parts_done += 1
                # The same averaged bytes go to every sender of this part: that is what makes results exact.
                payload = await loop.run_in_executor(None, serialize_torch_tensor, averaged, compression)
                self._count(sent=len(payload.buffer))
                yield averaging_pb2.AveragingData(code=averaging_pb2.AVERAGED_PART, tensor_part=payload)
            reducer = self.tensor_part_reducer
            if parts_done == reducer.num_parts and getattr(reducer, "proof_context", None) is not None:
                # one message after the parts: the proof of each (robust_aggregation.reducer_proof)
                # and this reducer's signature of their digest, the same bytes for every sender
                message = self._proofs_message(sender_index)
                self._count(sent=len(message.tensor_part.buffer))
                yield message
        finally:
            if parts_done != self.tensor_part_reducer.num_parts:
                await self._ban_sender(self.sender_peer_ids[sender_index])

    def seal_own_proofs(self) -> None:
        """Keep this reducer's own attestation once every part it reduces has its proof, even if no
        remote sender was sent them yet: it serves its own member's parts locally, and that member
        may hold every result first. Every member of an honest all-reduce then holds the same
        attestations (measured without this: a known cohort's confirmation differed 2 times in 6)."""
        reducer = self.tensor_part_reducer
        if getattr(reducer, "proof_context", None) is None or reducer.num_parts == 0:
            return
        if len(reducer.proofs) == reducer.num_parts:
            me = self.sender_peer_ids.index(self.peer_id) if self.peer_id in self.sender_peer_ids else 0
            self._proofs_message(me)

    def proofs_for(self, sender_index: int) -> list[bytes]:
        """The proofs this reducer sends ``sender_index`` (the same for every sender: a reducer that
        sends different ones signs its own equivocation; the red team overrides this)."""
        reducer = self.tensor_part_reducer
        return [reducer.proofs.get(j, b"") for j in range(reducer.num_parts)]

    def _proofs_message(self, sender_index: int) -> averaging_pb2.AveragingData:
        proofs = self.proofs_for(sender_index)
        digest = proofs_digest(pack_proofs(proofs).numpy().tobytes())
        if self._sealed_proofs is not None and self._sealed_proofs[0] == digest:
            return self._sealed_proofs[1]
        attestation = ProofAttestation.signed(
            self.signer, group_tag(bytes(self.group_id)), self.peer_id.to_base58(), digest
        )
        payload = serialize_torch_tensor(
            pack_proofs([*proofs, bytes.fromhex(attestation.signature)]), NoCompression.compression_type
        )
        message = averaging_pb2.AveragingData(code=averaging_pb2.AVERAGED_PART, tensor_part=payload)
        self._sealed_proofs = (digest, message)
        # its own word too: every member of an honest all-reduce then holds the same attestations
        self.attestations.append(attestation)
        return message

    def _count(self, sent: int = 0, received: int = 0) -> None:
        if self.wire_bytes is not None:
            with self.wire_bytes.get_lock():
                self.wire_bytes[0] += sent
                self.wire_bytes[1] += received

    async def _counted(self, messages, sent: bool = True):
        """``messages`` as they pass, their tensor payload counted as sent (or received)."""
        async for message in messages:
            size = len(message.tensor_part.buffer)
            self._count(sent=size if sent else 0, received=0 if sent else size)
            yield message

    def outlier_senders(self) -> list[str]:
        """Base58 ids of the peers whose values this member refused or named: senders its reducer
        refused or named an outlier on any part it reduced, then reducers whose replies it refused
        (always empty without ``robust``)."""
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
        """Where the ``index``-th part that peer ``peer_index`` reduces lies in the flat vector (hivemind
        deals consecutive parts to reducers in group order)."""
        if self._part_starts is None:  # the parts' sizes in vector order, each peer's in turn
            parts = self.tensor_part_container._input_parts_by_peer
            self._part_starts = [0, *itertools.accumulate(part.numel() for held in parts for part, _ in held)]
        first = sum(self.tensor_part_container.num_parts_by_peer[:peer_index]) + index
        return self._part_starts[first], self._part_starts[first + 1]

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
            # than one cosine's real scatter (a 2-site CI run barred an honest reducer of a pair).
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


# The fewest reducers of one all-reduce whose reply cosines are compared (see note_reply_alignments).
MIN_REDUCERS_TO_JUDGE = 3


def _take_reply(message_part, own: torch.Tensor | None) -> tuple[torch.Tensor, str | None, float | None]:
    """A reducer's reply decoded, why it cannot be an honest centre of ``own`` (None: it can, or
    ``own`` is None: replies are not checked), and its cosine with ``own`` (None: says nothing)."""
    part = deserialize_torch_tensor(message_part)
    if own is None:
        return part, None, None
    return part, implausible_reply(own, part, MIN_VALUES), reply_cosine(own, part, MIN_VALUES)
