"""The ``--identity PATH`` option every MANTA command that signs takes, and loading it as one line of error."""

from __future__ import annotations

import os
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


def identity_to_create(path: Path) -> Identity:
    """The identity at ``path`` if the file exists (a problem is a one-line UserError), else a new key
    held in memory only: :func:`keep_identity` writes it once the command's input has been checked."""
    if os.path.lexists(path.expanduser()):
        return load_identity(path, create=False)
    return Identity.generate()


def keep_identity(identity: Identity, path: Path) -> Identity:
    """``identity`` written to ``path`` if it was made in memory by :func:`identity_to_create`."""
    if identity.path is not None:
        return identity
    try:
        return identity.store_new(path)
    except FileExistsError:
        raise UserError(f"{path} was created by another process meanwhile; start again to use it") from None
    except IdentityError as exc:
        raise UserError(str(exc)) from None
