"""hivemind all-reduce that leaves every group member with bit-identical results, or none.

hivemind's butterfly all-reduce returns to each sender the *delta* ``average - own_part`` and the
sender adds it to its own tensor. In floating point ``x + (avg - x)`` is not ``avg`` (a gradient
element near zero next to a large local value rounds away), so members of one group end a step with
tensors that differ in their last bits, and peers that must apply the same optimizer step drift
apart. A member whose reducer died also keeps its *own* values for that shard and still reports
success (see shared/research/hivemind.md §3.6).

:class:`ExactAllReduceRunner` changes one thing in the protocol: reducers send back the averaged part
itself. Every member then receives the same bytes for every shard, so results agree bit for bit.
:class:`VerifiedAverager` collects the results aside and writes them into the averaged tensors only
when the all-reduce was complete from its point of view (no failed reducer, every sender's parts
received); otherwise the step raises :class:`PartialAllReduceError` and the tensors are untouched.
Failures seen only by *another* member are caught one level up (:mod:`peer.hierarchy`), which compares
what members report after the step. A NaN or infinite result is never written either
(:class:`NonFiniteResultError`): one member's NaN would otherwise become every member's. With a
:class:`~hivemind_adapter.robust_reduce.RobustConfig`, reducers take a robust centre of the senders'
parts (CenteredClip, as BTARD does) and report whom they named (:meth:`VerifiedAverager.last_outliers`).
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
from collections.abc import AsyncIterator, Sequence

import torch
from hivemind.averaging import DecentralizedAverager
from hivemind.averaging.allreduce import AllreduceException, AllReduceRunner, AveragingMode, BannedException
from hivemind.averaging.control import AveragingStage, StepControl
from hivemind.averaging.group_info import GroupInfo
from hivemind.averaging.matchmaking import MatchmakingException
from hivemind.compression import (
    NoCompression,
    deserialize_torch_tensor,
    serialize_torch_tensor,
)
from hivemind.p2p import PeerID
from hivemind.proto import averaging_pb2
from hivemind.utils import MPFuture, get_dht_time
from hivemind.utils.asyncio import (
    aiter_with_timeout,
    amap_in_executor,
    as_aiter,
    attach_event_on_finished,
    azip,
)

from hivemind_adapter.alignment import MIN_VALUES, AlignmentRecord
from hivemind_adapter.known_groups import KnownGroupSteps
from hivemind_adapter.robust_reduce import RobustConfig, RobustPartReducer, SharedNames, implausible_reply

# How long a reducer keeps a sender's stream open after its last reply, waiting for the sender to
# close it (it does as soon as it holds every reply): a bound for a sender that died meanwhile.
REPLY_LINGER_SECONDS = 30.0


class PartialAllReduceError(AllreduceException):
    """Part of the vector was not averaged over the whole group; nothing was written."""


class NonFiniteResultError(PartialAllReduceError):
    """The averaged result holds a NaN or an infinity (a sender sent one): nothing was written."""


class AllReduceBroke(MatchmakingException):
    """A step's group formed and its all-reduce failed (partial, a member silent, a reducer gone):
    nothing was written, so the step may be taken again with the same tensors. hivemind reports every
    such failure as a MatchmakingException, like a group that never formed; this subclass tells them
    apart (and hivemind's step still handles it as one)."""


class ExactAllReduceRunner(AllReduceRunner):
    """A butterfly all-reduce whose outputs are the reducers' averages, not deltas against local parts.
    With ``robust``, this member reduces with a :class:`~hivemind_adapter.robust_reduce.RobustPartReducer`."""

    def __init__(
        self,
        *args,
        robust: RobustConfig | None = None,
        alignment: AlignmentRecord | None = None,
        **kwargs,
    ):
        super().__init__(*args, **kwargs)
        self.alignment = alignment if robust is not None else None
        self.check_replies = robust is not None  # doubt a reducer's reply against our own part
        if robust is not None:
            unused = self.tensor_part_reducer
            suspects = self.alignment.suspects() if self.alignment is not None else set()
            excluded = [i for i, p in enumerate(self.sender_peer_ids) if p.to_base58() in suspects]
            self.tensor_part_reducer = RobustPartReducer(
                unused.part_shapes,
                unused.num_senders,
                robust,
                excluded=excluded,
                min_aligned_values=MIN_VALUES,
            )
            unused.finished.set()  # never used: its finalize would report "received 0% of input tensors"
        # With absolute outputs, a part whose reducer failed falls back to the local part, not to a zero delta.
        self.tensor_part_container.return_deltas = False
        self.reducer_errors: list[str] = []  # why each remote reducer failed this member, if one did
        self.wire_bytes = None  # VerifiedAverager's shared [sent, received] payload byte counters
        self._served_whole: set[PeerID] = set()  # senders that were handed every reply of this reducer

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
        try:
            replies = await self._get_peer_stub(peer_id).rpc_aggregate_part(inputs)
            if self.should_delay_results(self.peer_id):  # a member that reduces nothing sends first
                await sent_all.wait()
            loop = asyncio.get_running_loop()
            async for message in aiter_with_timeout(replies, self.reducer_timeout):
                if message.code != averaging_pb2.AVERAGED_PART:
                    raise AllreduceException(f"{peer_id} sent {averaging_pb2.MessageCode.Name(message.code)}")
                self._count(received=len(message.tensor_part.buffer))
                part = await loop.run_in_executor(None, deserialize_torch_tensor, message.tensor_part)
                if self.check_replies:
                    own = container._input_parts_by_peer[peer_index][received][0]
                    doubt = implausible_reply(own, part, MIN_VALUES)
                    if doubt is not None:
                        raise AllreduceException(f"implausible reply to part {received}: {doubt}")
                container.register_processed_part(peer_index, received, part)
                received += 1
                if received == expected:
                    break
            if received != expected:
                raise AllreduceException(f"peer {peer_id} sent {received} parts, but we expected {expected}")
        except BaseException:
            container.register_failed_reducer(peer_index)
            raise
        finally:
            if replies is not None:
                with contextlib.suppress(RuntimeError):  # it is still running only if it was cancelled
                    await replies.aclose()

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
        finally:
            if parts_done != self.tensor_part_reducer.num_parts:
                await self._ban_sender(self.sender_peer_ids[sender_index])

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
        """Base58 ids of the senders this member's reducer refused or named an outlier on any part it
        reduced (always empty without ``robust``)."""
        reducer = self.tensor_part_reducer
        named = set(getattr(reducer, "outliers", {})) | set(getattr(reducer, "excluded", ()))
        return [self.sender_peer_ids[i].to_base58() for i in sorted(named)]

    def note_alignments(self) -> None:
        """Add the cosines this member's reducer measured to the averager's alignment record."""
        if self.alignment is None:
            return
        for cosines in getattr(self.tensor_part_reducer, "alignments", []):
            self.alignment.note_part({self.sender_peer_ids[i].to_base58(): c for i, c in cosines.items()})

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


# hivemind's matchmaking re-reads its group key from the DHT as soon as the last read found no better
# leader: while a peer waits for partners, one lookup (several DHT requests) follows another without
# pause. Measured with 8 thin peers (benchmarks/swarm_scale.py), that was ~1600 DHT requests per peer
# per round, most of the swarm's DHT traffic. Spaced this far apart, a leader that declares itself is
# still found well within one matchmaking period.
GROUP_KEY_READ_SPACING = 0.5


def _spaced_reads(key_manager) -> None:
    """Let ``key_manager`` look its group key up at most every :data:`GROUP_KEY_READ_SPACING` s."""
    read = key_manager.get_averagers
    last = [float("-inf")]

    async def get_averagers(group_key, only_active: bool):
        wait = last[0] + GROUP_KEY_READ_SPACING - asyncio.get_running_loop().time()
        if wait > 0:
            await asyncio.sleep(wait)
        last[0] = asyncio.get_running_loop().time()
        return await read(group_key, only_active)

    key_manager.get_averagers = get_averagers


class VerifiedAverager(KnownGroupSteps, DecentralizedAverager):
    """A DecentralizedAverager whose steps are exact (bit-identical across members) and all-or-nothing
    locally: on any partial failure the step raises and the averaged tensors keep their old values.

    Use it like the base class; ``step()`` returns the gathered metadata of every group member, and
    :meth:`~hivemind_adapter.known_groups.KnownGroupSteps.step_in_known_group` averages with members
    known in advance, without matchmaking. With ``robust``, its reducer withstands a minority of
    malicious senders; :meth:`last_outliers` names those it caught.
    """

    runner_type: type[ExactAllReduceRunner] = ExactAllReduceRunner  # what runs each all-reduce

    def __init__(self, *args, robust: RobustConfig | None = None, **kwargs):
        # [sent, received] tensor payload bytes of this averager's all-reduces with other peers: written
        # in the averager's process, read here (shared memory, made before that process forks)
        self._wire_bytes = multiprocessing.Array("q", 2)
        self._last_outliers = SharedNames()  # what the last all-reduce's reducer named, shared likewise
        self._robust = robust  # read in the averager's process, by every runner it builds
        # how each sender's parts pointed, across this averager's all-reduces: kept (and only ever
        # read) in the averager's process, where its reducers run
        self._alignment = AlignmentRecord() if robust is not None else None
        super().__init__(*args, **kwargs)

    def last_outliers(self) -> list[str]:
        """Base58 ids of the senders this averager's reducer refused (non-finite) or named outliers in
        its last all-reduce (its last step, whether it succeeded or not), in sender order; empty
        without ``robust``. Read it after each step: the next all-reduce, a known group's
        confirmation included, replaces it."""
        return self._last_outliers.read()

    def wire_bytes(self) -> tuple[int, int]:
        """Tensor payload bytes this averager's all-reduces sent and received so far."""
        sent, received = self._wire_bytes[:]
        return int(sent), int(received)

    # hivemind builds its matchmaking inside the averager's process; this is where MANTA's spacing of
    # group-key reads is put in (see _spaced_reads).
    @property
    def _matchmaking(self):
        try:
            return self.__dict__["_manta_matchmaking"]
        except KeyError:
            raise AttributeError("_matchmaking") from None

    @_matchmaking.setter
    def _matchmaking(self, matchmaking) -> None:
        _spaced_reads(matchmaking.group_key_manager)
        self.__dict__["_manta_matchmaking"] = matchmaking

    def set_target_group_size(self, size: int | None, wait: bool = True):
        """Form groups as soon as ``size`` members joined (cohorts grow and shrink between rounds)."""
        future = MPFuture()
        self._outer_pipe.send(("_set_target_group_size", [], dict(size=size, future=future)))
        return future.result() if wait else future

    async def _set_target_group_size(self, size: int | None, future: MPFuture):
        try:
            self._matchmaking.target_group_size = size
            self._matchmaking.potential_leaders.target_group_size = size
            future.set_result(None)
        except BaseException as e:
            if not future.done():
                future.set_exception(e)

    def set_allreduce_timeout(self, seconds: float) -> None:
        """Bound the all-reduce of the next steps (from the moment their group formed) to ``seconds``:
        how long one may run depends on the stage and on what recent rounds took."""
        future = MPFuture()
        self._outer_pipe.send(("_set_allreduce_timeout", [], dict(seconds=float(seconds), future=future)))
        future.result()

    async def _set_allreduce_timeout(self, seconds: float, future: MPFuture):
        self._allreduce_timeout = seconds  # read by hivemind's step, in this (the averager's) process
        future.set_result(None)

    def set_follow_only(self, follow: bool) -> None:
        """Take the next steps as a follower only (or, with ``False``, as this averager was built):
        it never leads a group nor accepts members, and reduces no part. A group then cannot form
        without a peer that may lead: what a broadcast needs, whose receivers must not meet among
        themselves while the sender is still busy (hivemind forms any group of ``min_group_size``
        once the matchmaking time has passed)."""
        client = follow or self.client_mode
        self.mode = AveragingMode.CLIENT if client else AveragingMode.NODE  # what this step gathers
        future = MPFuture()
        self._outer_pipe.send(("_set_follow_only", [], dict(client=client, future=future)))
        future.result()

    async def _set_follow_only(self, client: bool, future: MPFuture):
        try:
            self._matchmaking.client_mode = client  # no declaring, and join requests are refused
            future.set_result(None)
        except BaseException as e:
            if not future.done():
                future.set_exception(e)

    async def _aggregate_with_group(self, group_info: GroupInfo, min_vector_size: int, **kwargs):
        try:
            return await super()._aggregate_with_group(group_info, min_vector_size, **kwargs)
        except MatchmakingException as e:  # hivemind's wrapping of whatever broke the all-reduce
            raise AllReduceBroke(str(e)) from e

    async def _run_allreduce_inplace_(
        self, tensors: Sequence[torch.Tensor], group_info: GroupInfo, group_id: bytes | None = None, **kwargs
    ):
        group_id = group_info.group_id if group_id is None else group_id
        runner = self.runner_type(
            p2p=self._p2p,
            servicer_type=type(self),
            prefix=self.prefix,
            tensors=tensors,
            group_id=group_id,
            ordered_peer_ids=group_info.peer_ids,
            robust=self._robust,
            alignment=self._alignment,
            **kwargs,
        )
        runner.wire_bytes = self._wire_bytes
        assert group_id in self._running_groups, "all-reduce group was not registered"
        self._running_groups[group_id].set_result(runner)
        self._last_outliers.write([])
        try:
            if runner.modes[group_info.peer_ids.index(self.peer_id)] == AveragingMode.AUX:
                async for _ in runner:
                    raise ValueError("auxiliary peers receive no averaged tensors")
                return
            results = []
            async for _tensor, averaged in azip(as_aiter(*tensors), runner):
                results.append(averaged)
        finally:  # what this member's reducer named, whether the step succeeded or not
            runner.note_alignments()
            self._last_outliers.write(runner.outlier_senders())
        reason = runner.incomplete_reason()
        if reason is not None or len(results) != len(tensors):
            raise PartialAllReduceError(f"all-reduce in group {group_id.hex()[:12]} was partial: {reason}")
        if not all(bool(torch.isfinite(averaged).all()) for averaged in results):
            raise NonFiniteResultError(
                f"all-reduce in group {group_id.hex()[:12]} gave NaN or infinite values"
            )
        for tensor, averaged in zip(tensors, results):
            tensor.copy_(averaged)
        self.last_updated = get_dht_time()
        self._state_updated.set()


def looking_for_group(control: StepControl) -> bool:
    """Whether a step started with ``wait=False`` is still gathering its group (so cancelling it is
    safe: cancelling one whose all-reduce already runs races hivemind's own completion)."""
    return control.stage == AveragingStage.LOOKING_FOR_GROUP


def member_ids(gathered: dict) -> dict[str, object]:
    """A finished step's gathered metadata keyed by base58 peer id."""
    return {str(k.to_base58() if hasattr(k, "to_base58") else k): v for k, v in gathered.items()}
