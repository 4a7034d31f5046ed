"""The aggregator's desk reading a real DHT: which round it takes the swarm to be in, from peers'
signed progress records (a liar's far-off round, alone on the board, must not push every honest
receipt out of the window: the red team's rogue-progress peer once made it refuse a whole round's
receipts), and which keys peers convicted of equivocation."""

from __future__ import annotations

from aggregator.admission import AdmissionDesk
from aggregator.checkpoints import CheckpointKeeper
from aggregator.contributions import ContributionDesk
from aggregator.membership_policy import MembershipPolicy
from hivemind_adapter.dht import store
from hivemind_adapter.p2p import Endpoint
from peer.swarm_view import ProgressBoard
from protocol.dht_schema import conviction_subkey, convictions_key
from protocol.identity import Identity
from protocol.membership import AdmissionRequest
from protocol.proof_attestation import ProofAttestation, group_tag, proofs_digest
from protocol.records import ContributionReceipt, ReducerConviction, Revocation, RoundCommit
from protocol.sealing import parse_sealed, seal
from supernet.workload import workload_for
from tests.helpers import two_task_dhts, wait_until
from tests.protocol.factories import (
    TASK,
    binding_wire,
    endorsement_of,
    now_ms,
    peer_id_of,
    sealed_receipt,
    speaker_of,
    task_spec,
)

SMALL = dict(seed=0, batch_size=32, num_subnets=2, width_mult=0.25, head_channels=64, total_steps=4)


def test_a_lone_far_off_progress_record_sets_the_round_only_in_a_swarm_of_two(tmp_path):
    aggregator = Identity.generate()
    with two_task_dhts(TASK) as (first, second):
        desk = ContributionDesk(
            first, Endpoint(first, "desk"), aggregator, task_spec(aggregator), tmp_path / "l.sqlite"
        )
        try:
            liar = ProgressBoard(second, TASK, speaker_of(Identity.generate()))
            assert liar.publish(10**9, 64, 1.0, 1.0, "cohort-a", 10**9 - 1)
            wait_until(lambda: desk._board_round(announced=2) == 10**9, 15, "the desk to read the record")
            assert desk._board_round(announced=6) == -1  # the roster holds others: one record is one word
            assert desk._board_round(announced=0) == -1  # the roster read failed: no word stands alone
            honest = ProgressBoard(second, TASK, speaker_of(Identity.generate()))
            assert honest.publish(5, 64, 1.0, 1.0, "cohort-a", 4)
            wait_until(lambda: desk._swarm_round(announced=6) == 5, 15, "the desk to read both records")
        finally:
            desk.shutdown()


def test_a_posted_conviction_excludes_the_reducer_key_and_revokes_its_credit_for_good(tmp_path):
    # Evidence a peer posted (a reducer's two signed stories, protocol.records.ReducerConviction):
    # the desk excludes the key as after a failed audit, revokes every credit it holds, and still
    # excludes it after a restart, from the ledger alone.
    aggregator, reducer, poster = Identity.generate(), Identity.generate(), Identity.generate()
    reducer_id = peer_id_of(reducer)
    story = lambda told: ProofAttestation.signed(  # noqa: E731
        reducer, group_tag(b"g" * 20), reducer_id, proofs_digest(told)
    ).to_token()
    conviction = ReducerConviction(
        task_id=TASK, public_key=poster.public_key_hex, reducer_key=reducer.public_key_hex,
        first=story(b"told to one"), second=story(b"told to another"), timestamp=now_ms(),
    )  # fmt: skip
    ledger = tmp_path / "l.sqlite"
    with two_task_dhts(TASK) as (first, second):
        desk = ContributionDesk(first, Endpoint(first, "desk"), aggregator, task_spec(aggregator), ledger)
        try:
            credited = [sealed_receipt(reducer, seq) for seq in (1, 2)] + [sealed_receipt(poster, 1)]
            desk._ledger.run(lambda store: store.append_batch(credited, aggregator))
            subkey = conviction_subkey(reducer.public_key_hex, poster.public_key_hex)
            assert store(second, convictions_key(TASK), seal(conviction, poster), ttl=600, subkey=subkey)
            desk.close_due_rounds(force=True)
            assert desk.trust.excluded() == {reducer.public_key_hex}
            revocations = [
                parse_sealed(data, (ContributionReceipt, Revocation)).record
                for _, data in desk._ledger.run(lambda store: list(store.entries(3)))
            ]
            assert sorted(r.entry_index for r in revocations) == [0, 1]  # the poster's credit stands
            assert all(r.reason.startswith("equivocated") for r in revocations)
            desk.close_due_rounds(force=True)  # read again: convicted once
            assert desk.counters["convicted"] == 1
        finally:
            desk.shutdown()
    with two_task_dhts(TASK) as (first, _):
        again = ContributionDesk(first, Endpoint(first, "desk"), aggregator, task_spec(aggregator), ledger)
        try:
            assert again.trust.excluded() == {reducer.public_key_hex}
        finally:
            again.shutdown()


def test_a_state_two_committers_report_after_a_witnessed_group_is_one_a_checkpoint_may_take(tmp_path):
    # A swarm split in two stayed split for good: one side committed round r with a bare majority of
    # the roster it had read, the other could not load that state (no majority of the whole roster
    # held it), and no anchor came until a receipt of round r + 1. Now the state two committers of a
    # witnessed group report holding is one the keeper may checkpoint and anchor; one peer's word is
    # not enough.
    aggregator = Identity.generate()
    committers = [Identity.generate() for _ in range(3)]
    spec = task_spec(aggregator)
    with two_task_dhts(TASK) as (first, _):
        endpoint = Endpoint(first, "desk")
        keeper = CheckpointKeeper(first, endpoint, TASK, workload_for("digits", SMALL), tmp_path / "ckpt")
        desk = ContributionDesk(first, endpoint, aggregator, spec, tmp_path / "l.sqlite", states=keeper)
        try:
            initial = keeper.newest_known()
            group, after = "ab" * 32, "cd" * 32
            receipt = sealed_receipt(committers[0], 3, attempt=7, group_id=group).record

            def report(identity: Identity, state: str, at_group: str = group) -> RoundCommit:
                return RoundCommit(
                    task_id=TASK, attempt=7, peer_id=peer_id_of(identity), public_key=identity.public_key_hex,
                    endorsement=endorsement_of(identity), ok=True, digest="ef" * 32, timestamp=now_ms(), state=state, group=at_group,
                )  # fmt: skip

            # one committer's word, and a state reported after another group: not taken
            desk.witness.learn([report(committers[0], after), report(committers[1], "12" * 32, "99" * 32)])
            desk._learn_state_after(receipt)
            assert keeper.newest_known() == initial
            desk.witness.learn([report(committers[1], after)])
            desk._learn_state_after(receipt)
            digest, known = keeper.newest_known()
            assert digest == after and known.round == 3
            assert set(known.holders) == {peer_id_of(c) for c in committers[:2]}
        finally:
            desk.shutdown()
            keeper.shutdown()


def test_throw_away_keys_corroborate_no_round_for_a_desk_that_admits(tmp_path):
    """Two progress records of keys nobody admitted, both at round 10^12, made the desk refuse every
    honest receipt as too old. With admission, only members' records count."""
    aggregator = Identity.generate()
    with two_task_dhts(TASK) as (first, second):
        admission = AdmissionDesk(aggregator, TASK, MembershipPolicy(), tmp_path / "members.jsonl")
        desk = ContributionDesk(
            first, Endpoint(first, "desk"), aggregator, task_spec(aggregator), tmp_path / "l.sqlite",
            admission=admission,
        )  # fmt: skip
        trusting = ContributionDesk(  # a desk that counts every key, as before
            second, Endpoint(second, "trusting"), aggregator, task_spec(aggregator), tmp_path / "t.sqlite"
        )
        try:
            for _ in range(2):
                thrower = ProgressBoard(second, TASK, speaker_of(Identity.generate()))
                assert thrower.publish(10**12, 64, 1.0, 1.0, "cohort-a", 10**12 - 1)
            wait_until(lambda: trusting._board_round(announced=6) == 10**12, 15, "the throw-away records")
            assert desk._board_round(announced=6) == -1
            for _ in range(2):
                member = Identity.generate()
                request = AdmissionRequest(binding_wire(member)).to_bytes()
                assert admission.answer(request, peer_id_of(member), None)["status"] == "admitted"
                assert ProgressBoard(second, TASK, speaker_of(member)).publish(5, 64, 1.0, 1.0, "cohort-a", 4)
            wait_until(lambda: desk._board_round(announced=6) == 5, 15, "the members' records")
        finally:
            desk.shutdown()
            trusting.shutdown()


def test_members_claiming_a_far_off_round_move_the_desks_window_only_by_its_lead(tmp_path):
    """Two admitted keys can corroborate round 10^12 on the board; the desk goes by it only up to
    ``pace.lead`` rounds past the newest round it accepted a receipt of (read from its ledger on
    start), so no honest receipt of a round it has seen falls out of the window."""
    aggregator, peer = Identity.generate(), Identity.generate()
    ledger = tmp_path / "l.sqlite"
    with two_task_dhts(TASK) as (first, second):
        admission = AdmissionDesk(aggregator, TASK, MembershipPolicy(), tmp_path / "members.jsonl")
        desk = ContributionDesk(first, Endpoint(first, "desk"), aggregator, task_spec(aggregator), ledger)
        desk._ledger.run(lambda store: store.append_batch([sealed_receipt(peer, 1, round=30)], aggregator))
        desk.shutdown()
        desk = ContributionDesk(
            first, Endpoint(first, "desk2"), aggregator, task_spec(aggregator), ledger, admission=admission,
            round_window=20,
        )  # fmt: skip
        try:
            for _ in range(2):
                member = Identity.generate()
                request = AdmissionRequest(binding_wire(member)).to_bytes()
                assert admission.answer(request, peer_id_of(member), None)["status"] == "admitted"
                board = ProgressBoard(second, TASK, speaker_of(member))
                assert board.publish(10**12, 64, 1.0, 1.0, "cohort-a", 10**12 - 1)
            wait_until(lambda: desk._board_round(announced=6) == 10**12, 15, "the members' records")
            assert desk.pace.lead == 10 and desk._swarm_round(announced=6) == 30 + 10
            desk.pace.accepted(35)  # as closing a round with an accepted receipt of round 35 does
            assert desk._swarm_round(announced=6) == 45
        finally:
            desk.shutdown()
