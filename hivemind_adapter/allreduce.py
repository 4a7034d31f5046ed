"""hivemind all-reduce that leaves every group member with bit-identical results, or none.

hivemind's butterfly all-reduce returns to each sender the *delta* ``average - own_part`` and the
sender adds it to its own tensor. In floating point ``x + (avg - x)`` is not ``avg`` (a gradient
element near zero next to a large local value rounds away), so members of one group end a step with
tensors that differ in their last bits, and peers that must apply the same optimizer step drift
apart. A member whose reducer died also keeps its *own* values for that shard and still reports
success.

:class:`~hivemind_adapter.exact_runner.ExactAllReduceRunner` changes one thing in the protocol:
reducers send back the averaged part itself. Every member then receives the same bytes for every
shard, so results agree bit for bit.
:class:`VerifiedAverager` collects the results aside and writes them into the averaged tensors only
when the all-reduce was complete from its point of view (no failed reducer, every sender's parts
received); otherwise the step raises :class:`PartialAllReduceError` and the tensors are untouched.
Failures seen only by *another* member are caught one level up (:mod:`peer.averaging.hierarchy`),
which compares what members report after the step. Reducers leave a part holding a NaN or an
infinity out of their mean and name its sender (:mod:`hivemind_adapter.finite_reduce`); a result
that is still not finite is never written (:class:`NonFiniteResultError`). With a
:class:`~robust_aggregation.centered_clip.RobustConfig`, reducers take a robust centre of the senders'
parts (CenteredClip, as BTARD does) and report whom they named (:meth:`VerifiedAverager.last_outliers`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

import torch
from hivemind.averaging import DecentralizedAverager
from hivemind.averaging.allreduce import AllreduceException, AveragingMode
from hivemind.averaging.control import AveragingStage, StepControl
from hivemind.averaging.group_info import GroupInfo
from hivemind.averaging.matchmaking import MatchmakingException
from hivemind.utils import MPFuture, get_dht_time
from hivemind.utils.asyncio import as_aiter, azip

from hivemind_adapter.averager_process import BoundedAveragerProcess
from hivemind_adapter.exact_runner import ExactAllReduceRunner
from hivemind_adapter.findings import NameLog, NoiseSlot, WireBytes
from hivemind_adapter.finite_reduce import all_finite
from hivemind_adapter.follower_expiry import followers_ask_until_their_search_ends
from hivemind_adapter.group_keys import Admission, DeclarationSigner, SignedGroupKeys, admit_only_roster_peers
from hivemind_adapter.group_quorum import QuorumGate
from hivemind_adapter.in_thread import InThreadAverager
from hivemind_adapter.known_groups import KnownGroupSteps
from hivemind_adapter.leader_refusals import reask_peers_that_were_following
from hivemind_adapter.p2p_sockets import RemovesItsSocket
from hivemind_adapter.stall_report import report_if_stalled
from protocol.proof_attestation import ProofAttestation, parse_tokens
from robust_aggregation.alignment import AlignmentRecord
from robust_aggregation.centered_clip import RobustConfig
from robust_aggregation.reducer_proof import NoiseMap


class PartialAllReduceError(AllreduceException):
    """Part of the vector was not averaged over the whole group; nothing was written."""


class NonFiniteResultError(PartialAllReduceError):
    """The averaged result holds a NaN or an infinity (a sender sent one): nothing was written."""


class AllReduceBroke(MatchmakingException):
    """A step's group formed and its all-reduce failed (partial, a member silent, a reducer gone):
    nothing was written, so the step may be taken again with the same tensors. hivemind reports every
    such failure as a MatchmakingException, like a group that never formed; this subclass tells them
    apart (and hivemind's step still handles it as one)."""


# hivemind's matchmaking re-reads its group key as soon as the last read found no better leader:
# unpaced, one lookup follows another while a peer waits. A pair's partners declare themselves
# within milliseconds of each other, so their reads start this soon and double up to the spacing.
GROUP_KEY_FIRST_REREAD = 0.02
GROUP_KEY_READ_SPACING = 0.5


class GroupKeyReadPace:
    """When a group key may be read next: at once for a key not read before; then, for a pair,
    :data:`GROUP_KEY_FIRST_REREAD` s after that read and each gap twice the last, at most
    :data:`GROUP_KEY_READ_SPACING` s; for a larger group that spacing from the first read (read
    fast too, 32 thin peers committed 54 % of rounds, not 85 %: benchmarks/RESULTS.md). Times are
    an event loop's clock."""

    def __init__(self) -> None:
        self.key, self.last, self.gap = None, float("-inf"), 0.0

    def wait_before(self, key: object, now: float, pair: bool = True) -> float:
        """Seconds to wait before reading ``key`` at ``now`` (``pair``: the group sought is of two);
        the read is then counted as made."""
        if key != self.key:
            self.key, self.gap = key, 0.0
        elif not pair:
            self.gap = GROUP_KEY_READ_SPACING
        elif self.gap == 0.0:
            self.gap = GROUP_KEY_FIRST_REREAD
        else:
            self.gap = min(GROUP_KEY_READ_SPACING, 2.0 * self.gap)
        wait = max(0.0, self.last + self.gap - now)
        self.last = now + wait
        return wait


def _spaced_reads(key_manager, group_size: Callable[[], int | None]) -> None:
    """Let ``key_manager`` look each group key up at the pace of a :class:`GroupKeyReadPace`;
    ``group_size``: the target size of the group sought now."""
    read = key_manager.get_averagers
    pace = GroupKeyReadPace()

    async def get_averagers(group_key, only_active: bool):
        wait = pace.wait_before(group_key, asyncio.get_running_loop().time(), pair=group_size() == 2)
        if wait > 0:
            await asyncio.sleep(wait)
        return await read(group_key, only_active)

    key_manager.get_averagers = get_averagers


@dataclass(frozen=True)
class RefusedReducer:
    """A reducer whose replies a member refused (base58 ``peer``). ``for_its_own_part``: only its
    own part's place was implausible (:class:`~robust_aggregation.reducer_proof.OwnPartDoubt`), which
    an honest cohort head carrying its cohort's bent result shows too; every other refusal says the
    reducer misreported what it did."""

    peer: str
    for_its_own_part: bool


# Base58 has no space: a refused reducer's id followed by this, in the shared list, was refused
# only for its own part.
_OWN_PART_MARK = " own-part"


class VerifiedAverager(
    InThreadAverager, BoundedAveragerProcess, RemovesItsSocket, KnownGroupSteps, DecentralizedAverager
):
    """A DecentralizedAverager whose steps are exact (bit-identical across members) and all-or-nothing
    locally: on any partial failure the step raises and the averaged tensors keep their old values.

    Use it like the base class; ``step()`` returns the gathered metadata of every group member, and
    :meth:`~hivemind_adapter.known_groups.KnownGroupSteps.step_in_known_group` averages with members
    known in advance, without matchmaking. With ``robust``, its reducer withstands a minority of
    malicious senders; :meth:`last_outliers` names those it caught. Its last ``slotted_tail``
    tensors hold one slot per sender (a cohort's roll of sample counts): every reducer takes each
    slot's owner's value there (:func:`~robust_aggregation.centered_clip.slotted_centre`), whatever
    the senders' weights, where a robust centre would clip them. With ``declarations``, its
    matchmaking declares signed and meets only the peers :meth:`set_admitted` names
    (:mod:`hivemind_adapter.group_keys`); without, hivemind's unsigned declarations, which MANTA's
    DHT validator refuses (for tests on a DHT without it).
    """

    runner_type: type[ExactAllReduceRunner] = ExactAllReduceRunner  # what runs each all-reduce

    def __init__(
        self,
        *args,
        robust: RobustConfig | None = None,
        declarations: DeclarationSigner | None = None,
        slotted_tail: int = 0,
        **kwargs,
    ):
        # Written by the all-reduces on the averager's loop, read by its owner (hivemind_adapter.findings).
        self._wire_bytes = WireBytes()  # tensor payload bytes of its all-reduces with other peers
        self._last_outliers = NameLog()  # what the last all-reduce's reducer named
        self._named_since = NameLog()  # what all-reduces named since take_named() last read it
        # reducers whose replies were refused, since take_refused() (those refused only for their own
        # part's place carry _OWN_PART_MARK after their id)
        self._refused_since = NameLog()
        # the reducers' signed proof digests this averager's all-reduces accepted, since take_attestations()
        self._attested_since = NameLog(1024)
        self._robust = robust  # read by every runner the averager builds
        # the last tensors that hold one slot per sender (a robust reducer reduces them as such)
        self._slotted_tail = slotted_tail
        self._whole_parts = True  # its reducer answers only with parts of every sender (set_whole_parts)
        # how each sender's parts pointed, across this averager's all-reduces: kept (and only ever
        # read) on the averager's loop, where its reducers run
        self._alignment = AlignmentRecord() if robust is not None else None
        # how each reducer's replies pointed against this averager's parts (its members' check of reducers)
        self._reply_alignment = AlignmentRecord() if robust is not None else None
        self._declarations = declarations  # read on the averager's loop, where matchmaking runs
        # sampling noise along the vector (robust_aggregation.reducer_proof.NoiseMap): what this
        # averager's all-reduces last measured, and what it holds a pair's reducer to (set by its owner)
        self._noise_measured = NoiseSlot()
        self._noise_reference = NoiseSlot()
        self._admission = Admission()  # set through requests, so that it changes on the averager's loop
        super().__init__(*args, **kwargs)

    def last_outliers(self) -> list[str]:
        """Base58 ids of the peers whose values this averager refused or named in its last all-reduce
        (its last step, whether it succeeded or not): the senders its reducer refused (non-finite)
        or named outliers, in sender order, then the reducers whose replies it refused as
        implausible (without ``robust``: the senders of NaN or infinite values only). The next
        all-reduce, a known group's confirmation included, replaces it: :meth:`take_named` collects
        them over several."""
        return self._last_outliers.read()

    def take_named(self) -> list[str]:
        """What :meth:`last_outliers` held after each all-reduce since the last call, together."""
        return self._named_since.take()

    def take_refused(self) -> list[RefusedReducer]:
        """The reducers whose replies this averager refused as implausible (a reducer decides its
        part's result for everyone: :mod:`robust_aggregation.reply_check`) since the last call."""
        refused: dict[str, bool] = {}
        for name in self._refused_since.take():
            peer, mark, _ = name.partition(_OWN_PART_MARK)
            refused[peer] = refused.get(peer, True) and bool(mark)  # any other refusal outweighs
        return [RefusedReducer(peer, own_part) for peer, own_part in refused.items()]

    def take_attestations(self) -> list[ProofAttestation]:
        """The reducers' signed digests of the proofs messages this averager's all-reduces accepted
        since the last call (robust only): what its owner posts, so that a reducer that sent members
        different proofs is caught by its own signatures (:mod:`protocol.proof_attestation`)."""
        return parse_tokens(self._attested_since.take())

    def take_measured_noise(self) -> NoiseMap | None:
        """The sampling noise along the vector that this averager's last all-reduce that measured any
        (since the last call) showed, or None; forgotten once taken."""
        return self._noise_measured.take()

    def set_noise_reference(self, noise: NoiseMap | None) -> None:
        """Hold a reducer that has only one other part beside its own (a pair) to ``noise``, measured
        elsewhere (:meth:`take_measured_noise` of another stage), in the next all-reduces; None: do not."""
        self._noise_reference.write(noise)

    def wire_bytes(self) -> tuple[int, int]:
        """Tensor payload bytes this averager's all-reduces sent and received so far."""
        return self._wire_bytes.totals()

    # hivemind builds its matchmaking on the averager's loop; this is where MANTA's signed
    # declarations, its roster admission, its spacing of group-key reads, its followers' join
    # expirations and its second asks of peers that were following are put in.
    @property
    def _matchmaking(self):
        try:
            return self.__dict__["_manta_matchmaking"]
        except KeyError:
            raise AttributeError("_matchmaking") from None

    @_matchmaking.setter
    def _matchmaking(self, matchmaking) -> None:
        if self._declarations is not None:
            matchmaking.group_key_manager = SignedGroupKeys(
                matchmaking.group_key_manager, self._declarations, self._admission
            )
            admit_only_roster_peers(matchmaking, self._admission)
        _spaced_reads(matchmaking.group_key_manager, lambda: matchmaking.target_group_size)
        followers_ask_until_their_search_ends(matchmaking)
        reask_peers_that_were_following(matchmaking)
        self.__dict__["_manta_matchmaking"] = matchmaking

    def set_target_group_size(self, size: int | None, wait: bool = True):
        """Form groups as soon as ``size`` members joined (cohorts grow and shrink between rounds)."""
        if wait:
            return self.ask("_set_target_group_size", size=size)
        future = MPFuture()
        self._outer_pipe.send(("_set_target_group_size", [], dict(size=size, future=future)))
        return future

    async def _set_target_group_size(self, size: int | None, future: MPFuture):
        try:
            self._matchmaking.target_group_size = size
            self._matchmaking.potential_leaders.target_group_size = size
            future.set_result(None)
        except BaseException as e:
            if not future.done():
                future.set_exception(e)

    def set_min_group_size(self, size: int, quorum_of: Collection[str] = ()) -> None:
        """Let a leader start the all-reduce of the next steps only with at least ``size`` members
        and, with ``quorum_of``, only once the peers its members' gathered metadata lists are more
        than half of those (:class:`~hivemind_adapter.group_quorum.QuorumGate`): when its wait ends
        short of either, it releases them and all go on looking (hivemind's rule)."""
        self.ask("_set_min_group_size", size=int(size), quorum_of=tuple(quorum_of))

    async def _set_min_group_size(self, size: int, quorum_of: tuple[str, ...], future: MPFuture):
        matchmaking = self._matchmaking
        matchmaking.min_group_size = QuorumGate(matchmaking, size, quorum_of) if quorum_of else size
        future.set_result(None)

    def set_whole_parts(self, whole: bool) -> None:
        """Whether this averager's reducer answers, in the next steps, only with parts every sender
        sent (the default: a member handed a part without a sender that dropped out would take a
        partial all-reduce for a whole one). False for a broadcast's head: its receivers send nothing
        that counts, and each checks what it got against the digest the head announced."""
        self.ask("_set_whole_parts", whole=bool(whole))

    async def _set_whole_parts(self, whole: bool, future: MPFuture):
        self._whole_parts = whole
        future.set_result(None)

    def set_admitted(self, peers: dict[str, str] | None) -> None:
        """Meet only ``peers`` (peer id -> MANTA public key hex, the roster as read recently) in
        matchmaking from now on, a step under way included; None: anyone. Only with ``declarations``."""
        self.ask("_set_admitted", peers=None if peers is None else dict(peers))

    async def _set_admitted(self, peers: dict[str, str] | None, future: MPFuture):
        self._admission.peers = peers
        future.set_result(None)

    def admission_refusals(self) -> dict[str, int]:
        """What this averager's matchmaking refused so far (declarations and join requests), by reason."""
        return self.ask("_admission_refusals")

    async def _admission_refusals(self, future: MPFuture):
        future.set_result(dict(self._admission.refused))

    def set_allreduce_timeout(self, seconds: float) -> None:
        """Bound the all-reduce of the next steps (from the moment their group formed) to ``seconds``:
        how long one may run depends on the stage and on what recent rounds took."""
        self.ask("_set_allreduce_timeout", seconds=float(seconds))

    async def _set_allreduce_timeout(self, seconds: float, future: MPFuture):
        self._allreduce_timeout = seconds  # read by hivemind's step, on the averager's loop
        future.set_result(None)

    def set_follow_only(self, follow: bool) -> None:
        """Take the next steps as a follower only (or, with ``False``, as this averager was built):
        it never leads a group nor accepts members, and reduces no part. A group then cannot form
        without a peer that may lead: what a broadcast needs, whose receivers must not meet among
        themselves while the sender is still busy (hivemind forms any group of ``min_group_size``
        once the matchmaking time has passed)."""
        client = follow or self.client_mode
        self.mode = AveragingMode.CLIENT if client else AveragingMode.NODE  # what this step gathers
        self.ask("_set_follow_only", client=client)

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
            reply_alignment=self._reply_alignment,
            # a step over the last tensors only (a known group's confirmation) holds the same tail
            slotted_tensors=min(self._slotted_tail, len(tensors)),
            whole_parts=self._whole_parts,
            signer=None if self._declarations is None else self._declarations.identity,
            public_keys=self._admission.peers,
            **kwargs,
        )
        runner.wire_bytes = self._wire_bytes
        runner.noise_reference = self._noise_reference.read()
        assert group_id in self._running_groups, "all-reduce group was not registered"
        self._running_groups[group_id].set_result(runner)
        self._last_outliers.write([])
        # a step alive past twice its reducers' silence bound is stuck somewhere: say where, once
        watch = asyncio.create_task(
            report_if_stalled(
                f"all-reduce in group {group_id.hex()[:12]}",
                2.0 * (runner.reducer_timeout or 30.0),
                progress=runner.progress_lines,
            )
        )
        try:
            if runner.modes[group_info.peer_ids.index(self.peer_id)] == AveragingMode.AUX:
                async for _ in runner:
                    raise ValueError("auxiliary peers receive no averaged tensors")
                return
            results = []
            async for _tensor, averaged in azip(as_aiter(*tensors), runner):
                results.append(averaged)
        finally:  # what this member's reducer named, whether the step succeeded or not
            watch.cancel()
            runner.note_alignments()
            runner.note_reply_alignments()
            named = runner.outlier_senders()
            self._last_outliers.write(named)
            self._named_since.add(named)
            self._refused_since.add(
                [
                    p.to_base58() + (_OWN_PART_MARK if p in runner.refused_for_own_part else "")
                    for p in runner.refused_reducers
                ]
            )
            runner.seal_own_proofs()
            self._attested_since.add([a.to_token() for a in runner.attestations])
            if (noise := runner.measured_noise()) is not None:
                self._noise_measured.write(noise)
        reason = runner.incomplete_reason()
        if reason is not None or len(results) != len(tensors):
            raise PartialAllReduceError(f"all-reduce in group {group_id.hex()[:12]} was partial: {reason}")
        if not all_finite(results):
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


def cancel_step(control: StepControl) -> None:
    """Cancel a step started with ``wait=False`` so that its averager process, once told, finds it
    cancelled. hivemind's :meth:`StepControl.cancel` tells the process before it marks the step, and
    a process that looked in between went on matchmaking and joined the next stage's group."""
    if control._trigger is not None:
        control._trigger.cancel()
    MPFuture.cancel(control)  # marked first: the process reads the mark when the signal below wakes it
    if control._cancel is not None:
        control._cancel.set_result(None)


def member_ids(gathered: dict) -> dict[str, object]:
    """A finished step's gathered metadata keyed by base58 peer id."""
    return {str(k.to_base58() if hasattr(k, "to_base58") else k): v for k, v in gathered.items()}
