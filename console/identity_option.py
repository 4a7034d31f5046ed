"""The ``--identity PATH`` option every MANTA command that signs takes, and loading it as one line of error."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from console.commands import UserError
from protocol.identity import DEFAULT_IDENTITY_PATH, Identity, IdentityError


def identity_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Add ``--identity PATH`` (default ``~/.manta/identity.key``), passed as ``identity_path``."""
    return click.option(
        "--identity",
        "identity_path",
        type=click.Path(dir_okay=False, path_type=Path),
        default=str(DEFAULT_IDENTITY_PATH),
        show_default=True,
        help="Ed25519 identity key file (created with mode 0600 if missing, where the command creates keys).",
    )(fn)


def load_identity(path: Path, *, create: bool) -> Identity:
    """Load (or create) the identity at ``path``; a problem becomes a one-line UserError."""
    try:
        return Identity.load_or_create(path) if create else Identity.load(path)
    except IdentityError as exc:
        raise UserError(str(exc)) from None
