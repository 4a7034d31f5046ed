"""The ``[membership]`` section of a task file: whom an aggregator admits, and for how long.

Pure (no torch, no hivemind): ``manta-aggregator start`` checks it before it loads anything.
``aggregator/admission.py`` applies it.

    [membership]
    policy = "open"              # open (default), invite or allow
    validity_hours = 24          # how long a certificate lives; members renew at half of it
    per_network_per_hour = 16    # open: new keys an hour from one /24 (IPv4) or /48 (IPv6) network
    per_hour = 240               # open: new keys an hour in all
    allow = ["<hex key>", ...]   # allow: the keys admitted
    invites = "invites.txt"      # invite: a file of tokens (16 to 256 characters, one a line)
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from aggregator.task_publication import TaskFileError
from protocol.identity import check_public_key_hex

POLICIES = ("open", "invite", "allow")
_KNOWN_KEYS = {"policy", "validity_hours", "per_network_per_hour", "per_hour", "allow", "invites"}


class MembershipPolicyError(TaskFileError):
    """A ``[membership]`` section that cannot be used; the message is one line."""


@dataclass(frozen=True)
class MembershipPolicy:
    """Who this aggregator admits, and for how long (see the module docstring)."""

    mode: str = "open"
    validity_hours: float = 24.0
    per_network_per_hour: int = 16
    per_hour: int = 240
    allow: frozenset[str] = frozenset()
    invites: frozenset[str] = frozenset()  # tokens read from the invite file


def membership_policy(section: dict[str, Any] | None, base: Path = Path(".")) -> MembershipPolicy:
    """The policy of a task file's ``[membership]`` table (``base``: the task file's folder, where a
    relative ``invites`` path starts). MembershipPolicyError (one line) for anything else."""
    section = dict(section or {})
    unknown = set(section) - _KNOWN_KEYS
    if unknown:
        raise MembershipPolicyError(f"[membership] has unknown key(s): {', '.join(sorted(unknown))}")
    mode = section.get("policy", "open")
    if mode not in POLICIES:
        raise MembershipPolicyError(f"[membership] policy: one of {', '.join(POLICIES)}, got {mode!r}")
    hours = section.get("validity_hours", 24.0)
    if isinstance(hours, bool) or not isinstance(hours, int | float) or not 0.01 <= hours <= 168:
        raise MembershipPolicyError(f"[membership] validity_hours: a number from 0.01 to 168, got {hours!r}")
    limits = {}
    for name, default in (("per_network_per_hour", 16), ("per_hour", 240)):
        value = section.get(name, default)
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 10**6:
            raise MembershipPolicyError(f"[membership] {name}: a whole number from 1 to 10^6, got {value!r}")
        limits[name] = value
    allow = section.get("allow", [])
    if not isinstance(allow, list):
        raise MembershipPolicyError("[membership] allow: a list of hex public keys")
    try:
        allowed = frozenset(check_public_key_hex(k, "[membership] allow") for k in allow)
    except (ValueError, AttributeError):
        raise MembershipPolicyError("[membership] allow: a list of 64-digit hex public keys") from None
    invites: frozenset[str] = frozenset()
    if "invites" in section:
        invites = _read_invites(section["invites"], base)
    if mode == "allow" and not allowed:
        raise MembershipPolicyError('[membership] policy = "allow" needs allow = ["<hex key>", ...]')
    if mode == "invite" and not invites:
        raise MembershipPolicyError('[membership] policy = "invite" needs invites = "<file of tokens>"')
    return MembershipPolicy(mode, float(hours), allow=allowed, invites=invites, **limits)


def _read_invites(ref: Any, base: Path) -> frozenset[str]:
    if not isinstance(ref, str):
        raise MembershipPolicyError("[membership] invites: the path of a file of tokens, one a line")
    path = Path(ref).expanduser()
    path = path if path.is_absolute() else base / path
    try:
        lines = path.read_text().split()
    except (OSError, UnicodeDecodeError) as e:
        raise MembershipPolicyError(
            f"[membership] invites: cannot read {path}: {getattr(e, 'strerror', e)}"
        ) from None
    if any(len(t) < 16 or len(t) > 256 or not t.isprintable() for t in lines):
        raise MembershipPolicyError(
            f"[membership] invites: {path}: each token is 16 to 256 printable characters"
        )
    return frozenset(lines)


POLICY_FILE = "membership.json"  # in the data folder: what --resume admits by


def save_policy(policy: MembershipPolicy, data_dir: Path) -> None:
    """Keep ``policy`` in ``data_dir`` (mode 0600: it may hold invite tokens) for a later --resume."""
    data_dir.mkdir(parents=True, exist_ok=True)
    body = {k: sorted(v) if isinstance(v, frozenset) else v for k, v in asdict(policy).items()}
    fd = os.open(data_dir / POLICY_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(body, out, sort_keys=True)


def saved_policy(data_dir: Path) -> MembershipPolicy:
    """The policy an earlier run kept in ``data_dir``; the default one if it kept none."""
    try:
        body = json.loads((data_dir / POLICY_FILE).read_text())
        return MembershipPolicy(
            **{k: frozenset(v) if k in ("allow", "invites") else v for k, v in body.items()}
        )
    except FileNotFoundError:
        return MembershipPolicy()
    except (OSError, ValueError, TypeError) as e:
        raise MembershipPolicyError(
            f"{data_dir / POLICY_FILE}: not a saved membership policy ({e})"
        ) from None
