"""Wire records: strict, frozen, versioned pydantic models, and the one sealing format for all of them.

Records
-------
:class:`TaskSpec` (``manta/task/v1``), :class:`PeerAnnouncement` (``manta/announce/v1``),
:class:`IdentityBinding` (``manta/binding/v1``), :class:`ContributionReceipt` (``manta/receipt/v2``),
:class:`Revocation` (``manta/revocation/v1``), :class:`RoundCommit` (``manta/commit/v1``) and
:class:`PeerProgress` (``manta/progress/v1``) are sealed (signed); :class:`Checkpoint` travels as a
C2SP signed note instead (see :mod:`protocol.note`). Every model forbids unknown fields, takes strict
types (no ``"1"`` for 1, no 1.0 for 1), bounds every string, list and integer, and is immutable.

Units: every ``timestamp`` is Unix time in **milliseconds** (int). Hashes and keys are lowercase hex.
Peer ids are libp2p base58 strings. Fractional quantities are integers in a unit named by the field
(``throughput_milli`` is samples/s x 1000) or decimal strings (``learning_rate``).

Credit: a receipt's credit is ``samples * flops_per_sample``. ``flops_per_sample`` is the training
FLOPs (forward + backward, about 3x the forward FLOPs) that one sample costs *summed over all the
sub-networks the peer trained on it this round*: a peer that runs each sample through K sub-networks
(the sandwich rule) reports ``samples`` = distinct samples and ``flops_per_sample`` = the sum of the K
sub-networks' per-sample training FLOPs, and ``subnet_hashes`` lists the K configs. So a bigger
sub-network, or more of them, earns more per sample.

Sealing
-------
``seal(record, identity) -> bytes`` gives the wire form (``make_sealed`` gives it already opened, as a
:class:`Sealed`), which is also the ledger entry::

    manta/receipt/v2\\n                       <- domain prefix: record type and version
    {"cohort_id":...,"timestamp":...}\\n      <- RFC 8785 canonical JSON of the full record
    ed25519 <64 hex public key> <128 hex signature>

The signature covers the first two lines without the final newline (``Sealed.message``: the exact
signed bytes). The ledger stores the whole wire form, so the exact signed bytes and their signature
are kept together and anyone can re-check them. Wire bytes are safe as a hivemind DHT value. The JSON must be *the* canonical encoding of the record it parses to (every field
present, nothing else), so one record has exactly one encoding and one leaf hash.

``open_sealed(wire, expected_type) -> Sealed`` checks size, framing, type and version, schema,
canonical form, that the signer is the key the record names, and the signature, in that order
(cheapest first); it raises :class:`RecordRejected` with a :class:`RejectReason`. ``expected_type``
may be a tuple of record classes. :func:`parse_sealed` does the same without the signature check (for
re-reading a ledger whose signatures were checked when it was verified).

Identity binding
----------------
A peer's Ed25519 key is bound to its libp2p peer id by an :class:`IdentityBinding` that names the peer
id and is sealed with the Ed25519 key. :func:`check_binding` accepts a receipt only when the receipt,
the binding and the transport-level sender agree on peer id and key.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Generic, Literal, TypeVar

from pydantic import Field, StringConstraints, ValidationError, model_validator

from protocol.averaging_group import MAX_PROOF_HASHES
from protocol.canonical import (
    MAX_SAFE_INTEGER,
    ascii_canonical_json,
    canonical_json,
    domain_prefix,
    split_signed_message,
)
from protocol.fields import (
    Decimal,
    Hex32,
    HexId,
    Int53,
    Name,
    Origin,
    PeerId,
    SignedInt53,
    StrictModel,
    Text,
)
from protocol.identity import Identity, verify_signature
from protocol.note import checkpoint_body, open_note, parse_checkpoint_body, sign_note, split_note
from protocol.proof_attestation import TOKEN_MAX_CHARS, TOKEN_PATTERN, ProofAttestation
from protocol.shards import DataSpec

# -- reasons ----------------------------------------------------------------------------------------


class RejectReason(enum.StrEnum):
    """Why a record (or a contribution) was refused; the value is the stable code that is counted."""

    MALFORMED = "malformed"  # framing, JSON, missing field, value out of range or pattern
    UNKNOWN_FIELD = "unknown_field"
    WRONG_TYPE = "wrong_type"  # a field of the wrong JSON type
    OVERSIZE = "oversize"  # the wire form, a string or a list over its limit
    NON_CANONICAL = "non_canonical"  # valid JSON for the record, but not its RFC 8785 encoding
    WRONG_RECORD = "wrong_record"  # another record type than expected
    UNSUPPORTED_VERSION = "unsupported_version"
    BAD_SIGNATURE = "bad_signature"  # signature invalid, or signed by a key the record does not name
    WRONG_TASK = "wrong_task"
    REPLAY = "replay"  # exactly this record was already accepted
    OUT_OF_ORDER = "out_of_order"  # a sequence number not above the key's last accepted one
    STALE_TIMESTAMP = "stale_timestamp"  # timestamp outside the accepted window (too old or ahead)
    UNBOUND_PEER = "unbound_peer"  # no binding for the peer, or peer id / key / sender disagree
    ROUND_WINDOW = "round_window"  # a round the swarm is not in (too old, or ahead of it)
    GROUP_MISMATCH = "group_mismatch"  # the averaging group it names does not agree with the claim
    IMPLAUSIBLE = "implausible_samples"  # more samples than the peer's announced throughput allows
    NON_FINITE = "non_finite"  # gradient statistics missing or not finite
    AUDIT_FAILED = "audit_failed"  # a spot audit recomputed another gradient (revocation reason)
    MISPRICED = "mispriced"  # sub-networks or FLOPs other than the task derives for the round and cohort
    UNWITNESSED = "unwitnessed"  # no commit of another peer names the group the receipt claims
    EXCLUDED = "excluded"  # the key failed an audit and is excluded from the task
    AUDIT_UNAVAILABLE = "audit_unavailable"  # an audit could not get the start state (revocation reason)
    OUTLIER = "outlier"  # other peers' reducers named its values outliers: they were clipped or dropped
    EQUIVOCATED = "equivocated"  # as a reducer it signed two different proofs for one all-reduce


class RecordRejected(ValueError):
    """A record refused for ``reason``; ``detail`` says what exactly (one line)."""

    def __init__(self, reason: RejectReason, detail: str) -> None:
        super().__init__(f"{reason.value}: {detail}")
        self.reason = reason
        self.detail = detail


# -- field types ------------------------------------------------------------------------------------

MAX_WIRE_BYTES = 64 * 1024


class SealedRecord(StrictModel):
    """A record type that is sealed (signed); subclasses set the type name, version and size limit."""

    RECORD_TYPE: ClassVar[str]
    VERSION: ClassVar[int] = 1
    MAX_WIRE_BYTES: ClassVar[int] = MAX_WIRE_BYTES

    @classmethod
    def prefix(cls) -> bytes:
        return domain_prefix(cls.RECORD_TYPE, cls.VERSION)

    def signer_allowed(self, public_key: bytes) -> bool:
        """Whether ``public_key`` may seal this record: the record's own ``public_key`` if it names one."""
        own = getattr(self, "public_key", None)
        return own is None or own == public_key.hex()

    def canonical(self) -> bytes:
        """The RFC 8785 encoding of the full record (what is signed)."""
        return canonical_json(self.model_dump(mode="json"))

    def is_canonical(self, body: bytes) -> bool:
        """Whether ``body`` is exactly :meth:`canonical` (fast path first; see protocol.canonical)."""
        fields = self.model_dump(mode="json")
        return ascii_canonical_json(fields) == body or canonical_json(fields) == body


# -- records ----------------------------------------------------------------------------------------


class SwarmParams(StrictModel):
    """What every peer of a task must agree on. New settings are added here (a new TaskSpec version)."""

    target_samples_per_round: Annotated[int, Field(ge=1, le=MAX_SAFE_INTEGER)]
    subnets_per_step: Annotated[int, Field(ge=1, le=64)]  # K sub-networks sampled per step
    batch_size: Annotated[int, Field(ge=1, le=1 << 20)]  # per peer, per step
    max_group_size: Annotated[int, Field(ge=1, le=256)]  # all-reduce group size
    round_timeout_ms: Annotated[int, Field(ge=1, le=MAX_SAFE_INTEGER)]
    receipt_window_ms: Annotated[int, Field(ge=1, le=MAX_SAFE_INTEGER)]  # how old a receipt may be
    learning_rate: Decimal
    # fp16 on the wire between cohorts (halves WAN traffic); the same for every peer, since every
    # member of an exact all-reduce must receive the same bytes.
    cross_cohort_fp16: bool = False
    # Robust averaging (hivemind_adapter.robust_reduce): every all-reduce reducer takes CenteredClip of
    # its senders' parts, so a minority sending garbage, scaled or sign-flipped gradients or NaN is
    # clipped or dropped (and named in the commit) instead of becoming everyone's step.
    robust_averaging: bool = True
    # Cohort leaders per cross-cohort all-reduce group: more cohorts than this average up a tree of
    # such groups (peer/cross_tree.py), so no group grows with the swarm.
    cross_group_size: Annotated[int, Field(ge=2, le=256)] = 8
    # The schedule: learning rate (warm-up + cosine) and progressive-shrinking phases follow the round
    # number over ``total_rounds``; rounds past it keep the last phase and the final learning rate.
    total_rounds: Annotated[int, Field(ge=1, le=MAX_SAFE_INTEGER)] = 1000
    warmup_rounds: Annotated[int, Field(ge=0, le=MAX_SAFE_INTEGER)] = 0
    schedule: Literal["sandwich", "progressive"] = "sandwich"
    # Supernet size (see supernet.training.TrainConfig): small values make CPU swarms practical.
    width_mult: Decimal = "1.0"
    head_channels: Annotated[int, Field(ge=8, le=1 << 16)] = 640
    # How cohorts synchronise (peer/outer_step.py). "every-step": every round's gradient is averaged
    # across the whole swarm. "outer": rounds average inside each cohort only; every ``inner_steps``
    # rounds the cohorts average their pseudo-gradients (parameters at the last outer step minus
    # parameters now), sent through ``outer_compression`` with error feedback, and every peer applies
    # the same outer Nesterov step (``outer_lr``, ``outer_momentum``). DiLoCo's 0.7 / 0.9 suit its
    # hundreds of inner steps; at 5, plain averaging of the cohorts' progress (1.0 / 0) matched
    # every-step within 1 pp over 60 rounds where 0.7 / 0.9 fell 6-10 pp short
    # (benchmarks/README.md at 7085eb3, "Outer steps, part 3").
    sync: Literal["every-step", "outer"] = "every-step"
    # 5: see benchmarks/README.md at 7085eb3, "Outer steps between cohorts", for why
    inner_steps: Annotated[int, Field(ge=1, le=100_000)] = 5
    outer_lr: Decimal = "1.0"
    outer_momentum: Decimal = "0.0"
    outer_compression: Literal["none", "fp16", "int8", "int4"] = "int8"
    # the exchange runs while the next inner steps compute; its step lands one outer period late
    outer_overlap: bool = True

    @model_validator(mode="after")
    def _outer_step_settings(self) -> SwarmParams:
        if not float(self.outer_lr) > 0:
            raise ValueError(f"outer_lr: {self.outer_lr} is not positive")
        if not 0 <= float(self.outer_momentum) < 1:
            raise ValueError(f"outer_momentum: {self.outer_momentum} is not in [0, 1)")
        return self


class TaskSpec(SealedRecord):
    """The training task an aggregator publishes; sealed by one of its ``aggregator_keys``."""

    RECORD_TYPE: ClassVar[str] = "task"

    task_id: Name
    task: Name  # built-in task name (see ``tasks/``)
    mode: Literal["data", "model"]
    seed: Int53
    params: SwarmParams
    aggregator_keys: Annotated[tuple[Hex32, ...], Field(min_length=1, max_length=16)]
    ledger_origin: Origin  # the origin line of the task's ledger checkpoints
    timestamp: Int53
    # the operator's own dataset, packed into content-addressed shards (None: a built-in task's data,
    # which every peer makes or ships itself)
    data: DataSpec | None = None

    def signer_allowed(self, public_key: bytes) -> bool:
        return public_key.hex() in self.aggregator_keys


class DeviceInfo(StrictModel):
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
    """ "Key ``public_key`` speaks as libp2p peer ``peer_id``", sealed by that key."""

    RECORD_TYPE: ClassVar[str] = "binding"
    MAX_WIRE_BYTES: ClassVar[int] = 2 * 1024

    peer_id: PeerId
    public_key: Hex32
    timestamp: Int53


class ContributionReceipt(SealedRecord):
    """What a peer contributed to one round, sealed by the peer's key; one ledger entry."""

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
    reports ``ok`` with the same ``digest`` (see ``peer.round_commit``); sealing it means nobody can
    abort other peers' rounds, or fake agreement, in another peer's name.
    """

    RECORD_TYPE: ClassVar[str] = "commit"
    MAX_WIRE_BYTES: ClassVar[int] = 8192  # (1 KiB before the proofs' attestations)

    task_id: Name
    attempt: Int53
    peer_id: PeerId
    public_key: Hex32
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
    # Each member of such a group goes on only once both partners list its token: a reducer that held
    # one member's results back, to hide a lie behind the entry that member never checked, leaves it
    # without the token (see ``peer.round_commit.await_partners_checked``). Later reports of the
    # attempt repeat the list, since they replace the earlier ones.
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

    The commit board shows such a pair only to peers that read it while both reports live, and a
    victim whose report comes after the others committed is seen by nobody who could act on it. The
    peer that finds a pair posts it here, sealed by its own key (no one can overwrite another's
    evidence); anyone can check it, since both signatures must hold under ``reducer_key``. Honest
    software never signs two digests for one group, so the key is convicted whatever peer id it runs
    under: peers stop meeting it and the aggregator stops crediting it."""

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
    MAX_WIRE_BYTES: ClassVar[int] = 1024

    task_id: Name
    group_key: GroupKeyName
    peer_id: PeerId
    public_key: Hex32
    looking: bool
    expiration_ms: Int53  # DHT time x 1000: hivemind orders leaders by their entry's expiry


class StateAnchor(SealedRecord):
    """A model state the task's aggregator vouches for: the state of its newest checkpoint, which it
    serves. A peer catching up adopts a state that one node serves only if a quorum committed its
    digest or an aggregator of the task anchored it here, never on its server's word."""

    RECORD_TYPE: ClassVar[str] = "anchor"
    MAX_WIRE_BYTES: ClassVar[int] = 1024

    task_id: Name
    round: Int53  # the round the state is the result of
    attempt: Int53
    digest: Annotated[str, StringConstraints(pattern=r"^(?:[0-9a-f]{32}|[0-9a-f]{64})$")]
    timestamp: Int53


class PeerProgress(SealedRecord):
    """A peer's progress in the round it is computing, published about once a second.

    The swarm closes a round when the samples reported for it by all peers reach the task's
    ``target_samples_per_round``: every peer contributes what it manages in that time instead of a
    fixed share, so nobody waits for the slowest. The aggregator's monitor reads the same records.
    ``state_round`` is the round the peer's model state is the result of, plus one (0: initial state).
    """

    RECORD_TYPE: ClassVar[str] = "progress"
    MAX_WIRE_BYTES: ClassVar[int] = 8192

    task_id: Name
    peer_id: PeerId
    public_key: Hex32
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


class Checkpoint(StrictModel):
    """A signed tree head of a ledger: its origin, size and RFC 6962 root (hex).

    Travels as a C2SP checkpoint note (:meth:`to_note`, :meth:`from_note`), not as a sealed record.
    """

    origin: Origin
    size: Int53
    root: Hex32

    @property
    def root_bytes(self) -> bytes:
        return bytes.fromhex(self.root)

    def body(self) -> str:
        return checkpoint_body(self.origin, self.size, self.root_bytes)

    def to_note(self, identity: Identity) -> str:
        """The checkpoint note signed by ``identity`` under the key name ``origin``."""
        return sign_note(self.body(), self.origin, identity)

    @classmethod
    def from_note(cls, note: str, public_key: bytes, name: str | None = None) -> Checkpoint:
        """Parse a checkpoint note after checking the signature by ``public_key`` (NoteError if not).

        The key name defaults to the checkpoint's own origin line.
        """
        text, _ = split_note(note)
        origin, size, root = parse_checkpoint_body(text)
        open_note(note, name or origin, public_key)
        return cls(origin=origin, size=size, root=root.hex())


SEALED_TYPES: dict[tuple[str, int], type[SealedRecord]] = {
    (cls.RECORD_TYPE, cls.VERSION): cls
    for cls in (
        TaskSpec,
        PeerAnnouncement,
        IdentityBinding,
        ContributionReceipt,
        Revocation,
        RoundCommit,
        AveragingDeclaration,
        PeerProgress,
        StateAnchor,
        ReducerConviction,
    )
}
_TYPE_NAMES = {cls.RECORD_TYPE for cls in SEALED_TYPES.values()}
LEDGER_ENTRY_TYPES: tuple[type[SealedRecord], ...] = (ContributionReceipt, Revocation)

# -- sealing ----------------------------------------------------------------------------------------

R = TypeVar("R", bound=SealedRecord)

_TRAILER_RE = re.compile(rb"ed25519 ([0-9a-f]{64}) ([0-9a-f]{128})")


@dataclass(frozen=True, slots=True)
class Sealed(Generic[R]):
    """An opened sealed record.

    ``message`` is the exact signed bytes (prefix + canonical JSON); ``wire`` is ``message`` plus the
    signature line, the bytes a DHT value carries and the ledger stores as the entry.
    """

    record: R
    public_key: bytes
    signature: bytes
    message: bytes
    wire: bytes


def make_sealed(record: R, identity: Identity) -> Sealed[R]:
    """Seal ``record`` with ``identity`` (a key the record allows) and return the opened form."""
    if not record.signer_allowed(identity.public_key):
        raise ValueError(f"{type(record).__name__} may not be sealed by key {identity.fingerprint}")
    message = type(record).prefix() + record.canonical()
    signature = identity.sign(message)
    wire = message + b"\ned25519 " + identity.public_key.hex().encode() + b" " + signature.hex().encode()
    if len(wire) > type(record).MAX_WIRE_BYTES:
        raise ValueError(f"sealed {type(record).__name__} is {len(wire)} bytes, over its limit")
    return Sealed(record, identity.public_key, signature, message, wire)


def seal(record: SealedRecord, identity: Identity) -> bytes:
    """The wire bytes of ``record`` signed by ``identity`` (which must be a key the record allows)."""
    return make_sealed(record, identity).wire


def open_sealed(wire: bytes, expected_type: type[R] | tuple[type[SealedRecord], ...]) -> Sealed[R]:
    """Check and open a sealed record; RecordRejected(reason, detail) if anything is wrong."""
    return _open(wire, expected_type, check_signature=True)


def parse_sealed(wire: bytes, expected_type: type[R] | tuple[type[SealedRecord], ...]) -> Sealed[R]:
    """:func:`open_sealed` without the canonical-form and signature checks (for already verified data)."""
    return _open(wire, expected_type, check_signature=False)


def _open(wire: Any, expected_type: Any, check_signature: bool) -> Sealed[Any]:
    expected = expected_type if isinstance(expected_type, tuple) else (expected_type,)
    if not isinstance(wire, bytes | bytearray | memoryview):
        raise RecordRejected(RejectReason.MALFORMED, f"expected bytes, got {type(wire).__name__}")
    wire = bytes(wire)
    limit = max(cls.MAX_WIRE_BYTES for cls in expected)
    if len(wire) > limit:
        raise RecordRejected(RejectReason.OVERSIZE, f"{len(wire)} bytes, the limit is {limit}")
    message, newline, trailer = wire.rpartition(b"\n")
    try:
        if not newline:
            raise ValueError
        record_type, version, body = split_signed_message(message)
    except ValueError:
        raise RecordRejected(
            RejectReason.MALFORMED, "a sealed record is three lines: prefix, JSON, signature"
        ) from None
    cls = SEALED_TYPES.get((record_type, version))
    if cls is None:
        if record_type in _TYPE_NAMES:
            raise RecordRejected(
                RejectReason.UNSUPPORTED_VERSION, f"{record_type} v{version} is not supported"
            )
        raise RecordRejected(RejectReason.WRONG_RECORD, f"unknown record type {record_type!r}")
    if cls not in expected:
        names = "/".join(c.RECORD_TYPE for c in expected)
        raise RecordRejected(RejectReason.WRONG_RECORD, f"expected {names}, got {cls.RECORD_TYPE}")
    if len(wire) > cls.MAX_WIRE_BYTES:
        raise RecordRejected(
            RejectReason.OVERSIZE, f"{len(wire)} bytes, the {cls.RECORD_TYPE} limit is {cls.MAX_WIRE_BYTES}"
        )
    sig = _TRAILER_RE.fullmatch(trailer)
    if sig is None:
        raise RecordRejected(RejectReason.MALFORMED, "malformed signature line")
    try:
        record = cls.model_validate_json(body, strict=True)
    except ValidationError as exc:
        reason, detail = classify_validation_error(exc)
        raise RecordRejected(reason, detail) from None
    if check_signature and not record.is_canonical(body):
        raise RecordRejected(RejectReason.NON_CANONICAL, "the JSON is not the record's RFC 8785 encoding")
    public_key, signature = bytes.fromhex(sig.group(1).decode()), bytes.fromhex(sig.group(2).decode())
    if not record.signer_allowed(public_key):
        raise RecordRejected(RejectReason.BAD_SIGNATURE, "sealed by a key the record does not name")
    if check_signature and not verify_signature(public_key, message, signature):
        raise RecordRejected(RejectReason.BAD_SIGNATURE, "the signature does not verify")
    return Sealed(record, public_key, signature, message, wire)


_TYPE_ERRORS = re.compile(r".*_type$|^is_instance_of$")


def classify_validation_error(exc: ValidationError) -> tuple[RejectReason, str]:
    """Map a pydantic error to the most specific reason code, and a one-line detail.

    Unknown fields first, then oversize strings and lists, then fields of the wrong JSON type; anything
    else (missing field, value out of range or pattern, not a JSON object, not JSON) is malformed.
    """
    errors = exc.errors(include_url=False, include_input=False)

    def describe(err: dict[str, Any]) -> str:
        where = ".".join(str(part) for part in err["loc"]) or "record"
        return f"{where}: {err['msg']}"

    for reason, matches in (
        (RejectReason.UNKNOWN_FIELD, lambda e: e["type"] == "extra_forbidden"),
        (RejectReason.OVERSIZE, lambda e: e["type"] in {"string_too_long", "too_long"}),
        (RejectReason.WRONG_TYPE, lambda e: bool(e["loc"]) and bool(_TYPE_ERRORS.match(e["type"]))),
    ):
        for err in errors:
            if matches(err):
                return reason, describe(err)
    return RejectReason.MALFORMED, describe(errors[0])


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
