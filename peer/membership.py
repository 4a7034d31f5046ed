"""This peer's membership of its task: a certificate an aggregator of the task issued
(:mod:`protocol.membership`), kept in the data folder and renewed at half its life.

Without one the peer's announcement is refused everywhere and it counts in no roster, so a peer
gets one before it announces (:meth:`Membership.obtain`): the one it kept, if it still has more than
half its life, else from an aggregator (``manta/<task>/admit``, with ``--invite`` where the task's
policy asks for one). A renewal that fails leaves the current certificate in place; it is tried
again every minute, and the swarm keeps counting the peer until the certificate expires.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

from peer.receipts import AggregatorLink
from protocol.handler_names import admit_handler
from protocol.membership import AdmissionRequest, MembershipCertificate, certificate_problem
from protocol.peer_keys import Speaker
from protocol.records import IdentityBinding
from protocol.sealing import RecordRejected, Sealed, open_sealed, seal

logger = logging.getLogger(__name__)

START_SECONDS = 60.0  # how long a starting peer looks for an aggregator that answers
RENEW_EVERY = 60.0  # seconds between renewal checks (and retries of a failed one)
CALL_SECONDS = 20.0


class NotAdmitted(RuntimeError):
    """No aggregator of the task admitted this peer; the message is one line for the volunteer."""


def sealed_binding(speaker: Speaker) -> bytes:
    """The sealed IdentityBinding of what ``speaker`` signs as (its two keys sign each other)."""
    binding = IdentityBinding(
        peer_id=speaker.peer_id,
        public_key=speaker.public_key_hex,
        endorsement=speaker.endorsement,
        timestamp=int(time.time() * 1000),
    )
    return seal(binding, speaker.identity)


class Membership:
    """The peer's current certificate (:meth:`wire`), obtained by :meth:`obtain` and renewed by a
    thread :meth:`keep_renewed` starts (:meth:`stop` ends it)."""

    def __init__(
        self,
        link: AggregatorLink,
        task_id: str,
        aggregator_keys: tuple[str, ...],
        speaker: Speaker,
        path: Path,
        invite: str = "",
    ):
        self.link, self.task_id, self.keys = link, task_id, frozenset(aggregator_keys)
        self.speaker, self.path, self.invite = speaker, Path(path), invite
        self._lock = threading.Lock()  # guards _current
        self._current: Sealed[MembershipCertificate] | None = self._kept()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _problem(self, certificate: Sealed[MembershipCertificate]) -> str | None:
        return certificate_problem(
            certificate, self.task_id, self.keys, self.speaker.public_key_hex, self.speaker.peer_id,
            int(time.time() * 1000),
        )  # fmt: skip

    def _kept(self) -> Sealed[MembershipCertificate] | None:
        try:
            kept = open_sealed(self.path.read_bytes(), MembershipCertificate)
        except (OSError, RecordRejected):
            return None
        return kept if self._problem(kept) is None else None

    def _due(self) -> bool:
        """Whether the certificate is missing or past half its life."""
        with self._lock:
            current = self._current
        if current is None:
            return True
        cert = current.record
        return time.time() * 1000 >= (cert.issued_ms + cert.expires_ms) / 2

    def wire(self) -> bytes:
        with self._lock:
            if self._current is None:
                raise NotAdmitted("this peer holds no membership certificate")
            return self._current.wire

    def obtain(self, seconds: float = START_SECONDS) -> None:
        """Hold a certificate with more than half its life left: kept, or asked for, trying every
        aggregator for up to ``seconds``. NotAdmitted (one line) if one refused, or none answered
        and no live certificate is kept."""
        deadline = time.monotonic() + seconds
        while self._due():
            outcome = self._ask_once()
            if outcome is None:
                return
            refused, detail = outcome
            if refused:
                raise NotAdmitted(f"the task's aggregator did not admit this peer: {detail}")
            if time.monotonic() >= deadline:
                if self._current is not None:
                    return  # a live certificate, short of half its life: renewed later
                raise NotAdmitted(f"no aggregator of the task answered an admission request ({detail})")
            time.sleep(min(2.0, max(0.0, deadline - time.monotonic())))

    def _ask_once(self) -> tuple[bool, str] | None:
        """One request to each aggregator until one admits: None once admitted, else (whether one
        refused, why)."""
        request = AdmissionRequest(sealed_binding(self.speaker), self.invite).to_bytes()
        why = "no aggregator found in the swarm"
        for key, peer_id in sorted(self.link.aggregators().items()):
            try:
                reply = self.link.call(peer_id, admit_handler(self.task_id), request, timeout=CALL_SECONDS)
            except Exception as e:  # unreachable, timed out, gone: the next one, or a later try
                why = f"{type(e).__name__}: {e}"
                continue
            if reply.get("status") == "admitted":
                try:
                    certificate = open_sealed(bytes.fromhex(reply["certificate"]), MembershipCertificate)
                except (KeyError, ValueError, RecordRejected) as e:
                    why = f"an unreadable certificate ({e})"
                    continue
                problem = self._problem(certificate)
                if problem is not None or certificate.public_key.hex() != key:
                    why = problem or "a certificate signed by another key"
                    continue
                self._keep(certificate)
                return None
            if reply.get("status") == "refused":
                return True, str(reply.get("detail", "refused"))
            why = str(reply.get("detail", reply))
        return False, why

    def _keep(self, certificate: Sealed[MembershipCertificate]) -> None:
        with self._lock:
            self._current = certificate
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        try:
            tmp.write_bytes(certificate.wire)
            os.replace(tmp, self.path)
        except OSError as e:  # kept in memory: the next start asks again
            logger.warning(f"could not keep the membership certificate in {self.path}: {e}")

    def keep_renewed(self) -> None:
        """Renew at half the certificate's life, from a background thread."""

        def loop() -> None:
            while not self._stop.wait(RENEW_EVERY):
                if self._due():
                    outcome = self._ask_once()
                    if outcome is not None:
                        logger.warning(f"membership not renewed yet: {outcome[1]}")

        self._thread = threading.Thread(target=loop, name="manta-membership", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=CALL_SECONDS + 5)
