"""From `--task NAME|PATH.toml` to a sealed TaskSpec, and keeping it alive in the DHT.

A built-in task name gets defaults sized for this project's CPUs; a TOML file may set every field:

    [task]
    id = "digits-demo"     # task id (default: the task name)
    name = "digits"        # built-in task (protocol.task_spec.BUILTIN_TASKS)
    mode = "data"          # "data" or "model" parallel
    seed = 0
    [swarm]                # any SwarmParams field; the rest keep their defaults
    target_samples_per_round = 1024
    learning_rate = "0.05"
    total_rounds = 300         # length of the LR schedule and of the progressive-shrinking phases
    width_mult = "0.5"         # supernet size (classification)
    cross_cohort_fp16 = true   # fp16 between cohorts
    robust_averaging = true    # CenteredClip in every all-reduce (default; false: plain means)
    cross_group_size = 8       # cohort leaders per cross-cohort group (more cohorts: a tree of groups)
    sync = "outer"             # "every-step" (default) or rare outer steps between cohorts:
    inner_steps = 5            #   rounds (inner steps, averaged inside each cohort) per outer step
    outer_lr = "1.0"           #   outer Nesterov SGD on the averaged pseudo-gradient (1.0 / 0:
    outer_momentum = "0.0"     #   the cohorts' mean; DiLoCo's 0.7 / 0.9 for hundreds of inner steps)
    outer_compression = "int8" #   none, fp16, int8 or int4 between cohorts, with error feedback
    commit = "certificates"    # what decides a round: "board" (default) or signed votes relayed
                               #   among cohorts (docs/protocol.md, "Commit certificates")

A task on the operator's own data names its kind in ``[task] name`` (one of
:data:`protocol.shards.DATA_KINDS`) and where the data lies on this machine in ``[data]``; the
aggregator packs it once into content-addressed shards that the swarm serves (:mod:`tasks.shards`),
and signs their Merkle root into the task:

    [data]
    path = "/srv/data/cifar"   # on the aggregator's machine; volunteers never need it
    layout = "kitti2015"       # stereo-folder: kitti2015, kitti2012, sceneflow or middlebury
    val_fraction = 0.1         # held out for validation where the layout has no split of its own
    shard_samples = 500        # samples per shard
    crop = [256, 512]          # stereo-folder: the training crop (default: the largest multiple of 64)
"""

from __future__ import annotations

import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from protocol.identity import Identity
from protocol.sealing import RecordRejected, open_sealed
from protocol.shards import DATA_KINDS, DataKind, DataSpec
from protocol.task_spec import BUILTIN_TASKS, SwarmParams, TaskSpec

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


@dataclass(frozen=True)
class DataRequest:
    """A task file's ``[data]`` section: what to pack, and how."""

    kind: DataKind
    path: Path
    layout: str | None = None
    val_fraction: float = 0.1
    shard_samples: int = 500
    crop: tuple[int, int] | None = None


# (task id, seed, what to pack) -> the signed description of the packed shards
PackData = Callable[[str, int, DataRequest], DataSpec]


def _data_request(name: str, section: dict[str, Any] | None) -> DataRequest | None:
    if section is None:
        if name in DATA_KINDS:
            raise TaskFileError(
                f"task {name!r} trains on your own data: give a task file with a [data] section "
                'naming its folder (path = "/srv/data/...")'
            )
        return None
    if name not in DATA_KINDS:
        raise TaskFileError(f"[data] is for tasks on your own data ({', '.join(DATA_KINDS)}), not {name!r}")
    section = dict(section)
    path = section.pop("path", None)
    if not isinstance(path, str) or not path:
        raise TaskFileError('[data] needs path = "<folder on this machine>"')
    layout = section.pop("layout", None)
    val_fraction = section.pop("val_fraction", 0.1)
    shard_samples = section.pop("shard_samples", 500)
    crop = section.pop("crop", None)
    if section:
        raise TaskFileError(f"[data] has unknown key(s): {', '.join(sorted(section))}")
    if layout is not None and not isinstance(layout, str):
        raise TaskFileError(f"[data] layout: need a string, got {layout!r}")
    if (
        isinstance(val_fraction, bool)
        or not isinstance(val_fraction, (int, float))
        or not 0 < val_fraction < 1
    ):
        raise TaskFileError(f"[data] val_fraction: need a number between 0 and 1, got {val_fraction!r}")
    if (
        isinstance(shard_samples, bool)
        or not isinstance(shard_samples, int)
        or not 1 <= shard_samples <= 1 << 20
    ):
        raise TaskFileError(f"[data] shard_samples: need a positive integer, got {shard_samples!r}")
    if crop is not None:
        if (
            not isinstance(crop, list)
            or len(crop) != 2
            or not all(isinstance(c, int) and not isinstance(c, bool) and c > 0 for c in crop)
        ):
            raise TaskFileError(f"[data] crop: need [height, width] in pixels, got {crop!r}")
        crop = (crop[0], crop[1])
    return DataRequest(name, Path(path).expanduser(), layout, float(val_fraction), shard_samples, crop)


def read_task_document(ref: str) -> dict[str, Any]:
    """The task file ``ref`` as a TOML document, or ``{"task": {"name": ref}}`` for a built-in name.
    TaskFileError (one line) for a missing or malformed file, an unknown section or task name; the
    rest is checked by :func:`build_task_spec`. Needs no torch: a command calls it before loading it."""
    path = Path(ref)
    if path.suffix == ".toml" or path.exists():
        if not path.is_file():
            raise TaskFileError(f"task file {ref} does not exist")
        try:
            doc = tomllib.loads(path.read_text())
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            raise TaskFileError(f"task file {ref} is not valid TOML: {e}") from None
        except OSError as e:
            raise TaskFileError(f"task file {ref}: {e.strerror or e}") from None
    else:
        doc = {"task": {"name": ref}}
    unknown = set(doc) - {"task", "swarm", "data", "membership"}
    if unknown:
        raise TaskFileError(f"task file has unknown section(s): {', '.join(sorted(unknown))}")
    for section in ("task", "swarm", "data", "membership"):
        if not isinstance(doc.get(section, {}), dict):
            raise TaskFileError(f"task file: [{section}] must be a table, got {type(doc[section]).__name__}")
    name = doc.get("task", {}).get("name")
    if name not in BUILTIN_TASKS:
        raise TaskFileError(f"unknown task {name!r}; built-in tasks: {', '.join(BUILTIN_TASKS)}")
    return doc


def build_task_spec(
    ref: str,
    identity: Identity,
    extra_aggregator_keys: tuple[str, ...] = (),
    pack_data: PackData | None = None,
) -> TaskSpec:
    """A TaskSpec for a built-in task name or a TOML file, signed-for by ``identity``. A task on the
    operator's own data is packed by ``pack_data`` (which raises TaskFileError if it cannot) before
    anything is signed. TaskFileError (one line) for an unknown task, section, key or setting."""

    doc = read_task_document(ref)
    task: dict[str, Any] = dict(doc.get("task", {}))
    name = task.pop("name", None)
    task_id = task.pop("id", name)
    mode, seed = task.pop("mode", "data"), task.pop("seed", 0)
    if task:
        raise TaskFileError(f"[task] has unknown key(s): {', '.join(sorted(task))}")
    request = _data_request(name, doc.get("data"))
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
        _check_trainable(spec)  # before packing: a bad setting fails in a second, not after the data
        if request is not None:
            if pack_data is None:
                raise TaskFileError(f"task {name!r} needs its data packed, and nothing here packs it")
            data = pack_data(task_id, seed, request)
            if not isinstance(data, DataSpec):
                raise TypeError(f"pack_data returned {type(data).__name__}, not a DataSpec")
            spec = spec.model_copy(update={"data": data})  # data is a validated record itself
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        message = err["msg"].removeprefix("Value error, ")  # a check across settings names its own
        raise TaskFileError(
            f"task setting {where}: {message}" if where else f"task setting {message}"
        ) from None
    return spec


def _check_trainable(spec: TaskSpec) -> None:
    """Refuse settings the supernet cannot train with (e.g. warm-up longer than the schedule) here,
    with one line, instead of in every volunteer's worker."""
    from supernet.workload import swarm_train_options, train_config  # loads torch

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
