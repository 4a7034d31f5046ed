"""The aggregator's admission desk: certificates under the open, invite and allow policies, renewals,
withdrawals, and what survives a restart (aggregator/admission.py, aggregator/membership_policy.py)."""

from __future__ import annotations

import pytest

from aggregator.admission import AdmissionDesk, network_of
from aggregator.membership_policy import MembershipPolicy, MembershipPolicyError, membership_policy
from protocol.identity import Identity
from protocol.membership import AdmissionRequest, MembershipCertificate, certificate_problem
from protocol.sealing import open_sealed
from tests.protocol.factories import TASK, binding_wire, peer_id_of

AGGREGATOR = Identity.generate()


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def _ask(desk: AdmissionDesk, who: Identity, network: str | None = "10.0.0.0/24", invite: str = "") -> dict:
    payload = AdmissionRequest(binding_wire(who), invite).to_bytes()
    return desk.answer(payload, peer_id_of(who), network)


def _desk(tmp_path, policy: MembershipPolicy, clock=None) -> AdmissionDesk:
    return AdmissionDesk(AGGREGATOR, TASK, policy, tmp_path / "members.jsonl", clock=clock or Clock())


def test_an_admitted_key_gets_a_certificate_every_reader_accepts(tmp_path):
    clock = Clock()
    desk = _desk(tmp_path, MembershipPolicy(validity_hours=2.0), clock)
    peer = Identity.generate()
    reply = _ask(desk, peer)
    assert reply["status"] == "admitted", reply
    certificate = open_sealed(bytes.fromhex(reply["certificate"]), MembershipCertificate)
    now_ms = int(clock.now * 1000)
    keys = frozenset({AGGREGATOR.public_key_hex})
    assert certificate_problem(certificate, TASK, keys, peer.public_key_hex, peer_id_of(peer), now_ms) is None
    assert certificate.record.expires_ms - certificate.record.issued_ms == 2 * 3600 * 1000
    assert desk.is_member(peer.public_key_hex)


def test_a_binding_must_come_from_the_peer_it_names(tmp_path):
    desk, peer, other = _desk(tmp_path, MembershipPolicy()), Identity.generate(), Identity.generate()
    payload = AdmissionRequest(binding_wire(peer)).to_bytes()
    reply = desk.answer(payload, peer_id_of(other), None)  # someone else asks for the peer's key
    assert reply["status"] == "refused" and "not the caller" in reply["detail"]
    assert desk.answer(b"nonsense", peer_id_of(peer), None)["status"] == "refused"
    assert not desk.is_member(peer.public_key_hex)


def test_open_admission_is_rate_limited_per_network_and_overall_but_renewals_are_not(tmp_path):
    clock = Clock()
    desk = _desk(tmp_path, MembershipPolicy(per_network_per_hour=3, per_hour=5), clock)
    first = [Identity.generate() for _ in range(3)]
    assert [_ask(desk, p)["status"] for p in first] == ["admitted"] * 3
    sybil = _ask(desk, Identity.generate())  # a fourth key from the same /24 within the hour
    assert sybil["status"] == "refused" and "10.0.0.0/24" in sybil["detail"]
    assert _ask(desk, first[0])["status"] == "admitted"  # a member renews whatever the limits
    elsewhere = [_ask(desk, Identity.generate(), network=f"10.0.{i}.0/24")["status"] for i in (1, 2, 3)]
    assert elsewhere == ["admitted", "admitted", "refused"]  # 5 new keys an hour in all
    clock.now += 3601
    assert _ask(desk, Identity.generate())["status"] == "admitted"  # an hour later


def test_invites_admit_one_key_each(tmp_path):
    tokens = frozenset({"invite-aaaaaaaaaaaaaaaa", "invite-bbbbbbbbbbbbbbbb"})
    desk = _desk(tmp_path, MembershipPolicy(mode="invite", invites=tokens))
    a, b = Identity.generate(), Identity.generate()
    assert "by invitation" in _ask(desk, a)["detail"]
    assert "by invitation" in _ask(desk, a, invite="invite-not-one-of-them")["detail"]
    assert _ask(desk, a, invite="invite-aaaaaaaaaaaaaaaa")["status"] == "admitted"
    assert "used already" in _ask(desk, b, invite="invite-aaaaaaaaaaaaaaaa")["detail"]
    assert _ask(desk, a)["status"] == "admitted"  # a renewal needs no token
    again = _desk(tmp_path, MembershipPolicy(mode="invite", invites=tokens))  # restarted
    assert "used already" in _ask(again, b, invite="invite-aaaaaaaaaaaaaaaa")["detail"]
    assert _ask(again, b, invite="invite-bbbbbbbbbbbbbbbb")["status"] == "admitted"


def test_an_allow_list_admits_its_keys_only(tmp_path):
    listed, stranger = Identity.generate(), Identity.generate()
    desk = _desk(tmp_path, MembershipPolicy(mode="allow", allow=frozenset({listed.public_key_hex})))
    assert _ask(desk, listed)["status"] == "admitted"
    assert "listed keys only" in _ask(desk, stranger)["detail"]


def test_a_withdrawn_key_is_refused_and_stays_withdrawn_after_a_restart(tmp_path):
    clock = Clock()
    desk = _desk(tmp_path, MembershipPolicy(), clock)
    peer = Identity.generate()
    assert _ask(desk, peer)["status"] == "admitted"
    withdrawal = desk.withdraw(peer.public_key_hex, "failed an audit in round 3")
    assert withdrawal is not None and withdrawal.record.until_ms > clock.now * 1000
    assert "withdrawn" in _ask(desk, peer)["detail"] and not desk.is_member(peer.public_key_hex)
    again = _desk(tmp_path, MembershipPolicy(), clock)
    assert "withdrawn" in _ask(again, peer)["detail"]
    assert desk.withdraw(Identity.generate().public_key_hex, "never admitted") is None


def test_the_network_of_a_caller():
    assert network_of(["/ip4/192.168.7.42/tcp/31337"]) == "192.168.7.0/24"
    assert network_of(["/p2p-circuit", "/ip6/2001:db8:1:2::5/tcp/1"]) == "2001:db8:1::/48"
    assert network_of(["/dns4/example.org/tcp/1"]) is None


@pytest.mark.parametrize(
    "section, message",
    [
        ({"policy": "closed"}, "policy: one of open, invite, allow"),
        ({"policy": "allow"}, "needs allow"),
        ({"policy": "invite"}, "needs invites"),
        ({"validity_hours": 0}, "validity_hours"),
        ({"validity_hours": True}, "validity_hours"),
        ({"per_hour": "many"}, "per_hour"),
        ({"allow": ["not hex"]}, "allow"),
        ({"allow": "ab"}, "allow"),
        ({"invites": "missing.txt"}, "cannot read"),
        ({"colour": "blue"}, "unknown key"),
    ],
)
def test_a_bad_membership_section_is_one_line(tmp_path, section, message):
    with pytest.raises(MembershipPolicyError, match=message) as err:
        membership_policy(section, tmp_path)
    assert "\n" not in str(err.value)


def test_invites_are_read_from_a_file_beside_the_task_file(tmp_path):
    (tmp_path / "invites.txt").write_text("invite-aaaaaaaaaaaaaaaa\ninvite-bbbbbbbbbbbbbbbb\n")
    policy = membership_policy({"policy": "invite", "invites": "invites.txt"}, tmp_path)
    assert policy.invites == {"invite-aaaaaaaaaaaaaaaa", "invite-bbbbbbbbbbbbbbbb"}
    (tmp_path / "short.txt").write_text("abc\n")
    with pytest.raises(MembershipPolicyError, match="16 to 256"):
        membership_policy({"policy": "invite", "invites": "short.txt"}, tmp_path)
