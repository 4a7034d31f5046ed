"""The reducer's half of the exact all-reduce (:class:`~hivemind_adapter.exact_runner.ExactAllReduceRunner`
is the member's half, built on this one).

Contract: every sender of a part receives the same bytes, the averaged part itself (not a delta),
and only a whole part: once a sender dropped out, the others get an error, not an average without it
(unless ``whole_parts`` is off: a broadcast, whose receivers send nothing that counts);
with a proving reducer (one with a ``proof_context``), one more message follows the parts: the proof
of each part and this reducer's signature of their digest, the same bytes for every sender. A sender
handed every reply closes the stream itself; the reducer keeps it open for up to
:data:`REPLY_LINGER_SECONDS`, and never bans a sender whose every reply it made (all its parts are
in). A sender's parts are read and reduced whether or not it reads its replies.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from hivemind.averaging.allreduce import AllReduceRunner, BannedException
from hivemind.averaging.partition import AllreduceException
from hivemind.compression import NoCompression, deserialize_torch_tensor, serialize_torch_tensor
from hivemind.p2p import PeerID
from hivemind.proto import averaging_pb2
from hivemind.utils.asyncio import amap_in_executor

from hivemind_adapter.findings import WireBytes
from protocol.identity import Identity
from protocol.proof_attestation import ProofAttestation, group_tag, proofs_digest
from robust_aggregation.reducer_proof import pack_proofs

# How long a reducer keeps a sender's stream open after its last reply, waiting for the sender to
# close it (it does as soon as it holds every reply): a bound for a sender that died meanwhile.
REPLY_LINGER_SECONDS = 30.0


class ReducerReplies(AllReduceRunner):
    """An all-reduce runner whose reducer replies with the averaged parts and their signed proofs.

    ``signer``: the MANTA key this reducer signs its proofs' digest with (None: it has none, a test
    swarm). ``attestations`` collects the signed digests of the proofs messages this runner sealed
    (its member's half adds those it accepted). ``wire_bytes``, set by the averager before the run:
    a :class:`~hivemind_adapter.findings.WireBytes` counter of tensor payload bytes (None: not counted)."""

    def __init__(self, *args, signer: Identity | None = None, whole_parts: bool = True, **kwargs):
        super().__init__(*args, **kwargs)
        self.signer = signer
        self.whole_parts = whole_parts  # reply with no part a dropped-out sender is missing from
        # (digest, message): the proofs message as last sealed, the same for every sender
        self._sealed_proofs: tuple[str, averaging_pb2.AveragingData] | None = None
        self.attestations: list[ProofAttestation] = []
        self.wire_bytes: WireBytes | None = None
        self._served_whole: set[PeerID] = set()  # senders whose every reply this reducer made

    async def rpc_aggregate_part(
        self, stream: AsyncIterator[averaging_pb2.AveragingData], context
    ) -> AsyncIterator[averaging_pb2.AveragingData]:
        """The replies to one sender. Its parts are read and reduced as they come, whether or not it
        reads the replies: a sender that stopped reading (its all-reduce broke) would otherwise hold
        this reducer's next part, and every other member's all-reduce, until the all-reduce's bound."""
        sender = context.remote_id
        queue: asyncio.Queue = asyncio.Queue()  # at most this reducer's replies to one sender
        replies = super().rpc_aggregate_part(stream, context)
        pump = asyncio.create_task(self._reply_into(queue, replies, sender))
        try:
            while (message := await queue.get()) is not None:
                yield message
            await pump  # its exception, if it ended on one
        finally:
            if not pump.done():
                pump.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await pump
        if sender in self._served_whole:
            # Every reply is on its way: the sender closes the stream once it holds them all, and
            # closing it here first could drop the last ones. The wait ends, cancelled, when the
            # sender's close arrives.
            await asyncio.sleep(REPLY_LINGER_SECONDS)

    async def _reply_into(
        self, queue: asyncio.Queue, replies: AsyncIterator[averaging_pb2.AveragingData], sender: PeerID
    ) -> None:
        """Every message of ``replies`` to ``sender`` into ``queue``, then None; ``sender`` is served
        whole once every part's reply is made."""
        made = 0
        try:
            async for message in replies:
                if message.code == averaging_pb2.AVERAGED_PART:
                    made += 1
                    if made == self.tensor_part_reducer.num_parts:
                        self._served_whole.add(sender)
                queue.put_nowait(message)
        finally:
            queue.put_nowait(None)

    async def _ban_sender(self, peer_id: PeerID):
        # A sender that holds every reply closes its stream at once, maybe before this side has read
        # its end-of-stream: hivemind takes that cancellation for a drop-out. It is not one.
        if peer_id not in self._served_whole:
            await super()._ban_sender(peer_id)

    async def _accumulate_parts_streaming(
        self, stream: AsyncIterator[averaging_pb2.AveragingData], sender_index: int
    ) -> AsyncIterator[averaging_pb2.AveragingData]:
        loop = asyncio.get_event_loop()
        parts_done, not_whole = 0, False
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
                if self.whole_parts and self.banned_senders:
                    # the part lacks a sender that dropped out: a member handed it would hold a
                    # partial all-reduce it takes for a whole one, and commit what this reducer does not
                    not_whole = True
                    raise AllreduceException(
                        f"{len(self.banned_senders)} sender(s) dropped out: this reducer's parts are not whole"
                    )
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
            if parts_done != self.tensor_part_reducer.num_parts and not not_whole:
                await self._ban_sender(self.sender_peer_ids[sender_index])

    def seal_own_proofs(self) -> None:
        """Keep this reducer's own attestation once every part it reduces has its proof, even if no
        remote sender was sent them yet. Why: it serves its own member locally, and every member of
        an honest all-reduce must hold the same attestations."""
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
        """The proofs message for ``sender_index``: its proofs and this reducer's signature of their
        digest, sealed once per digest; its attestation is added to ``attestations``."""
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
            self.wire_bytes.count(sent, received)

    async def _counted(self, messages, sent: bool = True):
        """``messages`` as they pass, their tensor payload counted as sent (or received)."""
        async for message in messages:
            size = len(message.tensor_part.buffer)
            self._count(sent=size if sent else 0, received=0 if sent else size)
            yield message
