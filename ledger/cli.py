"""`manta-ledger`: the auditor's view of a contribution ledger.

``verify PATH`` recomputes every leaf and root and checks every signature and checkpoint (exit 0 and a
one-line summary, or exit 1 naming the first altered entry or checkpoint), and with ``--checkpoint
NOTE`` that the ledger extends a checkpoint kept from before (:mod:`ledger.pinned`); ``show PATH`` lists
entries; ``head PATH`` prints the latest checkpoint note; ``proof PATH --index N`` prints and checks an
inclusion proof against the latest signed checkpoint; ``rewards PATH [--json]`` prints the reward
table. The file is opened read-only. A missing, truncated or corrupted file is one line on stderr and
exit status 1.
"""

from __future__ import annotations

import functools
import json
import sqlite3
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from console.commands import UserError, manta_group
from ledger.pinned import pinned_problem
from ledger.rewards import compute_rewards
from ledger.store import LedgerStore
from ledger.verify import default_jobs, verify_ledger
from protocol.identity import fingerprint
from protocol.merkle import verify_inclusion
from protocol.note import parse_vkey
from protocol.records import LEDGER_ENTRY_TYPES, ContributionReceipt
from protocol.sealing import parse_sealed

_PATH = click.argument("path", type=click.Path(dir_okay=False, path_type=Path))


@manta_group("manta-ledger", "Verify a MANTA contribution ledger, print proofs and compute rewards.")
def main() -> None:
    pass


def _one_line_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn a ledger, record or SQLite problem into ``Error: <one line>`` and exit status 1."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (ValueError, OSError) as exc:
            raise UserError(str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from None
        except sqlite3.Error as exc:
            path = kwargs.get("path", "")
            raise UserError(f"{path} is corrupted or unreadable ({exc})") from None

    return wrapper


def _parse_key(text: str | None) -> bytes | None:
    """A pinned log key: 64 hex digits, or a C2SP verifier key ``name+id+base64``."""
    if text is None:
        return None
    if "+" in text:
        return parse_vkey(text)[1]
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) != 32:
        raise UserError("--key is a 64-digit hex Ed25519 public key or a C2SP verifier key")
    return key


@main.command()
@_PATH
@click.option("--key", help="Pin the aggregator's key (hex public key or C2SP verifier key).")
@click.option(
    "--jobs", type=click.IntRange(1, 64), default=None, help="Processes checking signatures [default: CPUs]."
)
@click.option(
    "--checkpoint",
    "pinned_note",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="A checkpoint note kept from before: the ledger must extend it (an RFC 9162 consistency proof).",
)
@_one_line_errors
def verify(path: Path, key: str | None, jobs: int | None, pinned_note: Path | None) -> None:
    """Recompute every leaf and root; check every signature and checkpoint."""
    pinned_text = pinned_note.read_text(encoding="utf-8") if pinned_note is not None else None
    progress = _progress_printer("verifying") if sys.stderr.isatty() else None
    log_key = _parse_key(key)
    result = verify_ledger(path, log_public_key=log_key, jobs=jobs or default_jobs(), progress=progress)
    if progress:
        click.echo("", err=True)
    click.echo(result.summary)
    if not result.ok:
        sys.exit(1)
    if pinned_text is not None:
        problem = pinned_problem(path, pinned_text, log_key)
        if problem is not None:
            click.echo(f"NOT CONSISTENT with {pinned_note}: {problem}")
            sys.exit(1)
        click.echo(f"consistent with the pinned checkpoint {pinned_note}")


def _progress_printer(label: str) -> Callable[[int, int], None]:
    start = time.monotonic()

    def show(done: int, total: int) -> None:
        elapsed = time.monotonic() - start
        click.echo(f"\r{label}: {done:,}/{total:,} entries ({elapsed:.0f} s)", err=True, nl=False)

    return show


@main.command()
@_PATH
@click.option("--start", type=click.IntRange(0), default=0, show_default=True, help="First entry index.")
@click.option("--limit", type=click.IntRange(1), default=100, show_default=True, help="Entries to list.")
@click.option(
    "--json", "as_json", is_flag=True, help="One JSON object per entry (the signed record and its key)."
)
@_one_line_errors
def show(path: Path, start: int, limit: int, as_json: bool) -> None:
    """List entries: index, kind, signer, and the record's main fields."""
    with LedgerStore.open(path, readonly=True) as store:
        if not as_json:
            click.echo(
                f"{store.path}: {store.size} entries, log {store.origin} key {fingerprint(store.log_public_key)}"
            )
            click.echo(
                f"{'index':>8}  {'kind':<10}  {'signer':<16}  {'round':>6}  {'seq':>6}  {'credit':>12}  details"
            )
        for index, data in store.entries(start, start + limit):
            sealed = parse_sealed(data, LEDGER_ENTRY_TYPES)
            record = sealed.record
            if as_json:
                fields = {"index": index, "kind": record.RECORD_TYPE, "signer": sealed.public_key.hex()}
                click.echo(json.dumps({**fields, "record": record.model_dump(mode="json")}, sort_keys=True))
            elif isinstance(record, ContributionReceipt):
                click.echo(
                    f"{index:>8}  {'receipt':<10}  {fingerprint(sealed.public_key):<16}  {record.round:>6}  "
                    f"{record.seq:>6}  {record.credit:>12.4g}  peer {record.peer_id} samples {record.samples}"
                )
            else:
                click.echo(
                    f"{index:>8}  {'revocation':<10}  {fingerprint(sealed.public_key):<16}  {'':>6}  {'':>6}  "
                    f"{'':>12}  revokes entry {record.entry_index}: {record.reason}"
                )
        if not as_json and store.size > start + limit:
            click.echo(f"... {store.size - start - limit} more (--start {start + limit})")


@main.command()
@_PATH
@_one_line_errors
def head(path: Path) -> None:
    """Print the latest signed checkpoint (C2SP tlog-checkpoint note)."""
    with LedgerStore.open(path, readonly=True) as store:
        latest = store.latest_checkpoint()
        if latest is None:
            raise UserError(f"{store.path} has no checkpoint yet")
        click.echo(latest.note, nl=False)


@main.command()
@_PATH
@click.option("--index", "index", type=click.IntRange(0), required=True, help="Entry index.")
@_one_line_errors
def proof(path: Path, index: int) -> None:
    """Print the inclusion proof of entry N and check it against the latest signed checkpoint."""
    with LedgerStore.open(path, readonly=True) as store:
        latest = store.latest_checkpoint()
        if latest is None:
            raise UserError(f"{store.path} has no checkpoint yet")
        size = latest.size
        if index >= size:
            raise UserError(f"no entry {index} under the latest checkpoint ({size} entries)")
        entry = store.entry(index)
        hashes = store.inclusion_proof(index, size)
        click.echo(f"entry {index} of {size}, leaf hash {store.leaf_hash(index).hex()}")
        click.echo(
            f"checkpoint {latest.seq}: origin {latest.checkpoint.origin}, size {size}, root {latest.checkpoint.root}"
        )
        click.echo(f"inclusion proof ({len(hashes)} hashes, RFC 9162 order):")
        for h in hashes:
            click.echo(f"  {h.hex()}")
        if not verify_inclusion(entry, index, size, hashes, latest.checkpoint.root_bytes):
            click.echo("FAILED: the proof does not lead to the signed root")
            sys.exit(1)
        click.echo("OK: the entry is included under the signed checkpoint")


@main.command()
@_PATH
@click.option("--json", "as_json", is_flag=True, help="Print the table as JSON.")
@_one_line_errors
def rewards(path: Path, as_json: bool) -> None:
    """Per-peer credits (training FLOPs), share and entries, from the log alone."""
    with LedgerStore.open(path, readonly=True) as store:
        table = compute_rewards((data for _, data in store.entries()), store.log_public_key)
    if as_json:
        click.echo(json.dumps(table.to_json(), indent=2, sort_keys=True))
        return
    click.echo(
        f"{table.receipts} receipts, {table.revocations} revoked, total credit {table.total_credits:.4g} FLOPs"
    )
    click.echo(
        f"{'peer key':<16}  {'credits (FLOPs)':>16}  {'share':>7}  {'entries':>7}  {'revoked':>7}  peer ids"
    )
    for peer in table.peers:
        click.echo(
            f"{peer.fingerprint:<16}  {peer.credits:>16.6g}  {peer.share:>7.2%}  {peer.entries:>7}  "
            f"{peer.revoked:>7}  {', '.join(peer.peer_ids)}"
        )
