"""The training task an aggregator publishes (:class:`TaskSpec`, ``manta/task/v1``) and the settings
every peer of it must agree on (:class:`SwarmParams`).

Units as in every record: timestamps are Unix milliseconds (int), fractional settings are decimal
strings (``learning_rate``), keys are lowercase hex.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field, model_validator

from protocol.canonical import MAX_SAFE_INTEGER
from protocol.fields import Decimal, Hex32, Int53, Name, Origin, StrictModel
from protocol.sealing import SealedRecord
from protocol.shards import DataSpec

__all__ = ["BUILTIN_TASKS", "SwarmParams", "TaskSpec"]

BUILTIN_TASKS = ("cifar10", "digits", "imagefolder", "stereo-folder", "stereo-synthetic")
"""The built-in tasks (``tasks.available_tasks()``, which loads torch): named here so that a command
refuses an unknown one before loading it."""


MAX_LEARNING_RATE = 100.0  # a bound far above any that trains, far below overflow
MAX_WIDTH_MULT = 4.0  # the widest supernet a volunteer's machine is asked to hold


class SwarmParams(StrictModel):
    """What every peer of a task must agree on. New settings are added here (a new TaskSpec version).

    ValidationError unless ``outer_lr`` > 0 and 0 <= ``outer_momentum`` < 1.
    """

    target_samples_per_round: Annotated[int, Field(ge=1, le=MAX_SAFE_INTEGER)]
    subnets_per_step: Annotated[int, Field(ge=1, le=64)]  # K sub-networks sampled per step
    batch_size: Annotated[int, Field(ge=1, le=1 << 20)]  # per peer, per step
    max_group_size: Annotated[int, Field(ge=1, le=256)]  # all-reduce group size
    round_timeout_ms: Annotated[int, Field(ge=1, le=MAX_SAFE_INTEGER)]
    receipt_window_ms: Annotated[int, Field(ge=1, le=MAX_SAFE_INTEGER)]  # how old a receipt may be
    learning_rate: Decimal
    # fp16 on the wire between cohorts; the same for every peer, since every member of an exact
    # all-reduce must receive the same bytes.
    cross_cohort_fp16: bool = False
    # Robust averaging (hivemind_adapter.robust_reduce): every all-reduce reducer takes CenteredClip
    # of its senders' parts, and names the senders it clipped or dropped in the commit.
    robust_averaging: bool = True
    # Cohort leaders per cross-cohort all-reduce group: more cohorts than this average up a tree of
    # such groups (peer/averaging/cross_tree.py).
    cross_group_size: Annotated[int, Field(ge=2, le=256)] = 8
    # The schedule: learning rate (warm-up + cosine) and progressive-shrinking phases follow the round
    # number over ``total_rounds``; rounds past it keep the last phase and the final learning rate.
    total_rounds: Annotated[int, Field(ge=1, le=MAX_SAFE_INTEGER)] = 1000
    warmup_rounds: Annotated[int, Field(ge=0, le=MAX_SAFE_INTEGER)] = 0
    schedule: Literal["sandwich", "progressive"] = "sandwich"
    # Supernet size (see supernet.training.config.TrainConfig).
    width_mult: Decimal = "1.0"
    head_channels: Annotated[int, Field(ge=8, le=1 << 16)] = 640
    # How cohorts synchronise (peer/outer_step.py). "every-step": every round's gradient is averaged
    # across the whole swarm. "outer": rounds average inside each cohort only; every ``inner_steps``
    # rounds the cohorts average their pseudo-gradients (parameters at the last outer step minus
    # parameters now), sent through ``outer_compression`` with error feedback, and every peer applies
    # the same outer Nesterov step (``outer_lr``, ``outer_momentum``). For the defaults, see
    # benchmarks/RESULTS.md, "Outer steps between cohorts".
    sync: Literal["every-step", "outer"] = "every-step"
    # What decides a round (docs/protocol.md): "board", a quorum of reports on the swarm's commit
    # board; "certificates", signed votes relayed among cohorts (an every-step task's rounds).
    commit: Literal["board", "certificates"] = "board"
    inner_steps: Annotated[int, Field(ge=1, le=100_000)] = 5
    outer_lr: Decimal = "1.0"
    outer_momentum: Decimal = "0.0"
    outer_compression: Literal["none", "fp16", "int8", "int4"] = "int8"
    # the exchange runs while the next inner steps compute; its step lands one outer period late
    outer_overlap: bool = True

    @model_validator(mode="after")
    def _outer_step_settings(self) -> SwarmParams:
        if not 0 < float(self.learning_rate) <= MAX_LEARNING_RATE:
            raise ValueError(f"learning_rate: {self.learning_rate} is not in (0, {MAX_LEARNING_RATE:g}]")
        if not 0 < float(self.width_mult) <= MAX_WIDTH_MULT:
            raise ValueError(f"width_mult: {self.width_mult} is not in (0, {MAX_WIDTH_MULT:g}]")
        if not 0 < float(self.outer_lr) <= MAX_LEARNING_RATE:
            raise ValueError(f"outer_lr: {self.outer_lr} is not in (0, {MAX_LEARNING_RATE:g}]")
        if not 0 <= float(self.outer_momentum) < 1:
            raise ValueError(f"outer_momentum: {self.outer_momentum} is not in [0, 1)")
        return self


class TaskSpec(SealedRecord):
    """The training task an aggregator publishes; sealed by one of its ``aggregator_keys``."""

    RECORD_TYPE: ClassVar[str] = "task"

    task_id: Name
    task: Name  # built-in task name (see ``tasks/``)
    mode: Literal["data", "model"]
    seed: Int53
    params: SwarmParams
    aggregator_keys: Annotated[tuple[Hex32, ...], Field(min_length=1, max_length=16)]
    ledger_origin: Origin  # the origin line of the task's ledger checkpoints
    timestamp: Int53
    # the operator's own dataset, packed into content-addressed shards (None: a built-in task's data,
    # which every peer makes or ships itself)
    data: DataSpec | None = None

    @model_validator(mode="after")
    def _task_id_is_no_path(self) -> TaskSpec:
        # it names directories (an aggregator's default data dir): no segment may climb out of one
        if ".." in self.task_id.split("/") or self.task_id.endswith("/"):
            raise ValueError(f"task_id {self.task_id!r} may not contain '..' segments or end with '/'")
        return self

    def signer_allowed(self, public_key: bytes) -> bool:
        """Whether ``public_key`` is one of the task's ``aggregator_keys``."""
        return public_key.hex() in self.aggregator_keys
