"""hivemind's matchmaking, with signed declarations and partners the roster admits.

hivemind finds an averager's partners through unsigned DHT entries (peer id -> "looking" boolean) and
accepts a join request from any peer that knows the group key. On the open internet that lets anyone
stall a stage: declare peer ids that do not exist (every peer waits a request timeout on each before
it tries a real leader), withdraw an honest leader's declaration in its name, or join a group it has
no place in. Here (in the averager's process, where hivemind's matchmaking runs):

- :class:`SignedGroupKeys` stores each declaration sealed by the peer's MANTA key
  (:mod:`protocol.declarations`, which every node's validator checks) and, reading a group key, keeps
  only declarations that open, name this very key and the expiry they are stored with (a replayed
  one is refused), and whose key the roster pairs with the peer id they speak for;
- :func:`admit_only_roster_peers` makes a leader refuse join requests from peers outside that roster
  (libp2p authenticates the requester's peer id, so none can pose as another), and a follower refuse
  a group its leader assembled with any such peer (a dishonest leader could otherwise fill a group
  with peers of its own making, enough to outvote the honest members of a robust all-reduce).

``admitted`` is the roster as this peer last read it (peer id -> public key hex), or None before the
first read: then any validly signed declaration counts, and anyone may join.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from hivemind.averaging.key_manager import GroupKey, GroupKeyManager
from hivemind.p2p import PeerID
from hivemind.proto import averaging_pb2
from hivemind.utils import DHTExpiration, get_logger

from protocol.declarations import AveragingDeclaration, declaration_subkey, open_declaration_value
from protocol.dht_schema import dht_key_id
from protocol.identity import Identity
from protocol.peer_keys import Speaker
from protocol.sealing import RecordRejected, seal

logger = get_logger(__name__)

# A declaration's signed expiry (ms) may differ from its entry's by rounding only.
EXPIRY_SLACK_MS = 1


@dataclass(frozen=True)
class DeclarationSigner:
    """Who declares: the task the group keys belong to and what the node signs as."""

    task_id: str
    speaker: Speaker

    @property
    def identity(self) -> Identity:
        return self.speaker.identity


@dataclass
class Admission:
    """The roster's peers (peer id -> public key hex) an averager meets, as last set; None: anyone.
    Lives in the averager's process, where only its event loop reads and writes it."""

    peers: dict[str, str] | None = None
    refused: dict[str, int] = field(default_factory=dict)  # refusals by reason, for tests and operators

    def allows(self, peer_id: str, public_key: str | None = None) -> bool:
        if self.peers is None:
            return True
        known = self.peers.get(peer_id)
        return known is not None and (public_key is None or known == public_key)

    def count(self, reason: str) -> None:
        self.refused[reason] = self.refused.get(reason, 0) + 1


class SignedGroupKeys(GroupKeyManager):
    """hivemind's GroupKeyManager with sealed declarations, read back through the roster."""

    def __init__(self, plain: GroupKeyManager, signer: DeclarationSigner, admission: Admission):
        # the same state as the manager hivemind built (its constructor would warn about group sizes again)
        self.__dict__.update(plain.__dict__)
        self.signer, self.admission = signer, admission

    async def declare_averager(
        self, group_key: GroupKey, peer_id: PeerID, expiration_time: float, looking_for_group: bool = True
    ) -> bool:
        if not looking_for_group:  # as hivemind withdraws: just after the declaration, so it overwrites it
            expiration_time = float(np.nextafter(expiration_time, float("inf")))
        identity = self.signer.identity
        declaration = AveragingDeclaration(
            task_id=self.signer.task_id,
            group_key=group_key,
            peer_id=peer_id.to_base58(),
            public_key=identity.public_key_hex,
            endorsement=self.signer.speaker.endorsement,
            looking=looking_for_group,
            expiration_ms=int(round(expiration_time * 1000)),
        )
        return await self.dht.store(
            key=group_key,
            subkey=declaration_subkey(declaration.peer_id, identity.public_key_hex),
            value=seal(declaration, identity),
            expiration_time=expiration_time,
            return_future=True,
        )

    async def get_averagers(
        self, group_key: GroupKey, only_active: bool
    ) -> list[tuple[PeerID, DHTExpiration]]:
        result = await self.dht.get(group_key, latest=True, return_future=True)
        if result is None or not isinstance(result.value, dict):
            return []
        key_id = dht_key_id(group_key)
        averagers: dict[str, tuple[PeerID, DHTExpiration]] = {}
        for subkey, entry in result.value.items():
            try:
                sealed = open_declaration_value(self.signer.task_id, key_id, subkey, entry.value)
            except RecordRejected as e:
                self.admission.count(e.reason.value)
                continue
            declaration = sealed.record
            if declaration.group_key != group_key:
                self.admission.count("other_group_key")
            elif abs(declaration.expiration_ms - entry.expiration_time * 1000) > EXPIRY_SLACK_MS:
                self.admission.count("replayed")
            elif not self.admission.allows(declaration.peer_id, declaration.public_key):
                self.admission.count("not_in_roster")
            elif declaration.looking or not only_active:
                averagers[declaration.peer_id] = (
                    PeerID.from_base58(declaration.peer_id),
                    entry.expiration_time,
                )
        return list(averagers.values())


def admit_only_roster_peers(matchmaking, admission: Admission) -> None:
    """Make ``matchmaking`` (hivemind's, in the averager's process) refuse join requests from peers
    that ``admission`` does not allow, before any of hivemind's own checks; and, as a follower, leave
    a leader whose group holds such a peer: it looks for another leader as if that one had disbanded
    (the leader's all-reduce then fails without it, and nothing of that group is applied here)."""
    check: Callable = matchmaking._check_reasons_to_reject
    assemble: Callable = matchmaking.follower_assemble_group

    def check_reasons_to_reject(request, context):
        if not admission.allows(context.remote_id.to_base58()):
            admission.count("join_not_in_roster")
            return averaging_pb2.MessageFromLeader(code=averaging_pb2.PROTOCOL_VIOLATION)
        return check(request, context)

    async def follower_assemble_group(leader: PeerID, msg: averaging_pb2.MessageFromLeader):
        strangers = [p for p in msg.ordered_peer_ids if not admission.allows(PeerID(p).to_base58())]
        if strangers:
            admission.count("group_not_in_roster")
            logger.warning(
                f"leader {leader.to_base58()[-8:]} assembled a group with {len(strangers)} peer(s) outside "
                "the roster: not joining it"
            )
            return None  # hivemind's follower then goes on to its next potential leader
        return await assemble(leader, msg)

    matchmaking._check_reasons_to_reject = check_reasons_to_reject
    matchmaking.follower_assemble_group = follower_assemble_group
