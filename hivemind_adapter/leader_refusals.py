"""Potential leaders that refused a join request only because they were following, asked again.

hivemind's matchmaking asks each potential leader once per declared expiration: after any refusal
it keeps ``(leader, expiration)`` among its past attempts for the rest of the step. A peer that
answers NOT_A_LEADER follows another leader right now, and when that leader leaves (killed while
gathering) it leads itself, with the same expiration. The peers it refused in between never ask it
again: they form a group of their own below the quorum, or none, while its group begins without
them (seen: a cross group split 5 + 2 after its leader died, the 2 lost the round).

:func:`reask_peers_that_were_following` forgets such a refusal, so that the peer comes back with the
next read of the group key, which :func:`~hivemind_adapter.allreduce._spaced_reads` paces. A leader
whose own group is still gathering then joins it and sends its followers along (hivemind's
"disbanded, suggested leader"), so the larger group is the one that begins. Refusals for any other
reason, and leaders that did not answer, stay barred as hivemind has them.
"""

from __future__ import annotations

from collections.abc import Callable

from hivemind.p2p import PeerID
from hivemind.proto import averaging_pb2


class _FirstAnswerNoted:
    """A leader's reply stream whose first message's code is handed to ``note``."""

    def __init__(self, stream, note: Callable[[int], None]):
        self.stream, self.note = stream, note

    def __aiter__(self):
        return self

    async def __anext__(self):
        message = await self.stream.__anext__()
        if self.note is not None:
            note, self.note = self.note, None
            note(message.code)
        return message

    async def aclose(self) -> None:
        await self.stream.aclose()


class _JoinStub:
    """A stub whose join requests note the leader's first answer in ``answers`` (peer -> code)."""

    def __init__(self, stub, leader: PeerID, answers: dict[PeerID, int]):
        self.stub, self.leader, self.answers = stub, leader, answers

    async def rpc_join_group(self, request, timeout: float | None = None):
        stream = await self.stub.rpc_join_group(request, timeout)
        return _FirstAnswerNoted(stream, lambda code: self.answers.__setitem__(self.leader, code))


class _NotingServicer:
    """Stands in for the averager's class where hivemind's matchmaking builds a leader's stub."""

    def __init__(self, servicer_type, answers: dict[PeerID, int]):
        self.servicer_type, self.answers = servicer_type, answers

    def get_stub(self, p2p, peer: PeerID, *, namespace: str | None = None) -> _JoinStub:
        return _JoinStub(self.servicer_type.get_stub(p2p, peer, namespace=namespace), peer, self.answers)


def reask_peers_that_were_following(matchmaking) -> None:
    """Make ``matchmaking`` (hivemind's, on the averager's loop) drop a potential leader from its
    past attempts when that leader refused with NOT_A_LEADER, so a later read of the group key may
    offer it again. Only the join requests' first answers are read; nothing else changes."""
    answers: dict[PeerID, int] = {}  # written and read on the matchmaking's loop only
    matchmaking._servicer_type = _NotingServicer(matchmaking._servicer_type, answers)
    request_join_group = matchmaking._request_join_group

    async def request_join_group_again_later(leader: PeerID):
        answers.pop(leader, None)
        group = await request_join_group(leader)
        if answers.pop(leader, None) == averaging_pb2.NOT_A_LEADER and group is None:
            attempts = matchmaking.potential_leaders.past_attempts
            attempts.difference_update([attempt for attempt in attempts if attempt[0] == leader])
        return group

    matchmaking._request_join_group = request_join_group_again_later
