"""Admission: the membership certificates this aggregator issues, under the operator's policy.

A peer calls ``manta/<task>/admit`` with an :class:`~protocol.membership.AdmissionRequest`. Its
binding must name the peer id the call came from (libp2p authenticated it). The policy (the task
file's ``[membership]``, :func:`membership_policy`) decides whether a new key gets a certificate:

- ``open`` (default): any key, at most ``per_network_per_hour`` new keys an hour from one network
  (the /24 of an IPv4 caller, the /48 of an IPv6 one, as this node's daemon sees the connection) and
  ``per_hour`` overall;
- ``invite``: a key needs an unused token of the operator's invite file; each token admits one key;
- ``allow``: only the keys listed.

A member renews before its certificate expires without counting again; a withdrawn key (a failed
audit, a conviction) is refused. Every certificate issued, invite used and withdrawal is appended to
``members.jsonl`` in the data folder, so a restart keeps them.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from aggregator.desk_network import json_call
from aggregator.membership_policy import MembershipPolicy
from hivemind_adapter.p2p import Endpoint
from protocol.handler_names import admit_handler
from protocol.identity import Identity
from protocol.membership import AdmissionRequest, MembershipCertificate, MembershipWithdrawal
from protocol.records import IdentityBinding
from protocol.sealing import RecordRejected, Sealed, make_sealed, open_sealed

HOUR_MS = 3600 * 1000


def network_of(maddrs: list[str]) -> str | None:
    """The network a caller connects from: the /24 of its first IPv4 address, the /48 of its first
    IPv6 one, from multiaddrs such as ``/ip4/1.2.3.4/tcp/5``; None if neither is there."""
    for maddr in maddrs:
        parts = maddr.split("/")
        if len(parts) > 2 and parts[1] in ("ip4", "ip6"):
            prefix = 24 if parts[1] == "ip4" else 48
            try:
                return str(ipaddress.ip_network(f"{parts[2]}/{prefix}", strict=False))
            except ValueError:
                continue
    return None


def _invite_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class AdmissionDesk:
    """Issues and renews certificates (:meth:`answer`), withdraws them (:meth:`withdraw`); its state
    is guarded by one lock, so calls may come from any thread."""

    def __init__(
        self,
        identity: Identity,
        task_id: str,
        policy: MembershipPolicy,
        log_path: Path,
        clock: Callable[[], float] = time.time,
    ):
        self.identity, self.task_id, self.policy, self.log_path = identity, task_id, policy, Path(log_path)
        self.clock = clock
        self._lock = threading.Lock()  # guards everything below and the log file
        self._members: dict[str, dict] = {}  # key -> its newest certificate's log entry
        self._withdrawn: dict[str, str] = {}  # key -> reason
        self._used_invites: set[str] = set()  # digests
        self._admissions: list[tuple[int, str | None]] = []  # (issued ms, network) of new keys
        self._serial = 0
        self._load()

    # ------------------------------------------------------------------ state

    def _load(self) -> None:
        if not self.log_path.exists():
            return
        for line in self.log_path.read_text().splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue  # a line cut short by a crash: the ones before it stand
            if "issued" in entry:
                issued = entry["issued"]
                self._members[issued["key"]] = issued
                self._serial = max(self._serial, issued["serial"])
                if not issued.get("renewal"):
                    self._admissions.append((issued["issued_ms"], issued.get("network")))
                if issued.get("invite"):
                    self._used_invites.add(issued["invite"])
            elif "withdrawn" in entry:
                self._withdrawn[entry["withdrawn"]["key"]] = entry["withdrawn"]["reason"]

    def _append(self, entry: dict) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "a") as log:
            log.write(json.dumps(entry, sort_keys=True) + "\n")
            log.flush()
            os.fsync(log.fileno())

    def is_member(self, key: str) -> bool:
        """Whether this desk admitted ``key`` (ever) and has not withdrawn it."""
        with self._lock:
            return key in self._members and key not in self._withdrawn

    def members(self) -> frozenset[str]:
        with self._lock:
            return frozenset(k for k in self._members if k not in self._withdrawn)

    def withdrawn(self) -> frozenset[str]:
        """The keys this desk withdrew."""
        with self._lock:
            return frozenset(self._withdrawn)

    # ------------------------------------------------------------------ calls

    def answer(self, payload: bytes, sender: str, network: str | None) -> dict:
        """Answer one ``admit`` call from peer ``sender`` connecting from ``network``:
        ``{"status": "admitted", "certificate": hex}`` or ``{"status": "refused", "detail": ...}``."""
        try:
            request = AdmissionRequest.from_bytes(payload)
            binding = open_sealed(request.binding, IdentityBinding)
        except (ValueError, RecordRejected) as e:
            return {"status": "refused", "detail": f"not an admission request: {e}"}
        if binding.record.peer_id != sender:
            return {
                "status": "refused",
                "detail": f"the binding names {binding.record.peer_id}, not the caller",
            }
        key = binding.record.public_key
        with self._lock:
            refusal = self._refusal(key, sender, request.invite, network)
            if refusal is not None:
                return {"status": "refused", "detail": refusal}
            return {
                "status": "admitted",
                "certificate": self._issue(key, sender, request.invite, network).wire.hex(),
            }

    def _refusal(self, key: str, peer_id: str, invite: str, network: str | None) -> str | None:
        if key in self._withdrawn:
            return f"this key's membership was withdrawn: {self._withdrawn[key]}"
        if key in self._members:
            return None  # a renewal
        now = int(self.clock() * 1000)
        if self.policy.mode == "allow" and key not in self.policy.allow:
            return "this task admits listed keys only; ask its operator to add yours"
        if self.policy.mode == "invite":
            if invite not in self.policy.invites:
                return "this task admits by invitation: pass --invite TOKEN from its operator"
            if _invite_digest(invite) in self._used_invites:
                return "that invite was used already"
        if self.policy.mode == "open":
            recent = [n for t, n in self._admissions if t > now - HOUR_MS]
            if len(recent) >= self.policy.per_hour:
                return f"{self.policy.per_hour} keys were admitted in the last hour: try again later"
            if network is not None and recent.count(network) >= self.policy.per_network_per_hour:
                return (
                    f"{self.policy.per_network_per_hour} keys from {network} were admitted in the last hour"
                )
        return None

    def _issue(
        self, key: str, peer_id: str, invite: str, network: str | None
    ) -> Sealed[MembershipCertificate]:
        now = int(self.clock() * 1000)
        renewal = key in self._members
        self._serial += 1
        certificate = MembershipCertificate(
            task_id=self.task_id,
            member_key=key,
            peer_id=peer_id,
            serial=self._serial,
            policy=self.policy.mode,
            issued_ms=now,
            expires_ms=now + int(self.policy.validity_hours * HOUR_MS),
        )
        sealed = make_sealed(certificate, self.identity)
        used = _invite_digest(invite) if (invite and not renewal and self.policy.mode == "invite") else ""
        entry = {
            "key": key, "peer_id": peer_id, "serial": self._serial, "issued_ms": now,
            "expires_ms": certificate.expires_ms, "network": network, "renewal": renewal, "invite": used,
        }  # fmt: skip
        self._append({"issued": entry})
        self._members[key] = entry
        if not renewal:
            self._admissions.append((now, network))
            self._admissions = [(t, n) for t, n in self._admissions if t > now - HOUR_MS]
        if used:
            self._used_invites.add(used)
        return sealed

    def withdraw(self, key: str, reason: str) -> Sealed[MembershipWithdrawal] | None:
        """Withdraw ``key``'s membership (refuse its renewals); the sealed withdrawal to publish, valid
        until its last certificate expires, or None if it holds none from this desk."""
        with self._lock:
            entry = self._members.get(key)
            if key not in self._withdrawn:
                self._withdrawn[key] = reason
                self._append({"withdrawn": {"key": key, "reason": reason}})
            if entry is None:
                return None
            now = int(self.clock() * 1000)
            printable = reason.encode("ascii", "replace").decode()[:256]
            withdrawal = MembershipWithdrawal(
                task_id=self.task_id, member_key=key, reason=printable, timestamp=now,
                until_ms=max(entry["expires_ms"], now + 1),
            )  # fmt: skip
            return make_sealed(withdrawal, self.identity)


def serve_admission(endpoint: Endpoint, task_id: str, desk: AdmissionDesk) -> None:
    """Answer ``manta/<task>/admit`` on ``endpoint`` with ``desk`` (each call in a thread)."""

    def admit(payload: bytes, sender: str) -> dict:
        try:
            maddrs = endpoint.loop.run(endpoint.connections_of(sender), timeout=5.0)
        except Exception:  # the daemon could not say: the per-hour limit still holds
            maddrs = []
        return desk.answer(payload, sender, network_of(maddrs))

    endpoint.serve(admit_handler(task_id), json_call(admit))
