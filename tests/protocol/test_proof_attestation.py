"""Reducers' signed proof digests: tokens that round-trip, signatures bound to group, reducer and
digest, two differing signed digests as evidence, and no way for a poster to frame a reducer."""

from __future__ import annotations

import hashlib

import pytest

from protocol.identity import Identity
from protocol.proof_attestation import (
    ProofAttestation,
    find_equivocation,
    group_tag,
    parse_tokens,
    proofs_digest,
    proofs_fingerprint,
)
from protocol.records import MAX_PROOFS_POSTED, RoundCommit
from protocol.sealing import open_sealed, seal
from tests.protocol.factories import endorsement_of, peer_id_of

REDUCER = "12D3KooWBHU6bw3kn3aGjatsvVf55QSkVefHXhp6DuXoGWLDSaer"
OTHER = "12D3KooWRTLci3gENP6SXh2GWpcFy1SNRwq7q2kiejkcoFK9M8it"
GROUP = group_tag(b"\x01" * 20)


def _attest(
    identity: Identity, message: bytes, group: str = GROUP, reducer: str = REDUCER
) -> ProofAttestation:
    return ProofAttestation.signed(identity, group, reducer, proofs_digest(message))


def test_an_attestation_travels_as_one_token_and_verifies_only_under_its_reducers_key():
    reducer, stranger = Identity.generate(), Identity.generate()
    a = _attest(reducer, b"proofs")
    assert ProofAttestation.from_token(a.to_token()) == a
    assert a.verifies(reducer.public_key_hex)
    assert not a.verifies(stranger.public_key_hex)
    assert not a.verifies(None)
    # the signature binds the group, the reducer and the digest
    for changed in (
        ProofAttestation(group_tag(b"\x02" * 20), a.reducer, a.digest, a.signature),
        ProofAttestation(a.group, OTHER, a.digest, a.signature),
        ProofAttestation(a.group, a.reducer, proofs_digest(b"other proofs"), a.signature),
    ):
        assert not changed.verifies(reducer.public_key_hex)
    unsigned = ProofAttestation.signed(None, GROUP, REDUCER, proofs_digest(b"proofs"))
    assert unsigned.signature == "" and not unsigned.verifies(reducer.public_key_hex)
    assert ProofAttestation.from_token(unsigned.to_token()) == unsigned


@pytest.mark.parametrize(
    "token",
    [
        "",
        "not:a:token:at all",
        f"{GROUP}:{REDUCER}:{'ab' * 32}:{'cd' * 63}",
        f"{GROUP}:0OIl:{'ab' * 32}:",
        17,
    ],
)
def test_a_malformed_token_is_refused_and_left_out_of_a_records_attestations(token):
    with pytest.raises(ValueError):
        ProofAttestation.from_token(token)
    assert parse_tokens([token]) == []


def test_two_different_digests_a_reducer_signed_for_one_group_convict_it():
    reducer = Identity.generate()
    keys = {REDUCER: reducer.public_key_hex}
    told_a, told_b = _attest(reducer, b"proof for a"), _attest(reducer, b"proof for b")
    same = _attest(reducer, b"proof for a")
    assert find_equivocation([("a", [told_a]), ("c", [same])], keys) is None  # the same story twice
    found = find_equivocation([("a", [told_a]), ("c", [same]), ("b", [told_b])], keys)
    assert found is not None and found.reducer == REDUCER and found.group == GROUP
    assert {found.first_poster, found.second_poster} == {"a", "b"}
    assert "different signed proofs" in found.describe()
    # the same reducer in two all-reduces may send different proofs: no equivocation
    elsewhere = _attest(reducer, b"proof for b", group=group_tag(b"\x02" * 20))
    assert find_equivocation([("a", [told_a]), ("b", [elsewhere])], keys) is None


def test_a_poster_cannot_frame_an_honest_reducer_with_a_digest_it_made_up():
    reducer, framer = Identity.generate(), Identity.generate()
    keys = {REDUCER: reducer.public_key_hex}
    honest = _attest(reducer, b"the proofs")
    made_up = ProofAttestation(GROUP, REDUCER, proofs_digest(b"something else"), honest.signature)
    signed_by_framer = _attest(framer, b"something else")
    unsigned = ProofAttestation(GROUP, REDUCER, proofs_digest(b"something else"))
    for forged in (made_up, signed_by_framer, unsigned):
        assert find_equivocation([("a", [honest]), ("framer", [forged])], keys) is None
    # a swarm without keys (its peers trust each other) compares what is posted
    assert find_equivocation([("a", [honest]), ("b", [unsigned])], None) is not None


def test_two_stories_staged_by_one_key_convict_nobody():
    """A throw-away reducer that signed two stories of a group that never met and posted both in its
    own report stopped every commit of the attempt. Evidence takes two posters, neither the reducer."""
    reducer = Identity.generate()
    keys = {REDUCER: reducer.public_key_hex}
    one, other = _attest(reducer, b"one story"), _attest(reducer, b"another story")
    assert find_equivocation([(REDUCER, [one, other])], keys) is None  # its own report
    assert find_equivocation([(REDUCER, [one]), ("a", [other])], keys) is None  # itself and one member
    assert find_equivocation([("a", [one, other])], keys) is None  # one member (a Sybil) posts both
    assert find_equivocation([("a", [one]), ("b", [other])], keys) is not None  # two members: evidence


def test_members_that_took_the_same_proofs_share_a_fingerprint_and_one_that_did_not_differs():
    reducer = Identity.generate()
    tokens = [_attest(reducer, b"p1").to_token(), _attest(reducer, b"p2", reducer=OTHER).to_token()]
    result = hashlib.sha256(b"result").hexdigest()
    assert proofs_fingerprint(result, tokens) == proofs_fingerprint(result, list(reversed(tokens)))
    assert proofs_fingerprint(result, tokens) != proofs_fingerprint(result, tokens[:1])
    assert proofs_fingerprint(result, tokens) != proofs_fingerprint(hashlib.sha256(b"x").hexdigest(), tokens)


def _commit(identity: Identity, proofs: tuple[str, ...]) -> RoundCommit:
    return RoundCommit(
        task_id="task", attempt=3, peer_id=peer_id_of(identity), public_key=identity.public_key_hex,
        endorsement=endorsement_of(identity), ok=True,
        digest="ab" * 32, timestamp=1, proofs=proofs,
    )  # fmt: skip


def test_a_commit_report_carries_its_attestations_sealed_up_to_its_limit():
    poster, reducer = Identity.generate(), Identity.generate()
    tokens = tuple(
        _attest(reducer, str(i).encode(), group=group_tag(bytes([i]) * 20)).to_token()
        for i in range(MAX_PROOFS_POSTED)
    )
    wire = seal(_commit(poster, tokens), poster)
    opened = open_sealed(wire, RoundCommit).record
    assert opened.proofs == tokens
    assert [a.verifies(reducer.public_key_hex) for a in parse_tokens(opened.proofs)] == [
        True
    ] * MAX_PROOFS_POSTED
    with pytest.raises(ValueError):
        _commit(poster, (*tokens, tokens[0]))  # one more than a report carries
    with pytest.raises(ValueError):
        _commit(poster, ("not a token",))
