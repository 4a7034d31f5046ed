"""A reducer's signed word on the proofs it sent, and the evidence that it sent two different ones.

A robust reducer ends its replies with one message of proofs (``robust_aggregation.reducer_proof``)
that lists every sender's entry; each member checks only its own entry exactly. So the proofs bind
only if every member got *the same* message: a reducer that sends each member a different one (each
true about that member, false about the others) could pass any result. Honest reducers send the same
bytes to all, so here the reducer signs the digest of that message with its MANTA key, each member
posts the signed digests it accepted beside its result (``RoundCommit.proofs``), and two validly
signed digests of one reducer for one all-reduce that differ are the reducer's own word against
itself: evidence anyone can check, which no member can forge to frame an honest reducer.

An attestation travels as one string, ``<group>:<reducer>:<digest>:<signature>`` (hex, base58, hex,
hex), so that a commit record stays a flat, canonically encoded record.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache

from protocol.identity import Identity, verify_signature

DOMAIN = b"manta/reducer-proofs/v1\n"  # what the signed message starts with (no other record does)
GROUP_HEX = 32  # an all-reduce's group id, as the first 16 bytes of its SHA-256 (ids vary in length)
TOKEN_PATTERN = r"^[0-9a-f]{32}:[1-9A-HJ-NP-Za-km-z]{16,128}:[0-9a-f]{64}:(?:[0-9a-f]{128})?$"
TOKEN_MAX_CHARS = GROUP_HEX + 1 + 128 + 1 + 64 + 1 + 128
_TOKEN = re.compile(TOKEN_PATTERN)


def group_tag(group_id: bytes) -> str:
    """The short, fixed-length name of an all-reduce group that attestations carry."""
    return hashlib.sha256(group_id).hexdigest()[:GROUP_HEX]


def proofs_digest(proofs_message: bytes) -> str:
    """The SHA-256 (hex) of a reducer's proofs message, as packed for the wire."""
    return hashlib.sha256(proofs_message).hexdigest()


def attestation_message(group: str, reducer: str, digest: str) -> bytes:
    """What the reducer signs: its proofs' digest, bound to the group and to its own peer id."""
    return DOMAIN + f"{group}\n{reducer}\n{digest}".encode()


@dataclass(frozen=True)
class ProofAttestation:
    """``reducer`` says: in all-reduce ``group`` I sent the proofs whose digest is ``digest``.
    ``signature`` (hex, by the reducer's MANTA key) is empty where the reducer has no key (test
    swarms): an unsigned attestation is never evidence."""

    group: str
    reducer: str
    digest: str
    signature: str = ""

    @classmethod
    def signed(cls, identity: Identity | None, group: str, reducer: str, digest: str) -> ProofAttestation:
        signature = (
            "" if identity is None else identity.sign(attestation_message(group, reducer, digest)).hex()
        )
        return cls(group, reducer, digest, signature)

    def verifies(self, public_key_hex: str | None) -> bool:
        """Whether the signature is the reducer's, under ``public_key_hex`` (its roster key)."""
        if not self.signature or not public_key_hex:
            return False
        return _signature_holds(self, public_key_hex)

    def to_token(self) -> str:
        return f"{self.group}:{self.reducer}:{self.digest}:{self.signature}"

    @classmethod
    def from_token(cls, token: str) -> ProofAttestation:
        """The attestation a token carries; ValueError if it is not one."""
        if not isinstance(token, str) or not _TOKEN.match(token):
            raise ValueError(f"not a proof attestation: {str(token)[:40]!r}")
        group, reducer, digest, signature = token.split(":")
        return cls(group, reducer, digest, signature)


@lru_cache(maxsize=4096)
def _signature_holds(attestation: ProofAttestation, public_key_hex: str) -> bool:
    """One Ed25519 check per attestation and key: a peer waiting for its quorum re-reads the same
    reports every 0.1 s, and each read compares every attestation on the board."""
    try:
        key, signature = bytes.fromhex(public_key_hex), bytes.fromhex(attestation.signature)
    except ValueError:
        return False
    message = attestation_message(attestation.group, attestation.reducer, attestation.digest)
    return verify_signature(key, message, signature)


@dataclass(frozen=True)
class Equivocation:
    """A reducer that signed two different proofs messages for one all-reduce (``first`` as posted
    by ``first_poster``, ``second`` by ``second_poster``): both signatures check out."""

    reducer: str
    group: str
    first: ProofAttestation
    second: ProofAttestation
    first_poster: str
    second_poster: str

    def describe(self) -> str:
        return (
            f"reducer {self.reducer[-8:]} sent different signed proofs in all-reduce {self.group[:8]} "
            f"(to {self.first_poster[-8:]} and {self.second_poster[-8:]})"
        )


def find_equivocation(
    posted: Iterable[tuple[str, Iterable[ProofAttestation]]],
    public_keys: Mapping[str, str] | None,
) -> Equivocation | None:
    """The first reducer among ``posted`` ((poster, its attestations) pairs) that signed two different
    digests for one group, checked under ``public_keys`` (peer id -> hex key, the roster's); None if
    there is none. Without ``public_keys`` (a swarm with no MANTA keys) attestations are compared as
    posted: there the posters are trusted. A signature that does not verify is left out: a poster
    cannot frame a reducer with a digest it made up. The two stories must come from two different
    posters, neither of them the reducer: one key (a throw-away reducer signing two stories of a group
    that never met) cannot stage evidence that stops every commit of an attempt."""
    seen: dict[tuple[str, str], tuple[ProofAttestation, str]] = {}
    for poster, attestations in posted:
        for a in attestations:
            if poster == a.reducer:
                continue  # what a reducer posts of its own proofs is no other member's evidence
            if public_keys is not None and not a.verifies(public_keys.get(a.reducer)):
                continue
            first = seen.setdefault((a.group, a.reducer), (a, poster))
            if first[0].digest != a.digest and first[1] != poster:
                return Equivocation(a.reducer, a.group, first[0], a, first[1], poster)
    return None


def proofs_fingerprint(result_digest: str, tokens: Iterable[str]) -> str:
    """One digest of a result and of the proofs (tokens) a member took with it: the members of an
    all-reduce that every reducer served the same proofs hold the same one."""
    return hashlib.sha256("\n".join([result_digest, *sorted(tokens)]).encode()).hexdigest()


def parse_tokens(tokens: Iterable[str]) -> list[ProofAttestation]:
    """The attestations among ``tokens`` (one a record carries), malformed ones left out."""
    out = []
    for token in tokens:
        try:
            out.append(ProofAttestation.from_token(token))
        except ValueError:
            continue
    return out
