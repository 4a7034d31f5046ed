"""All-reduce in a group whose members are known in advance, without matchmaking.

hivemind forms every group through its DHT: a leader declares itself under the group's key, the
others read that key and send join requests, and the leader starts the all-reduce when its group is
full or its matchmaking time is over. When the DHT's nodes are across the wide area, those round trips
can cost more than the all-reduce itself, on every inner step.

The members of a cohort already know each other: the roster every peer read says who is in it.
Each member derives the same group id and peer order from what they share (see :func:`known_group_id`)
and goes straight to the all-reduce. A member that arrives early holds a later member's parts until
that member has registered the group (:meth:`KnownGroupSteps.rpc_aggregate_part`); a member that never
comes makes the step fail within its bound, with the tensors untouched, and the caller falls back to
matchmaking.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Sequence

# hivemind finds streaming RPCs by typing's AsyncIterator (collections.abc's has no _name it reads)
from typing import AsyncIterator  # noqa: UP035

from hivemind.averaging.group_info import GroupInfo
from hivemind.averaging.load_balancing import load_balance_peers
from hivemind.p2p import PeerID
from hivemind.proto import averaging_pb2
from hivemind.utils import MPFuture
from hivemind.utils.asyncio import achain, anext, as_aiter, enter_asynchronously

# Every known group's id starts with this: only for these does a reducer hold parts for a group it
# has not registered yet (a matchmade group is registered before its leader sends the start message).
KNOWN_GROUP_PREFIX = b"manta-known:"
# How long the caller waits for the averager's process beyond the step's own bound.
REPLY_GRACE_SECONDS = 5.0


def known_group_id(*fields: str) -> bytes:
    """The id every member of a known group derives from the same ``fields`` (task, attempt, start
    state, members): peers that disagree on any of them are in different groups and never mix."""
    return KNOWN_GROUP_PREFIX + hashlib.sha256("\x1f".join(fields).encode()).digest()[:20]


class KnownGroupSteps:
    """Mixin for a DecentralizedAverager subclass: :meth:`step_in_known_group`."""

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
        arrived, no reducer has answered anyone (a reducer answers a part once every sender sent it),
        so a step that gives up waiting for arrivals takes nobody's result with it."""
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
