"""All-reduce in a group whose members are known in advance, without matchmaking.

hivemind forms every group through its DHT: a leader declares itself under the group's key, the
others read that key and send join requests, and the leader starts the all-reduce when its group is
full or its matchmaking time is over. When the DHT's nodes are across the wide area, those round trips
can cost more than the all-reduce itself, on every inner step.

The members of a cohort already know each other: the roster every peer read says who is in it.
Each member derives the same group id and peer order from what they share (see :func:`known_group_id`).
On arriving, a member tells every other member so (one small message each,
:meth:`KnownGroupSteps.rpc_known_group_arrived`) and waits until each has told it the same; then all
begin the all-reduce within a round trip of each other, however far apart they arrived (up to the
step's arrival bound, which hivemind's sender timeout no longer limits). A member that arrives
early holds a later member's parts until that member has registered the group
(:meth:`KnownGroupSteps.rpc_aggregate_part`); a member that never comes makes the step fail within
its bound, before anyone sent a part, with the tensors untouched, and the caller falls back to
matchmaking. A member that gave up answers a late member's arrival with "cancelled", so the late one
gives up at once instead of starting an all-reduce alone.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Sequence

# hivemind finds streaming RPCs by typing's AsyncIterator (collections.abc's has no _name it reads)
from typing import AsyncIterator  # noqa: UP035

from hivemind.averaging.group_info import GroupInfo
from hivemind.averaging.load_balancing import load_balance_peers
from hivemind.p2p import P2PContext, PeerID
from hivemind.proto import averaging_pb2
from hivemind.utils import MPFuture
from hivemind.utils.asyncio import achain, anext, as_aiter, enter_asynchronously

# Every known group's id starts with this: only for these does a reducer hold parts for a group it
# has not registered yet (a matchmade group is registered before its leader sends the start message).
KNOWN_GROUP_PREFIX = b"manta-known:"
# How long the caller waits for the averager's process beyond the step's own bound.
REPLY_GRACE_SECONDS = 5.0
ARRIVAL_CALL_SECONDS = 5.0  # one arrival message's bound (it is retried while the step may wait)
KEPT_ARRIVALS = 1024  # known groups whose arrivals a member remembers (the oldest are forgotten)


def known_group_id(*fields: str) -> bytes:
    """The id every member of a known group derives from the same ``fields`` (task, attempt, start
    state, members): peers that disagree on any of them are in different groups and never mix."""
    return KNOWN_GROUP_PREFIX + hashlib.sha256("\x1f".join(fields).encode()).digest()[:20]


class KnownGroupSteps:
    """Mixin for a DecentralizedAverager subclass: :meth:`step_in_known_group`."""

    def __init__(self, *args, **kwargs):
        # known group id -> the members that said they arrived, and an event set on each message
        self._known_arrivals: dict[bytes, tuple[set[PeerID], asyncio.Event]] = {}
        self._known_abandoned: set[bytes] = set()  # known groups this member gave up ("cancelled")
        super().__init__(*args, **kwargs)  # the averager may answer arrivals once this returns

    def step_in_known_group(
        self,
        group_id: bytes,
        peer_ids: Sequence[str],
        *,
        weight: float,
        arrival_timeout: float,
        allreduce_timeout: float,
        last: int | None = None,
    ) -> None:
        """Average this averager's tensors (only the ``last`` ones, if given: a small message among
        the same members) with ``peer_ids`` (base58, in the same order on every
        member) in group ``group_id``. Every member must have arrived within ``arrival_timeout``
        seconds (at most the sender timeout: hivemind drops a sender silent that long), and the
        all-reduce then has ``allreduce_timeout``. Raises on any failure; the tensors are then
        untouched (VerifiedAverager).

        Two bounds, not one, so that members do not part ways over timing: a step that gave up while
        its all-reduce ran could leave its partner with the complete result. Until every member has
        arrived, nobody sent a part, so a step that gives up waiting for arrivals takes nobody's
        result with it."""
        if not group_id.startswith(KNOWN_GROUP_PREFIX):
            raise ValueError("a known group's id comes from known_group_id()")
        future = MPFuture()
        self._outer_pipe.send(
            (
                "_step_in_known_group",
                [],
                dict(
                    group_id=group_id,
                    peer_ids=list(peer_ids),
                    weight=float(weight),
                    arrival_timeout=float(arrival_timeout),
                    allreduce_timeout=float(allreduce_timeout),
                    last=last,
                    future=future,
                ),
            )
        )
        future.result(timeout=arrival_timeout + allreduce_timeout + REPLY_GRACE_SECONDS)

    async def _step_in_known_group(
        self,
        group_id: bytes,
        peer_ids: list[str],
        weight: float,
        arrival_timeout: float,
        allreduce_timeout: float,
        last: int | None,
        future: MPFuture,
    ) -> None:
        try:
            ordered = tuple(PeerID.from_base58(p) for p in peer_ids)
            if self.peer_id not in ordered:
                raise ValueError("this peer is not a member of the known group")
            await self._all_arrived(group_id, ordered, arrival_timeout)
            group = GroupInfo(group_id, ordered, gathered=())
            kwargs = dict(self.allreduce_kwargs)
            min_vector_size = kwargs.pop("min_vector_size", 0)
            with self._register_allreduce_group(group):
                async with enter_asynchronously(self.get_tensors()) as local_tensors:
                    chosen = slice(None) if last is None else slice(len(local_tensors) - last, None)
                    tensors = list(local_tensors)[chosen]
                    size = sum(t.numel() for t in tensors)
                    # Every member of a known group reduces an equal share (no bandwidths were exchanged).
                    fractions = load_balance_peers(size, [1.0] * len(ordered), min(min_vector_size, size))
                    allreduce = asyncio.create_task(
                        self._run_allreduce_inplace_(
                            tensors,
                            group,
                            tensor_infos=None
                            if self.tensor_infos is None
                            else tuple(self.tensor_infos)[chosen],
                            weight=weight,
                            peer_fractions=fractions,
                            **kwargs,
                        )
                    )
                    arrived = asyncio.create_task(self._every_member_sends(group_id))
                    try:
                        done, _ = await asyncio.wait(
                            {allreduce, arrived}, timeout=arrival_timeout, return_when=asyncio.FIRST_COMPLETED
                        )
                        if not done:
                            raise TimeoutError
                        await asyncio.wait_for(asyncio.shield(allreduce), timeout=allreduce_timeout)
                    finally:
                        for task in (allreduce, arrived):
                            if not task.done():
                                task.cancel()
                        await asyncio.gather(allreduce, arrived, return_exceptions=True)
            future.set_result(None)
        except TimeoutError:
            if not future.done():
                future.set_exception(TimeoutError("a known group's member did not arrive or finish in time"))
        except BaseException as e:
            if not future.done():
                future.set_exception(e)

    def _arrival_entry(self, group_id: bytes) -> tuple[set[PeerID], asyncio.Event]:
        arrivals = self._known_arrivals
        if group_id not in arrivals:
            while len(arrivals) >= KEPT_ARRIVALS:
                forgotten = next(iter(arrivals))
                del arrivals[forgotten]
                self._known_abandoned.discard(forgotten)
            arrivals[group_id] = (set(), asyncio.Event())
        return arrivals[group_id]

    async def _all_arrived(self, group_id: bytes, ordered: tuple[PeerID, ...], timeout: float) -> None:
        """Tell the other members of ``group_id`` this one arrived and wait until each said so too;
        TimeoutError after ``timeout`` s, or at once if one of them already gave up (then this one is
        given up too: it answers later arrivals with "cancelled")."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + timeout
        arrived, event = self._arrival_entry(group_id)
        others = [p for p in ordered if p != self.peer_id]
        cancelled = asyncio.Event()

        async def tell(peer: PeerID) -> None:
            while loop.time() < give_up:
                try:
                    stub = self.get_stub(self._p2p, peer, namespace=self.prefix)
                    reply = await asyncio.wait_for(
                        stub.rpc_known_group_arrived(averaging_pb2.AveragingData(group_id=group_id)),
                        timeout=min(ARRIVAL_CALL_SECONDS, max(0.1, give_up - loop.time())),
                    )
                    if reply.code == averaging_pb2.MessageCode.CANCELLED:
                        cancelled.set()
                        event.set()
                    return
                except Exception:  # not reachable yet: try again while the step may wait
                    await asyncio.sleep(0.5)

        tellers = [asyncio.create_task(tell(p)) for p in others]
        gave_up = "a known group's member gave up before this one arrived"
        try:
            while not set(others) <= arrived:
                if cancelled.is_set():
                    raise TimeoutError(gave_up)
                remaining = give_up - loop.time()
                if remaining <= 0:
                    raise TimeoutError
                event.clear()
                try:
                    await asyncio.wait_for(event.wait(), timeout=remaining)
                except TimeoutError:
                    pass
            # the others that arrived first wait for this one's message: it must go out
            await asyncio.wait(tellers, timeout=max(0.1, min(ARRIVAL_CALL_SECONDS, give_up - loop.time())))
            if cancelled.is_set():  # its message was here from before it gave up
                raise TimeoutError(gave_up)
        except BaseException:
            self._known_abandoned.add(group_id)
            raise
        finally:
            for task in tellers:
                if not task.done():
                    task.cancel()
            await asyncio.gather(*tellers, return_exceptions=True)

    async def rpc_known_group_arrived(
        self, request: averaging_pb2.AveragingData, context: P2PContext
    ) -> averaging_pb2.AveragingData:
        """A member of known group ``request.group_id`` arrived (before or after this one did)."""
        if not request.group_id.startswith(KNOWN_GROUP_PREFIX):
            return averaging_pb2.AveragingData(code=averaging_pb2.MessageCode.BAD_GROUP_ID)
        arrived, event = self._arrival_entry(request.group_id)
        if request.group_id in self._known_abandoned:
            return averaging_pb2.AveragingData(code=averaging_pb2.MessageCode.CANCELLED)
        arrived.add(context.remote_id)
        event.set()
        return averaging_pb2.AveragingData(code=averaging_pb2.MessageCode.ACCEPTED)

    async def _every_member_sends(self, group_id: bytes) -> None:
        """Returns once every member of the registered group ``group_id`` began sending to this one."""
        runner = await self._running_groups[group_id]
        await runner.all_senders_started.wait()

    async def rpc_aggregate_part(
        self, stream: AsyncIterator[averaging_pb2.AveragingData], context
    ) -> AsyncIterator[averaging_pb2.AveragingData]:
        request = await anext(stream)
        if request.group_id.startswith(KNOWN_GROUP_PREFIX):
            # A member that got here first: hold its parts until this peer joins (hivemind would answer
            # "bad group id" at once), as long as it may wait for a sender anyway.
            loop = asyncio.get_running_loop()
            give_up = loop.time() + (self.allreduce_kwargs.get("sender_timeout") or 10.0)
            while request.group_id not in self._running_groups and loop.time() < give_up:
                await asyncio.sleep(0.01)
        async for message in super().rpc_aggregate_part(achain(as_aiter(request), stream), context):
            yield message
