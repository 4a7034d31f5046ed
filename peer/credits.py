"""`manta-peer credits`: what the ledger says this key earned, with every inclusion proof checked.

The aggregator answers ``manta/<task>/credits`` with each of the key's ledger entries, an inclusion
proof for each and its latest signed checkpoint note. Nothing of it is taken on trust: the note must
be signed by an aggregator key the TaskSpec lists, and every entry's proof must lead from the
entry's leaf hash to the note's root. Figures are shown in credited training FLOPs and in GPU-hours
of a reference device (:mod:`ledger.units`).
"""

from __future__ import annotations

from pathlib import Path

from hivemind_adapter.dht import SwarmUnreachable, start_dht
from hivemind_adapter.p2p import Endpoint
from ledger.units import gpu_hour_unit, gpu_hours
from peer.receipts import AggregatorLink
from peer.swarm_view import fetch_task
from protocol.handler_names import credits_handler
from protocol.identity import Identity, fingerprint
from protocol.ledger_checkpoint import Checkpoint
from protocol.merkle import verify_inclusion_hash


class CreditsError(RuntimeError):
    """No credits could be fetched (one line for the volunteer)."""


def fetch_credits(
    initial_peers: tuple[str, ...],
    task_id: str | None,
    identity: Identity,
    data_dir: Path,
    aggregator_key: str | None = None,
) -> dict:
    """Ask the task's aggregator for ``identity``'s ledger entries and check them (:func:`check_credits`).
    ``aggregator_key`` (hex), when given, is the only key whose task is trusted. CreditsError (one
    line) if the swarm, the task or an aggregator cannot be reached."""
    try:
        dht = start_dht(initial_peers=initial_peers, client_mode=True)
    except SwarmUnreachable as e:
        raise CreditsError(f"cannot reach the swarm: {e}") from None
    endpoint = None
    try:
        try:
            spec = fetch_task(dht, task_id, aggregator_key).record
        except LookupError as e:
            raise CreditsError(str(e)) from None
        endpoint = Endpoint(dht, "manta-credits")
        link = AggregatorLink(dht, endpoint, spec.task_id, tuple(spec.aggregator_keys))
        aggregators = link.aggregators()
        if not aggregators:
            raise CreditsError(f"no aggregator of task {spec.task_id} is reachable")
        key, peer_id = sorted(aggregators.items())[0]
        reply = link.call(peer_id, credits_handler(spec.task_id), identity.public_key_hex.encode())
        if reply.get("status") == "rejected":
            raise CreditsError(f"the aggregator refused: {reply.get('detail', 'no reason given')}")
        return {**check_credits(reply, key, spec.task_id, data_dir), "key": identity.public_key_hex}
    finally:
        if endpoint is not None:
            endpoint.close()
        dht.shutdown()


def check_credits(reply: dict, aggregator_key: str, task_id: str, data_dir: Path) -> dict:
    """Verify every proof in an aggregator's credits reply; the report :func:`format_credits` prints."""
    entries = reply.get("entries", [])
    bad, checkpoint = 0, None
    for entry in entries:
        try:
            checkpoint = Checkpoint.from_note(entry["checkpoint"], bytes.fromhex(aggregator_key))
            ok = verify_inclusion_hash(
                bytes.fromhex(entry["leaf_hash"]),
                int(entry["index"]),
                checkpoint.size,
                [bytes.fromhex(h) for h in entry["proof"]],
                checkpoint.root_bytes,
            )
        except (KeyError, ValueError):
            ok = False
        entry["proof_ok"] = ok
        bad += not ok
    outbox = Path(data_dir) / "receipts"
    counts = {sub: len(list((outbox / sub).glob("*.receipt"))) for sub in ("pending", "settled", "rejected")}
    return {
        "task_id": task_id,
        "aggregator": aggregator_key,
        "entries": entries,
        "credits": reply.get("credits", 0),
        "share": reply.get("share", 0.0),
        "total_credits": reply.get("total_credits", 0),
        "checkpoint_size": checkpoint.size if checkpoint else None,
        "bad_proofs": bad,
        "outbox": counts,
    }


def format_credits(report: dict) -> str:
    """The report as a person reads it: credits in FLOPs and GPU-hours, the last 10 entries."""
    entries = report["entries"]
    revoked = sum(e.get("revoked", False) for e in entries)
    lines = [
        f"task {report['task_id']}, aggregator {fingerprint(bytes.fromhex(report['aggregator']))}"
        + (f", key {fingerprint(bytes.fromhex(report['key']))}" if report.get("key") else ""),
        f"ledger entries: {len(entries)} ({revoked} revoked); credits {report['credits']:,} training FLOPs "
        f"({_hours(report['credits'])}) = {100 * report['share']:.2f}% of {report['total_credits']:,} "
        f"({_hours(report['total_credits'])})",
    ]
    for e in entries[-10:]:
        lines.append(
            f"  #{e['index']:>6}  round {e['round']:>5}  {e['samples']:>6} samples  credit {e['credit']:>14,}"
            f" = {gpu_hours(e['credit']):>9.3g} GPU-h  {'REVOKED' if e.get('revoked') else 'ok':>7}"
            f"  proof {'ok' if e['proof_ok'] else 'BAD'}"
        )
    if report["checkpoint_size"] is not None:
        good = len(entries) - report["bad_proofs"]
        lines.append(
            f"{good} of {len(entries)} inclusion proofs check against the checkpoint of size {report['checkpoint_size']}"
        )
    o = report["outbox"]
    lines.append(f"local outbox: {o['pending']} pending, {o['settled']} settled, {o['rejected']} rejected")
    unit = gpu_hour_unit()
    lines.append(
        f"1 GPU-hour = an hour of an {unit['device']} at its {unit['fp32_tflops']} TFLOP/s FP32 peak "
        f"= {unit['credited_flops_per_gpu_hour']:.4g} training FLOPs (multiply-adds)"
    )
    return "\n".join(lines)


def _hours(credit: int) -> str:
    return f"{gpu_hours(credit):.3g} GPU-hours"


def credits_json(report: dict) -> dict:
    """Every figure of the report, machine-readable: each credit in FLOPs and in GPU-hours, every
    entry (not only the last 10), the proof checks, the outbox and the GPU-hour's definition."""
    entries = [
        {
            "index": e["index"],
            "round": e["round"],
            "seq": e.get("seq"),
            "samples": e["samples"],
            "credit_flops": e["credit"],
            "credit_gpu_hours": gpu_hours(e["credit"]),
            "revoked": bool(e.get("revoked", False)),
            "proof_ok": e["proof_ok"],
        }
        for e in report["entries"]
    ]
    key = report.get("key")
    return {
        "task_id": report["task_id"],
        "aggregator": {
            "public_key": report["aggregator"],
            "fingerprint": fingerprint(bytes.fromhex(report["aggregator"])),
        },
        "key": {"public_key": key, "fingerprint": fingerprint(bytes.fromhex(key))} if key else None,
        "credits": {"flops": report["credits"], "gpu_hours": gpu_hours(report["credits"])},
        "total_credits": {"flops": report["total_credits"], "gpu_hours": gpu_hours(report["total_credits"])},
        "share": report["share"],
        "entries": entries,
        "revoked_entries": sum(e["revoked"] for e in entries),
        "checkpoint_size": report["checkpoint_size"],
        "proofs_ok": len(entries) - report["bad_proofs"],
        "bad_proofs": report["bad_proofs"],
        "outbox": report["outbox"],
        "gpu_hour": gpu_hour_unit(),
    }
