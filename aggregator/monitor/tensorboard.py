"""``manta-aggregator start --tensorboard DIR``: the round history as TensorBoard scalars.

Written with ``torch.utils.tensorboard.SummaryWriter`` (the ``tensorboard`` package, an optional
dependency) from the lines :mod:`.history` appends to ``rounds.jsonl``; the step is the round. Tags:

=================================== ======================================================
``train/loss``                      sample-weighted mean training loss of the round
``train/samples``                   samples the swarm processed in the round
``train/throughput_samples_per_s``  the round's summed throughput of the peers (samples/s)
``swarm/peers_online``              peers online when the round was written
``swarm/contributors``              peers that reported samples for the round
``traffic/cross_cohort_bytes``      all-reduce bytes between cohorts so far (wide-area)
``validation/<metric>/largest``     the metric (``accuracy``, ``epe``) of the largest
``validation/<metric>/smallest``    and smallest sub-network of the round's checkpoint
=================================== ======================================================
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

__all__ = ["TensorBoardError", "TensorBoardLog", "check_available"]

ROUND_TAGS = {
    "loss": "train/loss",
    "samples": "train/samples",
    "throughput": "train/throughput_samples_per_s",
    "peers_online": "swarm/peers_online",
    "contributors": "swarm/contributors",
    "cross_cohort_bytes": "traffic/cross_cohort_bytes",
}


class TensorBoardError(ValueError):
    """``--tensorboard`` cannot be served: the package is missing or the directory unusable (one line)."""


def check_available() -> None:
    """TensorBoardError unless the ``tensorboard`` package can be imported (checked without importing)."""
    if importlib.util.find_spec("tensorboard") is None:
        raise TensorBoardError("--tensorboard needs the tensorboard package: pip install tensorboard")


class TensorBoardLog:
    """An event file in ``directory`` (created if missing); TensorBoardError if it cannot be."""

    def __init__(self, directory: Path, flush_seconds: float = 10.0):
        check_available()
        from torch.utils.tensorboard import SummaryWriter

        self.directory = Path(directory)
        try:
            self.writer = SummaryWriter(log_dir=str(self.directory), flush_secs=flush_seconds)
        except OSError as e:
            raise TensorBoardError(f"--tensorboard {directory}: {e.strerror or e}") from None

    def round(self, line: dict[str, Any]) -> None:
        """The scalars of a ``kind: round`` line of the history (a value of None is left out)."""
        for key, tag in ROUND_TAGS.items():
            if line.get(key) is not None:
                self.writer.add_scalar(tag, float(line[key]), int(line["round"]), walltime=line.get("time"))

    def validation(self, line: dict[str, Any]) -> None:
        """The largest and smallest sub-network's metric of a ``kind: validation`` line."""
        result = line["validation"]
        for subnet in ("largest", "smallest"):
            if result.get(subnet) is not None:
                self.writer.add_scalar(
                    f"validation/{result['metric']}/{subnet}",
                    float(result[subnet]),
                    int(line["round"]),
                    walltime=line.get("time"),
                )

    def close(self) -> None:
        self.writer.flush()
        self.writer.close()
