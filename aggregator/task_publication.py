"""From `--task NAME|PATH.toml` to a sealed TaskSpec, and keeping it alive in the DHT.

A built-in task name gets defaults sized for this project's CPUs; a TOML file may set every field:

    [task]
    id = "digits-demo"     # task id (default: the task name)
    name = "digits"        # built-in task (see `tasks.available_tasks()`)
    mode = "data"          # "data" or "model" parallel
    seed = 0
    [swarm]                # any SwarmParams field; the rest keep their defaults
    target_samples_per_round = 1024
    learning_rate = "0.05"
    total_rounds = 300         # length of the LR schedule and of the progressive-shrinking phases
    width_mult = "0.5"         # supernet size (classification)
    cross_cohort_fp16 = true   # fp16 between cohorts
    cross_group_size = 8       # cohort leaders per cross-cohort group (more cohorts: a tree of groups)
    sync = "outer"             # "every-step" (default) or rare outer steps between cohorts:
    inner_steps = 5            #   rounds (inner steps, averaged inside each cohort) per outer step
    outer_lr = "1.0"           #   outer Nesterov SGD on the averaged pseudo-gradient (1.0 / 0:
    outer_momentum = "0.0"     #   the cohorts' mean; DiLoCo's 0.7 / 0.9 for hundreds of inner steps)
    outer_compression = "int8" #   none, fp16, int8 or int4 between cohorts, with error feedback
"""

from __future__ import annotations

import time
import tomllib
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from protocol.identity import Identity
from protocol.records import RecordRejected, SwarmParams, TaskSpec, open_sealed
from supernet.workload import swarm_train_options, train_config
from tasks import available_tasks

DEFAULT_SWARM = dict(
    target_samples_per_round=1024,
    subnets_per_step=4,
    batch_size=64,
    max_group_size=4,
    round_timeout_ms=120_000,
    receipt_window_ms=600_000,
    learning_rate="0.05",
)


class TaskFileError(ValueError):
    """The task reference or file is not usable (one line for the operator)."""


def build_task_spec(ref: str, identity: Identity, extra_aggregator_keys: tuple[str, ...] = ()) -> TaskSpec:
    """A TaskSpec for a built-in task name or a TOML file, signed-for by ``identity``."""

    path = Path(ref)
    if path.suffix == ".toml" or path.exists():
        if not path.is_file():
            raise TaskFileError(f"task file {ref} does not exist")
        try:
            doc = tomllib.loads(path.read_text())
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            raise TaskFileError(f"task file {ref} is not valid TOML: {e}") from None
    else:
        doc = {"task": {"name": ref}}
    unknown = set(doc) - {"task", "swarm"}
    if unknown:
        raise TaskFileError(f"task file has unknown section(s): {', '.join(sorted(unknown))}")
    task: dict[str, Any] = dict(doc.get("task", {}))
    name = task.pop("name", None)
    if name not in available_tasks():
        raise TaskFileError(f"unknown task {name!r}; built-in tasks: {', '.join(available_tasks())}")
    task_id = task.pop("id", name)
    mode, seed = task.pop("mode", "data"), task.pop("seed", 0)
    if task:
        raise TaskFileError(f"[task] has unknown key(s): {', '.join(sorted(task))}")
    try:
        params = SwarmParams(**{**DEFAULT_SWARM, **doc.get("swarm", {})})
        spec = TaskSpec(
            task_id=task_id,
            task=name,
            mode=mode,
            seed=seed,
            params=params,
            aggregator_keys=(identity.public_key_hex, *extra_aggregator_keys),
            ledger_origin=f"manta/{task_id}",
            timestamp=int(time.time() * 1000),
        )
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        message = err["msg"].removeprefix("Value error, ")  # a check across settings names its own
        raise TaskFileError(
            f"task setting {where}: {message}" if where else f"task setting {message}"
        ) from None
    _check_trainable(spec)
    return spec


def _check_trainable(spec: TaskSpec) -> None:
    """Refuse settings the supernet cannot train with (e.g. warm-up longer than the schedule) here,
    with one line, instead of in every volunteer's worker."""

    try:
        train_config(spec.task, swarm_train_options(spec))
    except ValueError as e:
        raise TaskFileError(f"task setting {e}") from None


def saved_task_spec(data_dir: Path, task_ref: str | None = None) -> TaskSpec:
    """The spec an earlier run in ``data_dir`` published (for ``--resume``); if ``task_ref`` is given,
    it must name the same task (a built-in name, a task id, or a TOML file with the same id)."""

    path = Path(data_dir) / "task.sealed"
    if not path.is_file():
        raise TaskFileError(f"{data_dir} holds no earlier run to resume (no task.sealed)")
    try:
        spec = open_sealed(path.read_bytes(), TaskSpec).record
    except RecordRejected as e:
        raise TaskFileError(f"{path} is not a valid sealed task: {e}") from None
    if task_ref is not None:
        ref = Path(task_ref)
        if ref.suffix == ".toml" and ref.is_file():
            doc = tomllib.loads(ref.read_text()).get("task", {})
            names = {doc.get("id", doc.get("name"))}
        else:
            names = {task_ref}
        if not names & {spec.task_id, spec.task}:
            raise TaskFileError(f"{data_dir} holds a run of task {spec.task_id!r}, not {task_ref!r}")
    return spec
