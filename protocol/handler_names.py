"""The libp2p handler names MANTA nodes serve and call (one definition for both sides): the
aggregator's contribution desk, admission and data, the peers' state archive, and dial-back.

Pure Python.
"""

from __future__ import annotations

# libp2p handler names of the aggregator's contribution desk (peers call them; one definition for both)


def submit_handler(task_id: str) -> str:
    return f"manta/{task_id}/submit"


def status_handler(task_id: str) -> str:
    return f"manta/{task_id}/status"


def witnesses_handler(task_id: str) -> str:
    """Where a peer hands over a receipt's witnesses (:class:`protocol.witness_bundle.WitnessBundle`)."""
    return f"manta/{task_id}/witnesses"


def state_handoff_handler(task_id: str) -> str:
    """Where a leaving peer hands over the state it ends on (:class:`protocol.state_handoff.StateHandoff`)."""
    return f"manta/{task_id}/state-handoff"


def credits_handler(task_id: str) -> str:
    return f"manta/{task_id}/credits"


def admit_handler(task_id: str) -> str:
    """Where a peer asks an aggregator for a membership certificate (``aggregator/admission.py``)."""
    return f"manta/{task_id}/admit"


def manifest_handler(task_id: str) -> str:
    """Pages of the task's shard list (:class:`protocol.shards.DataManifest`), keyed by its root."""
    return f"manta/{task_id}/manifest"


def shard_handler(task_id: str) -> str:
    """Pages of the task's data shards, by digest (hivemind_adapter.shard_transfer)."""
    return f"manta/{task_id}/shard"


def state_handler(task_id: str) -> str:
    """Pages of a recent committed state, by digest (hivemind_adapter.state_archive)."""
    return f"manta/{task_id}/state"


def state_index_handler(task_id: str) -> str:
    """A recent committed state's index (the SHA-256 of each tensor its digest covers), by digest."""
    return f"manta/{task_id}/state-index"


def state_head_handler(task_id: str) -> str:
    """Pages of a recent committed state's leading tensors (its parameters), by their own digest."""
    return f"manta/{task_id}/state-head"


# Answered by the aggregator and every full peer, for any task: "can you connect to me?"
# (hivemind_adapter.dial_back; a joining peer asks before it knows its task)
DIAL_BACK_HANDLER = "manta/dial-back"


def directory_handler(task_id: str) -> str:
    """Where an aggregator serves a directory's cohort pages (``<epoch> <cohort>``)."""
    return f"manta/{task_id}/directory"
