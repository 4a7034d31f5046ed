"""The swarm's sealed records, and the rule that binds a peer's key to its libp2p peer id.

Sealed (signed, :mod:`protocol.sealing`): :class:`PeerAnnouncement` (``manta/announce/v1``),
:class:`IdentityBinding` (``manta/binding/v2``), :class:`ContributionReceipt` (``manta/receipt/v2``),
:class:`Revocation` (``manta/revocation/v1``), :class:`RoundCommit` (``manta/commit/v2``),
:class:`ReducerConviction` (``manta/conviction/v1``), :class:`AveragingDeclaration`
(``manta/declaration/v2``), :class:`StateAnchor` (``manta/anchor/v1``) and :class:`PeerProgress`
(``manta/progress/v2``). The task itself is :class:`protocol.task_spec.TaskSpec`. Every model forbids
unknown fields, takes strict types (no ``"1"`` for 1, no 1.0 for 1), bounds every string, list and
integer, and is immutable.

Units: every ``timestamp`` is Unix time in **milliseconds** (int). Hashes and keys are lowercase hex.
Peer ids are libp2p base58 strings. Fractional quantities are integers in a unit named by the field
(``throughput_milli`` is samples/s x 1000).

Credit: a receipt's credit is ``samples * flops_per_sample``. ``flops_per_sample`` is the training
FLOPs (forward + backward) that one sample costs *summed over all the sub-networks the peer trained
on it this round*: a peer that runs each sample through K sub-networks reports ``samples`` = distinct
samples, ``flops_per_sample`` = the sum of the K sub-networks' per-sample training FLOPs, and
``subnet_hashes`` lists the K configs.

Identity binding: a peer's MANTA key and its libp2p key sign each other (:mod:`protocol.peer_keys`).
Records that speak for a peer id (binding, commit report, progress, declaration) carry the libp2p
key's ``endorsement`` of the sealing key, and opening them checks it. :func:`check_binding` accepts a
receipt only when the receipt, the binding and the transport-level sender agree on peer id and key.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field, StringConstraints, model_validator

from protocol.averaging_group import MAX_PROOF_HASHES
from protocol.canonical import MAX_SAFE_INTEGER
from protocol.fields import Endorsement, Hex32, HexId, Int53, Name, PeerId, SignedInt53, StrictModel, Text
from protocol.proof_attestation import TOKEN_MAX_CHARS, TOKEN_PATTERN, ProofAttestation
from protocol.sealing import RecordRejected, RejectReason, Sealed, SealedRecord

__all__ = [
    "LEDGER_ENTRY_TYPES",
    "MAX_CHECKS_POSTED",
    "MAX_PROOFS_POSTED",
    "Affinity",
    "AveragingDeclaration",
    "ContributionReceipt",
    "DeviceInfo",
    "GroupKeyName",
    "IdentityBinding",
    "PeerAnnouncement",
    "PeerProgress",
    "ProofToken",
    "ReducerConviction",
    "Revocation",
    "RoundCommit",
    "StateAnchor",
    "check_binding",
]


class DeviceInfo(StrictModel):
    """One compute device a peer offers: its kind, name and memory in MiB."""

    kind: Literal["cpu", "cuda", "mps", "xpu"]
    name: Text
    memory_mb: Int53


class Affinity(StrictModel):
    """Who is close to whom: peers on one host average first, then peers on one network."""

    host_id: HexId
    network_id: HexId


class PeerAnnouncement(SealedRecord):
    """A peer's offer to work on a task, published in the DHT."""

    RECORD_TYPE: ClassVar[str] = "announce"
    MAX_WIRE_BYTES: ClassVar[int] = 16 * 1024

    task_id: Name
    peer_id: PeerId
    public_key: Hex32
    devices: Annotated[tuple[DeviceInfo, ...], Field(min_length=1, max_length=64)]
    throughput_milli: Int53  # measured samples per second x 1000
    affinity: Affinity
    cohort_id: Name
    timestamp: Int53


class IdentityBinding(SealedRecord):
    """ "Key ``public_key`` speaks as libp2p peer ``peer_id``", sealed by that key and endorsed by the
    peer id's libp2p key (:mod:`protocol.peer_keys`): the two keys sign each other."""

    RECORD_TYPE: ClassVar[str] = "binding"
    VERSION: ClassVar[int] = 2  # 2: endorsed by the libp2p key
    MAX_WIRE_BYTES: ClassVar[int] = 2 * 1024

    peer_id: PeerId
    public_key: Hex32
    endorsement: Endorsement
    timestamp: Int53


class ContributionReceipt(SealedRecord):
    """What a peer contributed to one round, sealed by the peer's key; one ledger entry.

    ValidationError unless ``group_index`` < ``group_size``, ``subnet_hashes`` has no repeats,
    ``worker_samples`` (if any) add up to ``samples``, ``data_shards`` is sorted without repeats and
    ``cohort_rank`` < ``num_cohorts``.
    """

    RECORD_TYPE: ClassVar[str] = "receipt"
    VERSION: ClassVar[int] = 2  # 2: the group is a Merkle root and this peer's proof, not a member list
    MAX_WIRE_BYTES: ClassVar[int] = 32 * 1024

    task_id: Name
    round: Int53
    peer_id: PeerId
    public_key: Hex32
    seq: Int53  # per-key sequence number: strictly increasing over the key's accepted receipts
    cohort_id: Name
    subnet_hashes: Annotated[tuple[Hex32, ...], Field(min_length=1, max_length=64)]
    samples: Annotated[int, Field(ge=1, le=MAX_SAFE_INTEGER)]
    flops_per_sample: Annotated[int, Field(ge=1, le=MAX_SAFE_INTEGER)]  # summed over subnet_hashes
    grad_commitment: Hex32  # SHA-256 of the exact gradient payload the peer shared
    state_digest: Hex32  # SHA-256 digest of the model/optimizer state the gradient was computed from
    group_id: HexId
    # The group commits to its contributors instead of listing them (:mod:`protocol.averaging_group`):
    # the Merkle root over every (peer, samples), how many there are, and the proof that this peer is
    # leaf ``group_index`` with exactly ``samples``. O(log n) in the group's size, never capped by it.
    group_root: Hex32
    group_size: Annotated[int, Field(ge=1, le=MAX_SAFE_INTEGER)]
    group_index: Int53
    group_proof: Annotated[tuple[Hex32, ...], Field(max_length=MAX_PROOF_HASHES)]
    timestamp: Int53
    # What the aggregator checks the claim against (empty in receipts that predate them): the
    # samples of each of the peer's workers (their streams are what an audit replays), and a fixed
    # random projection of the peer's mean gradient x 10^9 (what an audit compares, with a tolerance).
    worker_samples: Annotated[tuple[Int53, ...], Field(max_length=64)] = ()
    grad_sketch: Annotated[tuple[SignedInt53, ...], Field(max_length=64)] = ()
    # Tasks on an operator's dataset (TaskSpec.data): the training shards (manifest indices, sorted)
    # whose samples the workers' streams drew from (tasks.shard_assignment); the audit replays them.
    data_shards: Annotated[tuple[Int53, ...], Field(max_length=4096)] = ()
    # Where the receipt sits in the round, so the aggregator derives rather than believes: the
    # averaging attempt whose commits must name its group (``group_id`` hashes it), and the cohort's
    # rank among the round's cohorts, which fixes the sub-networks it trained in model-parallel
    # rounds (:mod:`aggregator.work_pricing`). Receipts that predate them carry the defaults.
    attempt: Int53 = 0
    cohort_rank: Int53 = 0
    num_cohorts: Annotated[int, Field(ge=1, le=MAX_SAFE_INTEGER)] = 1

    @model_validator(mode="after")
    def _fields_agree(self) -> ContributionReceipt:
        if self.group_index >= self.group_size:
            raise ValueError("group_index must lie inside the group (below group_size)")
        if len(set(self.subnet_hashes)) != len(self.subnet_hashes):
            raise ValueError("subnet_hashes lists a sub-network twice")
        if self.worker_samples and sum(self.worker_samples) != self.samples:
            raise ValueError("worker_samples must add up to samples")
        if list(self.data_shards) != sorted(set(self.data_shards)):
            raise ValueError("data_shards must be sorted and list each shard once")
        if self.cohort_rank >= self.num_cohorts:
            raise ValueError("cohort_rank must lie below num_cohorts")
        return self

    @property
    def credit(self) -> int:
        """``samples * flops_per_sample``: what the ledger credits for this receipt."""
        return self.samples * self.flops_per_sample


class Revocation(SealedRecord):
    """A correction appended to the ledger by its aggregator: entry ``entry_index`` earns no credit."""

    RECORD_TYPE: ClassVar[str] = "revocation"
    MAX_WIRE_BYTES: ClassVar[int] = 2 * 1024

    task_id: Name
    entry_index: Int53
    entry_leaf_hash: Hex32  # binds the revocation to the exact entry
    reason: Text
    timestamp: Int53


MAX_PROOFS_POSTED = 16  # attestations one commit report carries (a cohort stage, a cross stage, retries)
MAX_CHECKS_POSTED = 8  # checked groups of three one commit report carries (a cohort stage, cross levels)
ProofToken = Annotated[str, StringConstraints(max_length=TOKEN_MAX_CHARS, pattern=TOKEN_PATTERN)]


class RoundCommit(SealedRecord):
    """A peer's report at the end of an averaging attempt: did it succeed, and with which result.

    Every participant publishes one in the DHT and a result commits once a quorum of the roster
    reports ``ok`` with the same ``digest``; sealing it means nobody can abort other peers' rounds, or
    fake agreement, in another peer's name. ValidationError if a ``checking`` marker also carries a
    result, a state, a group or a departure.
    """

    RECORD_TYPE: ClassVar[str] = "commit"
    VERSION: ClassVar[int] = 2  # 2: endorsed by the peer id's libp2p key
    MAX_WIRE_BYTES: ClassVar[int] = 8192

    task_id: Name
    attempt: Int53
    peer_id: PeerId
    public_key: Hex32
    endorsement: Endorsement  # the peer id's libp2p key's signature of ``public_key``
    ok: bool
    digest: Annotated[str, StringConstraints(max_length=64, pattern=r"^(?:[0-9a-f]{32}|[0-9a-f]{64})?$")]
    timestamp: Int53
    # The peer is leaving and will not take part in ``attempt`` (``ok`` is False): peers whose roster
    # still lists it abandon the attempt at once instead of waiting for it until their step timeout.
    # Not an attempt anyone ran, so it does not move the swarm's attempt counter.
    left: bool = False
    # The digest of the training state this peer holds after committing ``digest`` (the report is
    # posted again with it once the step is applied; empty before): a peer that falls behind loads
    # the state a quorum reports holding, from those peers (``peer.catch_up``).
    state: Annotated[str, StringConstraints(max_length=64, pattern=r"^(?:[0-9a-f]{32}|[0-9a-f]{64})?$")] = ""
    # The averaging group of the result ``digest`` (:func:`protocol.averaging_group.averaging_group_id`:
    # attempt, contributors' root and count, start state; empty with ``ok`` False): what every
    # contributor's receipt names, so the aggregator credits only groups that other peers committed.
    group: Annotated[str, StringConstraints(max_length=64, pattern=r"^(?:[0-9a-f]{64})?$")] = ""
    # Peers whose values this peer's reducers named outliers in the attempt (robust averaging): their
    # contribution was clipped or dropped, so the aggregator does not credit it.
    outliers: Annotated[tuple[PeerId, ...], Field(max_length=32)] = ()
    # The robust reducers' signed digests of the proofs this peer accepted in the attempt
    # (:mod:`protocol.proof_attestation` tokens): two that a reducer signed for one all-reduce and that
    # differ show that it told members different stories, and no result it took part in commits.
    proofs: Annotated[tuple[ProofToken, ...], Field(max_length=MAX_PROOFS_POSTED)] = ()
    # The all-reduces of three that this peer checked in the attempt and found right
    # (:func:`protocol.averaging_group.stage_check_token`: the stage, its members, the result's digest).
    # Each member of such a group goes on only once both partners list its token. Later reports of
    # the attempt repeat the list, since they replace the earlier ones.
    checked: Annotated[tuple[Hex32, ...], Field(max_length=MAX_CHECKS_POSTED)] = ()
    # Reducers whose averages this peer refused in the attempt (its all-reduce broke on them, and it
    # never meets them again in it): a partner waiting for its confirmation of a group with one of
    # them stops waiting at once.
    refused: Annotated[tuple[PeerId, ...], Field(max_length=MAX_CHECKS_POSTED)] = ()
    # A marker, not a report: the peer posted its checks and waits for its partners'. Readers of the
    # attempt's outcome treat it as "not reported yet" (``ok`` is False, and means nothing here).
    checking: bool = False

    @model_validator(mode="after")
    def _a_marker_reports_nothing(self) -> RoundCommit:
        if self.checking and (self.ok or self.left or self.digest or self.state or self.group):
            raise ValueError("a checking marker carries checks only: no result, state, group or departure")
        return self


class ReducerConviction(SealedRecord):
    """Evidence that a reducer told two members of one all-reduce different stories: two digests of
    proofs messages it signed for one group (:mod:`protocol.proof_attestation`), as members posted them.

    Sealed by the poster's own key (``public_key``). ValidationError unless both attestations are one
    reducer's for one group and name different digests; :meth:`signatures_hold` checks that both are
    signed by ``reducer_key``. Honest software never signs two digests for one group, so a conviction
    holds against the key whatever peer id it runs under.
    """

    RECORD_TYPE: ClassVar[str] = "conviction"
    MAX_WIRE_BYTES: ClassVar[int] = 2048

    task_id: Name
    public_key: Hex32  # the poster's
    reducer_key: Hex32  # the key both attestations are signed by
    first: ProofToken
    second: ProofToken
    timestamp: Int53

    @model_validator(mode="after")
    def _two_stories_of_one_group(self) -> ReducerConviction:
        first, second = ProofAttestation.from_token(self.first), ProofAttestation.from_token(self.second)
        if (first.group, first.reducer) != (second.group, second.reducer):
            raise ValueError("the two attestations must be one reducer's for one all-reduce")
        if first.digest == second.digest:
            raise ValueError("the two attestations must name different proofs")
        return self

    @property
    def reducer(self) -> str:
        """The peer id the reducer signed under."""
        return ProofAttestation.from_token(self.first).reducer

    def signatures_hold(self) -> bool:
        """Whether both attestations are signed by ``reducer_key`` (the check a validator makes)."""
        return all(
            ProofAttestation.from_token(t).verifies(self.reducer_key) for t in (self.first, self.second)
        )


# hivemind's group keys are ``<prefix>.0b<bits>``; MANTA's prefixes are ``<task id>_<averager>``.
GroupKeyName = Annotated[str, StringConstraints(max_length=256, pattern=r"^[A-Za-z0-9_.:/-]+\.0b[01]{0,64}$")]


class AveragingDeclaration(SealedRecord):
    """ "Peer ``peer_id`` (spoken for by ``public_key``) is, or is no longer, ``looking`` for an
    all-reduce group under ``group_key`` until ``expiration_ms``", sealed by that key."""

    RECORD_TYPE: ClassVar[str] = "declaration"
    VERSION: ClassVar[int] = 2  # 2: endorsed by the peer id's libp2p key
    MAX_WIRE_BYTES: ClassVar[int] = 1024

    task_id: Name
    group_key: GroupKeyName
    peer_id: PeerId
    public_key: Hex32
    endorsement: Endorsement
    looking: bool
    expiration_ms: Int53  # DHT time x 1000: hivemind orders leaders by their entry's expiry


class StateAnchor(SealedRecord):
    """A model state the task's aggregator vouches for: the state of its newest checkpoint, which it
    serves by digest from ``holder`` (its own node). A peer catching up adopts a state only if a
    quorum committed its digest or an aggregator of the task anchored it here."""

    RECORD_TYPE: ClassVar[str] = "anchor"
    MAX_WIRE_BYTES: ClassVar[int] = 1024

    task_id: Name
    round: Int53  # the round the state is the result of
    attempt: Int53
    digest: Annotated[str, StringConstraints(pattern=r"^(?:[0-9a-f]{32}|[0-9a-f]{64})$")]
    timestamp: Int53
    holder: PeerId  # the node that serves it (hivemind_adapter.state_archive)


class PeerProgress(SealedRecord):
    """A peer's progress in the round it is computing, published about once a second (and every
    :data:`peer.swarm_progress.AVERAGING_PUBLISH_EVERY` s while it averages that round).

    The swarm closes a round when the samples reported for it by all peers reach the task's
    ``target_samples_per_round``: every peer contributes what it manages in that time instead of a
    fixed share, so nobody waits for the slowest. The aggregator's monitor reads the same records.
    ``state_round`` is the round the peer's model state is the result of, plus one (0: initial state).
    """

    RECORD_TYPE: ClassVar[str] = "progress"
    VERSION: ClassVar[int] = 2  # 2: endorsed by the peer id's libp2p key
    MAX_WIRE_BYTES: ClassVar[int] = 8192

    task_id: Name
    peer_id: PeerId
    public_key: Hex32
    endorsement: Endorsement
    round: Int53  # the round being computed
    samples: Int53  # samples processed in it so far
    throughput_milli: Int53  # samples per second x 1000, over this round so far
    loss_micro: Int53  # mean training loss over those samples x 10^6
    cohort_id: Name
    state_round: Int53
    timestamp: Int53
    # The final figures of the last round this peer finished computing (0 samples: none yet). A
    # reader polling the DHT may never see a round's last in-round report (the next round's first one
    # overwrites it); these carry it into every later record, so no round's totals are lost.
    finished_round: Int53 = 0
    finished_samples: Int53 = 0
    finished_loss_micro: Int53 = 0
    # Since the peer started: outer steps it took (sync = "outer"), and the payload bytes its
    # all-reduces sent and received across cohorts (the wide-area traffic), for the dashboard.
    outer_steps: Int53 = 0
    cross_cohort_bytes: Int53 = 0
    # Tasks on an operator's dataset: the shards this peer holds and serves (a bitmap over the
    # manifest's indices, hex, bit i of byte i // 8 = shard i; where others fetch from), and the shard
    # bytes it has served to others and fetched itself since it started.
    shards_held: Annotated[str, StringConstraints(max_length=4096, pattern=r"^(?:[0-9a-f]{2})*$")] = ""
    data_bytes_served: Int53 = 0
    data_bytes_fetched: Int53 = 0
    # True: published while the peer averages ``round`` after computing it (``samples`` is final and
    # ``throughput`` is not extrapolated): the round is still the swarm's, though nobody computes it.
    averaging: bool = False


LEDGER_ENTRY_TYPES: tuple[type[SealedRecord], ...] = (ContributionReceipt, Revocation)
"""The record types a ledger's entries are."""


def check_binding(
    receipt: Sealed[ContributionReceipt], binding: Sealed[IdentityBinding], sender_peer_id: str | None
) -> None:
    """Accept ``receipt`` only if ``binding`` ties its key to its peer id and it came from that peer.

    ``binding`` must be an opened (signature-checked) IdentityBinding; ``sender_peer_id`` is the libp2p
    peer id the receipt arrived from. Raises RecordRejected(UNBOUND_PEER) otherwise.
    """
    bound = binding.record
    if not isinstance(bound, IdentityBinding):
        raise RecordRejected(RejectReason.UNBOUND_PEER, "the binding is not an IdentityBinding")
    if binding.public_key != receipt.public_key or bound.public_key != receipt.record.public_key:
        raise RecordRejected(RejectReason.UNBOUND_PEER, "the binding is for another key")
    if bound.peer_id != receipt.record.peer_id:
        raise RecordRejected(
            RejectReason.UNBOUND_PEER,
            f"the key is bound to {bound.peer_id}, the receipt names {receipt.record.peer_id}",
        )
    if sender_peer_id != bound.peer_id:
        raise RecordRejected(
            RejectReason.UNBOUND_PEER,
            f"the receipt came from {sender_peer_id}, not from the bound {bound.peer_id}",
        )
