"""`manta-peer`: the command a volunteer runs."""

from __future__ import annotations

from pathlib import Path

import click

from protocol.cli_support import manta_group
from protocol.identity_cli import identity_option, load_identity


@manta_group("manta-peer", "Lend this machine's GPUs or CPU to a MANTA training swarm.")
def main() -> None:
    pass


@main.command()
@identity_option
def identity(identity_path: Path) -> None:
    """Create this machine's identity key if missing; print its public key and fingerprint."""
    existed = identity_path.expanduser().exists()
    ident = load_identity(identity_path, create=True)
    click.echo(f"public key:  {ident.public_key_hex}")
    click.echo(f"fingerprint: {ident.fingerprint}")
    click.echo(f"key file:    {ident.path}{'' if existed else ' (created)'}")
