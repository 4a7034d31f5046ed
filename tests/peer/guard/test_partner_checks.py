"""Groups of three confirm what they received before anyone goes on, on a real signed board.

In an all-reduce of three, a reducer that held one member's results back can hide a lie behind that
member's entry, which nobody else checks (:mod:`robust_aggregation.reducer_proof`, point 6). Each member
therefore posts a marker listing the token of the result it checked and goes on only once both
partners list the same token (:func:`peer.commit.quorum.await_partners_checked`). Real hivemind DHT
nodes that validate MANTA's records, real Ed25519 signatures: a marker is not a report (the quorum
never counts it), a partner's failure ends the wait at once, a silent one at the bound, and a state
report keeps the checks and proof attestations of the report it replaces.
"""

from __future__ import annotations

import threading

import pytest

from hivemind_adapter.dht import speaker
from peer.averaging.factory import committer_for
from peer.averaging.stage import AveragingTimeouts
from peer.commit.boards import SignedCommitBoard
from peer.commit.report import CommitReport
from peer.commit.waits import PartnersChecked, await_commit, await_partners_checked
from protocol.averaging_group import stage_check_token
from protocol.identity import Identity
from protocol.proof_attestation import ProofAttestation, group_tag, proofs_digest
from tests.helpers import two_task_dhts, wait_until
from tests.protocol.factories import speaker_of

TASK = "digits-partner-checks"
RESULT = "ab" * 32


@pytest.fixture
def three_boards():
    """Three signed boards: two on DHT nodes of their own, the third (another key and peer id) on the
    first node, as a third peer's would be."""
    with two_task_dhts(TASK) as dhts:
        a, b = (SignedCommitBoard(d, TASK, speaker(d, Identity.generate())) for d in dhts)
        c = SignedCommitBoard(dhts[0], TASK, speaker_of(Identity.generate()))
        yield a, b, c


def _token(boards, attempt: int, result: str = RESULT, stage: str = "cohort") -> str:
    return stage_check_token(TASK, attempt, stage, [x.peer_id for x in boards], result)


def test_a_marker_is_not_a_report_and_the_reports_after_it_keep_its_checks(three_boards):
    a, b, _c = three_boards
    token = _token(three_boards, 5)
    a.post(5, CommitReport(checked=(token,), checking=True))
    assert b.read(5) == {}, "a marker is not a report: nobody counts it toward a quorum or a failure"
    checks = b.read_checks(5)
    assert checks[a.peer_id].checked == (token,) and checks[a.peer_id].checking
    # nor where the swarm last ended an attempt: the marker is posted in the middle of attempt 5
    assert b.latest_attempt() == -1, "a marker moved the attempt counter past the attempt it is in"
    # nor does a marker make a quorum, or end the wait for one, of a roster of two
    assert not await_commit(b, 5, RESULT, {a.peer_id, b.peer_id}, deadline_seconds=0.5).committed

    proof = ProofAttestation.signed(
        Identity.generate(), group_tag(b"g" * 20), "QmReducerThatSignedTheProof", proofs_digest(b"s")
    )
    posted = CommitReport(
        ok=True,
        digest=RESULT,
        group="cd" * 32,
        outliers=(b.peer_id,),
        proofs=(proof.to_token(),),
        checked=(token,),
    )
    a.post(5, posted)
    assert b.read(5)[a.peer_id].ok
    assert not b.read_checks(5)[a.peer_id].checking
    # The state report replaces that report: it must keep all of it, the proofs that a late recheck
    # compares (peer.guard.conviction_watch) and the checks a slow partner may still be reading.
    committer_for(a, AveragingTimeouts()).report_state(5, posted, "ef" * 32)
    wait_until(
        lambda: a.peer_id in b.read(5) and b.read(5)[a.peer_id].state == "ef" * 32, 20, "the state report"
    )
    report = b.read(5)[a.peer_id]
    assert report.proofs == (proof.to_token(),) and report.group == "cd" * 32
    assert b.read_checks(5)[a.peer_id].checked == (token,)


def test_a_group_of_three_goes_on_once_both_partners_confirm_the_same_result(three_boards):
    a, b, c = three_boards
    token = _token(three_boards, 6)
    a.post(6, CommitReport(checked=(token,), checking=True))
    b.post(6, CommitReport(checked=("77" * 32,), checking=True))  # an earlier stage's check: not this one
    found: list[PartnersChecked] = []
    waiter = threading.Thread(
        target=lambda: found.append(await_partners_checked(a, 6, token, [b.peer_id, c.peer_id], 60.0))
    )
    waiter.start()
    waiter.join(1.0)
    assert waiter.is_alive(), "went on before either partner confirmed"
    b.post(6, CommitReport(checked=("77" * 32, token), checking=True))
    c.post(
        6, CommitReport(ok=True, digest=RESULT, checked=(token,))
    )  # already past its wait: its report lists the check
    waiter.join(30.0)
    assert [f.confirmed for f in found] == [True]


def test_a_partner_that_reports_the_attempt_unconfirmed_ends_the_wait_at_once(three_boards):
    """The held-back member found its own entry misstated and posted a failure: the member left with
    the lie goes no further, without waiting out its bound (60 s here)."""
    a, b, c = three_boards
    token = _token(three_boards, 7)
    a.post(7, CommitReport(checked=(token,), checking=True))
    b.post(7, CommitReport(checked=(token,), checking=True))
    c.post(7, CommitReport())
    why = await_partners_checked(a, 7, token, [b.peer_id, c.peer_id], 60.0).reason
    assert why is not None and "reported the attempt without confirming" in why and c.peer_id[-8:] in why


def test_a_partner_that_confirms_another_result_or_none_is_waited_out(three_boards):
    a, b, c = three_boards
    token = _token(three_boards, 8)
    a.post(8, CommitReport(checked=(token,), checking=True))
    b.post(8, CommitReport(checked=(_token(three_boards, 8, result="cd" * 32),), checking=True))
    why = await_partners_checked(a, 8, token, [b.peer_id, c.peer_id], 1.0).reason
    assert why is not None and "did not confirm this group's result within 1 s" in why
    assert b.peer_id[-8:] in why and c.peer_id[-8:] in why


def test_a_partner_gone_from_the_roster_ends_the_wait(three_boards):
    a, b, c = three_boards
    token = _token(three_boards, 9)
    a.post(9, CommitReport(checked=(token,), checking=True))
    b.post(9, CommitReport(checked=(token,), checking=True))
    why = await_partners_checked(a, 9, token, [b.peer_id, c.peer_id], 60.0, never=lambda: {c.peer_id}).reason
    assert why is not None and "left the roster" in why and c.peer_id[-8:] in why


def test_a_reducer_that_sent_two_results_is_shown_by_the_markers_proofs_at_once(three_boards):
    """A reducer that sent members different results gives them different tokens: their markers never
    agree. The proof attestations they carry show why at once (two different digests the reducer
    signed for one all-reduce), without waiting out the bound, and name the reducer."""
    a, b, c = three_boards
    reducer, group = Identity.generate(), group_tag(b"g" * 20)

    def told(story: bytes) -> str:
        return ProofAttestation.signed(reducer, group, c.peer_id, proofs_digest(story)).to_token()

    a.post(
        10,
        CommitReport(
            proofs=(told(b"the result sent to a"),), checked=(_token(three_boards, 10),), checking=True
        ),
    )
    other = _token(three_boards, 10, result="cd" * 32)
    b.post(10, CommitReport(proofs=(told(b"the result sent to b"),), checked=(other,), checking=True))
    keys = {c.peer_id: reducer.public_key_hex}
    checked = await_partners_checked(
        a, 10, _token(three_boards, 10), [b.peer_id, c.peer_id], 60.0, public_keys=keys
    )
    assert not checked.confirmed and checked.equivocation is not None
    assert checked.equivocation.reducer == c.peer_id and "different signed proofs" in checked.reason
    # without the reducer's key its signatures prove nothing: waited out as any disagreement
    unkeyed = await_partners_checked(
        a, 10, _token(three_boards, 10), [b.peer_id, c.peer_id], 1.0, public_keys={}
    )
    assert not unkeyed.confirmed and unkeyed.equivocation is None and "within 1 s" in unkeyed.reason


def test_a_partner_that_refused_a_member_s_averages_ends_the_wait_at_once(three_boards):
    """The held-back member refuses the liar's averages when its results finally come, and looks for
    a group again (seconds) before it reports. Its marker says whom it refused as soon as its
    all-reduce broke: the member left stops waiting for a confirmation that will never come."""
    a, b, c = three_boards
    token = _token(three_boards, 11)
    a.post(11, CommitReport(checked=(token,), checking=True))
    b.post(11, CommitReport(checked=(token,), checking=True))
    c.post(11, CommitReport(checking=True, refused=(b.peer_id,)))
    checked = await_partners_checked(a, 11, token, [b.peer_id, c.peer_id], 60.0)
    assert (
        not checked.confirmed
        and checked.reason == f"{c.peer_id[-8:]} refused the averages of {b.peer_id[-8:]}"
    )
    # a refusal of a peer outside the group says nothing about it
    c.post(
        12,
        CommitReport(checked=(_token(three_boards, 12),), checking=True, refused=("QmAnotherPeerFarAway",)),
    )
    b.post(12, CommitReport(ok=True, digest=RESULT, checked=(_token(three_boards, 12),)))
    assert await_partners_checked(a, 12, _token(three_boards, 12), [b.peer_id, c.peer_id], 30.0).confirmed
