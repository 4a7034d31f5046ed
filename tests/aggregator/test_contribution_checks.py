"""The swarm-level receipt checks, on real signed receipts of a three-member averaging group (named by
the Merkle root over its members' sample counts, each receipt proving its own)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from aggregator.commit_witness import CommitWitness
from aggregator.contribution_checks import SwarmFacts, check_round, lone_inner_step, over_measured_bound
from protocol.averaging_group import averaging_group_id, group_membership
from protocol.identity import Identity
from protocol.proof_attestation import ProofAttestation, group_tag, proofs_digest
from protocol.records import RoundCommit
from protocol.sealing import RejectReason
from tests.protocol.factories import TASK, endorsement_of, group_fields, peer_id_of, sealed_receipt

PEERS = [Identity.generate() for _ in range(3)]
IDS = tuple(sorted(peer_id_of(p) for p in PEERS))
SAMPLES = {IDS[0]: 64, IDS[1]: 96, IDS[2]: 32}
STATE = "ab" * 32


def _group(samples: dict[str, int], peer: str) -> dict:
    """The group fields of ``peer``'s receipt, for a group whose members saw ``samples``."""
    view = group_membership(list(samples.items()), peer)
    return dict(group_id=averaging_group_id("t", 7, view, STATE), **group_fields(view))


def _receipt(identity: Identity, group: dict[str, int] = SAMPLES, **overrides):
    peer = peer_id_of(identity)
    fields = dict(
        round=5,
        samples=SAMPLES[peer],
        state_digest=STATE,
        worker_samples=(SAMPLES[peer],),
        grad_sketch=(12, -7, 3),
        **_group(group, peer),
    )
    fields.update(overrides)
    if "samples" in overrides and "worker_samples" not in overrides:
        fields["worker_samples"] = (fields["samples"],)
    return sealed_receipt(identity, 1, peer_id=peer, **fields)


FACTS = SwarmFacts(
    current_round=5,
    round_window=3,
    throughput={p: 100.0 for p in IDS},
    round_seconds={5: 2.0},
    batch_size=32,
)


def test_an_honest_group_passes():
    assert check_round([_receipt(p) for p in PEERS], FACTS) == {}


def test_a_peer_claiming_more_samples_than_its_group_saw_is_refused_and_only_it():
    liar = PEERS[0]
    peer = peer_id_of(liar)
    honest = [_receipt(p) for p in PEERS[1:]]
    # In the honest group, twice its samples: the group's root does not count that, the proof fails.
    in_honest_group = _receipt(liar, samples=SAMPLES[peer] * 2)
    # With a group of its own that counts them: a group that no other receipt of the round names.
    own_group = _receipt(liar, dict(SAMPLES, **{peer: SAMPLES[peer] * 2}), samples=SAMPLES[peer] * 2)
    for bad, why in (
        (in_honest_group, "does not count it"),
        (own_group, "2 of the round's receipts name another"),
    ):
        refused = check_round([bad, *honest], FACTS)
        assert list(refused) == [bad.wire], refused
        assert refused[bad.wire][0] is RejectReason.GROUP_MISMATCH and why in refused[bad.wire][1]


def test_a_peer_naming_a_group_it_was_not_in_is_refused():
    outsider = Identity.generate()
    me = peer_id_of(outsider)
    extended = group_membership([*SAMPLES.items(), (me, 50)], me)  # the members' counts, and itself
    honest_id = _receipt(PEERS[0]).record.group_id
    forged = [
        # the real group's id with a root that counts the outsider: the id is the one the members
        # name, but the proof is checked against the root it comes with, and that root is not theirs
        dict(group_id=honest_id, **group_fields(extended)),
        # a group of its own that includes the real members: named by nobody else
        dict(group_id=averaging_group_id("t", 7, extended, STATE), **group_fields(extended)),
    ]
    for fields in forged:
        bad = sealed_receipt(
            outsider,
            1,
            round=5,
            samples=50,
            state_digest=STATE,
            worker_samples=(50,),
            grad_sketch=(1, 2),
            **fields,
        )
        refused = check_round([bad] + [_receipt(p) for p in PEERS], FACTS)
        assert list(refused) == [bad.wire] and refused[bad.wire][0] is RejectReason.GROUP_MISMATCH


def test_two_receipts_that_contradict_each_other_are_both_refused():
    a, b = PEERS[:2]
    pair = {peer_id_of(a): SAMPLES[peer_id_of(a)], peer_id_of(b): SAMPLES[peer_id_of(b)]}
    inflated = dict(pair, **{peer_id_of(b): 300})  # plausible at its throughput: only the group can tell
    receipts = [_receipt(a, pair), _receipt(b, inflated, samples=300)]
    refused = check_round(receipts, FACTS)
    assert set(refused) == {r.wire for r in receipts}, "nobody can tell which of the two lies"
    assert {v[0] for v in refused.values()} == {RejectReason.GROUP_MISMATCH}


def test_samples_beyond_the_announced_throughput_are_implausible():
    slow = dict(FACTS.throughput, **{IDS[1]: 1.0})  # announced 1 sample/s: 96 samples in 2 s is too many
    facts = SwarmFacts(5, 3, slow, {5: 2.0}, 32)
    receipts = [_receipt(p) for p in PEERS]
    refused = check_round(receipts, facts)
    victim = next(r for r in receipts if r.record.peer_id == IDS[1])
    assert list(refused) == [victim.wire] and refused[victim.wire][0] is RejectReason.IMPLAUSIBLE


def test_the_time_since_a_peers_previous_receipt_bounds_its_samples():
    # The swarm's round looked like 2 s, but the slow peer's receipts are 40 s apart: it computed for
    # up to 40 s (it started the round before the others, or its last measured rate was depressed),
    # so 96 samples at 1 sample/s (x3 slack) are possible; 200 samples are not.
    slow = dict(FACTS.throughput, **{IDS[1]: 1.0})
    windows = {(IDS[1], 5): 40.0}
    assert check_round([_receipt(p) for p in PEERS], SwarmFacts(5, 3, slow, {5: 2.0}, 32, windows)) == {}
    claimed = dict(SAMPLES, **{IDS[1]: 200})
    slow_peer = next(p for p in PEERS if peer_id_of(p) == IDS[1])
    greedy = _receipt(slow_peer, claimed, samples=200)
    refused = check_round([greedy], SwarmFacts(5, 3, slow, {5: 2.0}, 32, windows))
    assert refused[greedy.wire][0] is RejectReason.IMPLAUSIBLE


@pytest.mark.parametrize("round_index", [1, 7])
def test_rounds_outside_the_window_are_refused(round_index):
    receipts = [_receipt(p, round=round_index) for p in PEERS]
    refused = check_round(receipts, FACTS)
    assert len(refused) == 3 and {v[0] for v in refused.values()} == {RejectReason.ROUND_WINDOW}


def test_missing_or_zero_gradient_statistics_are_refused():
    receipts = [
        _receipt(PEERS[0], grad_sketch=()),
        _receipt(PEERS[1], grad_sketch=(0, 0, 0)),
        _receipt(PEERS[2]),
    ]
    refused = check_round(receipts, FACTS)
    assert {v[0] for v in refused.values()} == {RejectReason.NON_FINITE} and len(refused) == 2


def test_in_an_outer_task_each_cohort_commits_its_own_inner_step_and_a_cohort_that_contradicts_itself_is_refused():
    """sync = "outer": between outer steps two cohorts commit different results for one round. Their
    receipts are all honest; within one cohort, two receipts that disagree are still refused."""
    a, b, c = PEERS
    pair = {peer_id_of(a): SAMPLES[peer_id_of(a)], peer_id_of(b): SAMPLES[peer_id_of(b)]}
    alone = {peer_id_of(c): SAMPLES[peer_id_of(c)]}
    receipts = [_receipt(a, pair, cohort_id="net-a"), _receipt(b, pair, cohort_id="net-a")]
    receipts.append(_receipt(c, alone, cohort_id="net-b"))
    outer = SwarmFacts(5, 3, FACTS.throughput, {5: 2.0}, 32, rounds_by_cohort=True)
    assert check_round(receipts, outer) == {}
    # the same receipts judged as one round of an every-step task: the lone cohort's group loses
    assert list(check_round(receipts, FACTS)) == [receipts[2].wire]
    inflated = dict(pair, **{peer_id_of(b): 300})
    liar = _receipt(b, inflated, samples=300, cohort_id="net-a")
    refused = check_round([receipts[0], liar, receipts[2]], outer)
    assert set(refused) == {receipts[0].wire, liar.wire}, "inside a cohort nobody can tell which lies"
    assert "of the cohort's receipts name another group" in refused[liar.wire][1]


# ------------------------------------------------------------------ bound to the round's commit


def _committed(identity: Identity, group: dict[str, int] = SAMPLES, attempt: int = 9, **overrides):
    """A receipt whose group id hashes its own attempt, contributors and start state, as peers build them."""
    peer = peer_id_of(identity)
    view = group_membership(list(group.items()), peer)
    fields = dict(
        attempt=attempt, group_id=averaging_group_id(TASK, attempt, view, STATE), **group_fields(view)
    )
    return _receipt(identity, group, **(fields | overrides))


def _witnessed_by(reports: dict[tuple[int, str], set[str]]):
    return replace(
        FACTS, task_id=TASK, witnesses=lambda attempt, group: set(reports.get((attempt, group), ()))
    )


def test_a_receipt_needs_another_peer_to_have_committed_its_group():
    receipts = [_committed(p) for p in PEERS]
    group = receipts[0].record.group_id
    everyone = {p.public_key_hex for p in PEERS}
    assert check_round(receipts, _witnessed_by({(9, group): everyone})) == {}
    # only its own report: a self-only group, or a group nobody else holds
    alone = check_round(receipts[:1], _witnessed_by({(9, group): {PEERS[0].public_key_hex}}))
    assert alone[receipts[0].wire][0] is RejectReason.UNWITNESSED
    # reports of another attempt do not count
    elsewhere = check_round(receipts[:1], _witnessed_by({(8, group): everyone}))
    assert elsewhere[receipts[0].wire][0] is RejectReason.UNWITNESSED


def test_a_self_only_group_with_inflated_samples_has_no_witness():
    liar = PEERS[0]
    own = {peer_id_of(liar): 5 * SAMPLES[peer_id_of(liar)]}  # within its announced throughput
    honest = [_committed(p) for p in PEERS]
    cheat = _committed(liar, own, samples=own[peer_id_of(liar)])
    reports = {(9, honest[0].record.group_id): {p.public_key_hex for p in PEERS}}
    reports[9, cheat.record.group_id] = {liar.public_key_hex}  # it may post a commit of its own
    refused = check_round([cheat, *honest[1:]], _witnessed_by(reports))
    assert list(refused) == [cheat.wire] and refused[cheat.wire][0] is RejectReason.UNWITNESSED


def test_a_lone_cohorts_inner_step_stands_on_an_audit_only_in_an_outer_task():
    peer = PEERS[0]
    lone = _committed(peer, {peer_id_of(peer): SAMPLES[peer_id_of(peer)]})
    own = {(9, lone.record.group_id): {peer.public_key_hex}}  # only its own report exists
    outer = replace(_witnessed_by(own), rounds_by_cohort=True)
    assert lone_inner_step(lone.record, outer)
    # without audits to vouch for it, nothing does
    assert check_round([lone], outer)[lone.wire][0] is RejectReason.UNWITNESSED
    # with them, it passes the checks (and the desk audits it with certainty)
    assert check_round([lone], replace(outer, lone_audited=True)) == {}
    # an every-step task has no lone inner steps: a self-only group is refused, audits or not
    every_step = replace(_witnessed_by(own), lone_audited=True)
    assert not lone_inner_step(lone.record, every_step)
    assert check_round([lone], every_step)[lone.wire][0] is RejectReason.UNWITNESSED
    # a group of two in an outer task still needs the other member's report
    pair = _committed(peer)
    alone_in_pair = replace(
        _witnessed_by({(9, pair.record.group_id): {peer.public_key_hex}}), rounds_by_cohort=True
    )
    refused = check_round([pair], replace(alone_in_pair, lone_audited=True))
    assert refused[pair.wire][0] is RejectReason.UNWITNESSED


def test_a_group_id_that_does_not_hash_the_receipts_attempt_or_state_is_refused():
    honest = _committed(PEERS[0])
    reports = {(9, honest.record.group_id): {p.public_key_hex for p in PEERS}}
    # the same witnessed id, claimed for another start state (an audit would replay the wrong one)
    moved = _committed(PEERS[0], state_digest="cd" * 32, group_id=honest.record.group_id)
    refused = check_round([moved], _witnessed_by(reports))
    assert refused[moved.wire][0] is RejectReason.GROUP_MISMATCH


def test_measured_rates_bound_samples_and_announced_ones_do_not():
    receipts = [_committed(p) for p in PEERS]
    group = receipts[0].record.group_id
    facts = replace(_witnessed_by({(9, group): {p.public_key_hex for p in PEERS}}), throughput={})
    # announced nothing, measured nothing yet: no bound (the desk audits such keys instead)
    assert check_round(receipts, replace(facts, measured_rates={})) == {}
    victim = next(r for r in receipts if r.record.peer_id == IDS[1])
    slow = {victim.record.public_key: 1.0}  # a passed audit confirmed 1 sample/s; it claims 96 in 2 s
    refused = check_round(receipts, replace(facts, measured_rates=slow))
    assert list(refused) == [victim.wire] and refused[victim.wire][0] is RejectReason.IMPLAUSIBLE
    assert "measured" in refused[victim.wire][1]


def test_a_claim_above_the_measured_bound_is_audited_where_the_desk_can_audit():
    """A rate measured over one slow round (attempts aborted in it) would refuse every later honest
    claim, and a refused claim is never audited, so the rate is never measured again. Where the desk
    can audit, the claim is accepted for an audit instead (every one of them); the rest are untouched."""
    receipts = [_committed(p) for p in PEERS]
    group = receipts[0].record.group_id
    facts = replace(_witnessed_by({(9, group): {p.public_key_hex for p in PEERS}}), throughput={})
    victim = next(r for r in receipts if r.record.peer_id == IDS[1])
    slow = replace(facts, measured_rates={victim.record.public_key: 1.0}, audit_over_bound=True)
    assert check_round(receipts, slow) == {}
    assert [r.wire for r in receipts if over_measured_bound(r.record, slow)] == [victim.wire]
    fast = replace(slow, measured_rates={victim.record.public_key: 1000.0})
    assert not any(over_measured_bound(r.record, fast) for r in receipts)
    refusing = replace(slow, audit_over_bound=False)  # a desk that cannot audit refuses it, as before
    assert not any(over_measured_bound(r.record, refusing) for r in receipts)
    assert list(check_round(receipts, refusing)) == [victim.wire]


def test_with_commit_reports_the_reports_decide_between_groups_not_the_receipts_filed():
    """One honest receipt against one invented group: by receipts it is a tie (both refused); by the
    peers' signed commit reports the honest group has the quorum and only the invented one goes."""
    honest = _committed(PEERS[0])
    liar = PEERS[1]
    own = {peer_id_of(liar): SAMPLES[peer_id_of(liar)]}
    invented = _committed(liar, own)
    reports = {
        (9, honest.record.group_id): {p.public_key_hex for p in PEERS},
        (9, invented.record.group_id): {liar.public_key_hex, PEERS[2].public_key_hex},  # even with a friend
    }

    def counts(attempt):
        return {group: len(keys) for (a, group), keys in reports.items() if a == attempt}

    facts = replace(_witnessed_by(reports), commit_counts=counts)
    refused = check_round([honest, invented], facts)
    assert list(refused) == [invented.wire] and refused[invented.wire][0] is RejectReason.GROUP_MISMATCH
    assert len(check_round([honest, invented], replace(FACTS, task_id=TASK))) == 2  # receipts alone: a tie


def test_a_peer_two_others_named_an_outlier_earns_nothing_for_that_attempt():
    receipts = [_committed(p) for p in PEERS]
    group = receipts[0].record.group_id
    named = peer_id_of(PEERS[2])
    namers: dict[tuple[int, str], set[str]] = {(9, named): {PEERS[0].public_key_hex}}
    facts = replace(
        _witnessed_by({(9, group): {p.public_key_hex for p in PEERS}}),
        named_outlier=lambda attempt, peer: set(namers.get((attempt, peer), ())),
    )
    assert check_round(receipts, facts) == {}, "one reducer's word is not enough: it may lie"
    namers[9, named].add(PEERS[1].public_key_hex)
    refused = check_round(receipts, facts)
    victim = next(r for r in receipts if r.record.peer_id == named)
    assert list(refused) == [victim.wire] and refused[victim.wire][0] is RejectReason.OUTLIER


def _report(identity: Identity, group: str, proofs: list[str]) -> RoundCommit:
    return RoundCommit(
        task_id=TASK, attempt=9, peer_id=peer_id_of(identity), public_key=identity.public_key_hex,
        endorsement=endorsement_of(identity), ok=True,
        digest="cd" * 32, timestamp=1, group=group, proofs=tuple(proofs),
    )  # fmt: skip


def test_a_reducer_whose_members_posted_two_stories_it_signed_earns_nothing_for_that_attempt():
    receipts = [_committed(p) for p in PEERS]
    group = receipts[0].record.group_id
    liar, liar_id = PEERS[2], peer_id_of(PEERS[2])
    told = [
        ProofAttestation.signed(liar, group_tag(b"g" * 20), liar_id, proofs_digest(story)).to_token()
        for story in (b"told to the first", b"told to the second")
    ]
    forged = ProofAttestation.signed(PEERS[1], group_tag(b"g" * 20), liar_id, proofs_digest(b"made up"))
    witness = CommitWitness(dht=None, task_id=TASK)
    facts = replace(
        _witnessed_by({(9, group): {p.public_key_hex for p in PEERS}}), equivocation=witness.equivocation
    )
    # the same story to both, and a story another member made up in the liar's name: nothing to see
    witness.learn(
        [_report(PEERS[0], group, told[:1]), _report(PEERS[1], group, [told[0], forged.to_token()])]
    )
    assert check_round(receipts, facts) == {}
    witness.learn([_report(PEERS[1], group, told[1:])])  # its latest report: the second story
    refused = check_round(receipts, facts)
    victim = next(r for r in receipts if r.record.peer_id == liar_id)
    assert list(refused) == [victim.wire] and refused[victim.wire][0] is RejectReason.EQUIVOCATED
    assert "different signed proofs" in refused[victim.wire][1]


def test_only_members_witness_a_group():
    """A throw-away key's report of a group (on the board or in a witness bundle) witnesses nothing:
    a receipt needs another *member* to have committed its group."""
    group = "ab" * 32
    members = {PEERS[0].public_key_hex, PEERS[1].public_key_hex}
    witness = CommitWitness(dht=None, task_id=TASK, is_member=lambda key: key in members)
    thrower = Identity.generate()
    witness.learn([_report(PEERS[0], group, []), _report(thrower, group, [])])
    assert witness.witnesses(9, group) == {PEERS[0].public_key_hex}
    assert witness.commit_counts(9) == {group: 1}
