"""The documents that list the code's settings stay true to the code.

- docs/operator.md's task-file table names every key the task file takes, and only those, with the
  default the code that reads the file (``aggregator.task_publication.build_task_spec``) gives a
  file that leaves it out; a file that sets every key to its documented default reads the same.
- docs/reference.md's command-line section is what ``scripts/cli_reference.py`` generates from the
  real click commands (run ``scripts/cli_reference.py --write`` after changing an option).
- docs/reference.md names every ``MANTA_*`` environment variable the code reads and every
  ``/metrics`` name the dashboard serves.

Torch is imported inside the tests that need it (the task file's code and ``manta-search``), not at
module import.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
OPERATOR = ROOT / "docs" / "operator.md"
REFERENCE = ROOT / "docs" / "reference.md"

# The task table's default cell: a TOML literal in backticks, or one of these phrases.
REQUIRED, UNSET, TASK_NAME = "(required)", "(none)", "(the task's name)"
TASK_KEYS = {"name": "task", "id": "task_id", "mode": "mode", "seed": "seed"}  # [task] key -> TaskSpec field
# TaskSpec fields no [task] key sets: [swarm] and [data] fill two, the aggregator the rest.
NOT_FROM_TASK_SECTION = {"params", "data", "aggregator_keys", "ledger_origin", "timestamp"}


def task_table() -> dict[str, dict[str, str]]:
    """section ("task", "swarm", "data") -> key -> default cell, from docs/operator.md's task-file table."""
    rows: dict[str, dict[str, str]] = {}
    row = re.compile(r"^\| `\[(\w+)\]` \| `(\w+)` \| ([^|]+) \|")
    for line in OPERATOR.read_text().splitlines():
        found = row.match(line)
        if found:
            section, key, default = found.group(1), found.group(2), found.group(3).strip()
            assert key not in rows.get(section, {}), f"[{section}] {key} is listed twice"
            rows.setdefault(section, {})[key] = default
    assert set(rows) == {"task", "swarm", "data"}, f"sections found in the table: {sorted(rows)}"
    return rows


def toml_value(cell: str) -> Any:
    """The value a backticked TOML literal cell stands for."""
    assert cell.startswith("`") and cell.endswith("`"), f"not a TOML literal in backticks: {cell}"
    return tomllib.loads(f"v = {cell[1:-1]}")["v"]


def build(tmp_path: Path, text: str, capture: list | None = None):
    """The TaskSpec the aggregator builds from task file ``text``. With ``capture``, a task on own
    data stops at packing, after appending the DataRequest the file gave."""
    from aggregator.task_publication import TaskFileError, build_task_spec
    from protocol.identity import Identity

    def pack(task_id, seed, request):
        capture.append(request)
        raise TaskFileError("stopped before packing (test)")

    path = tmp_path / f"task-{len(list(tmp_path.iterdir()))}.toml"
    path.write_text(text)
    return build_task_spec(str(path), Identity.generate(), pack_data=pack if capture is not None else None)


def test_the_task_table_names_every_key_of_the_task_file_and_only_those():
    from aggregator.task_data import DataRequest
    from protocol.task_spec import SwarmParams, TaskSpec

    table = task_table()
    assert set(table["swarm"]) == set(SwarmParams.model_fields), "[swarm] keys differ from SwarmParams"
    data_keys = {f.name for f in dataclasses.fields(DataRequest)} - {"kind"}  # kind is [task] name
    assert set(table["data"]) == data_keys, "[data] keys differ from DataRequest"
    assert set(table["task"]) == set(TASK_KEYS)
    unclassified = set(TaskSpec.model_fields) - set(TASK_KEYS.values()) - NOT_FROM_TASK_SECTION
    assert not unclassified, f"TaskSpec fields the table does not account for: {sorted(unclassified)}"


def test_the_task_tables_defaults_are_the_codes(tmp_path):
    from aggregator.task_publication import TaskFileError

    table = task_table()
    spec = build(tmp_path, '[task]\nname = "digits"\n')
    params = spec.params.model_dump(mode="json")
    for key, cell in table["swarm"].items():
        assert toml_value(cell) == params[key], (
            f"[swarm] {key}: documented {cell}, the code gives {params[key]!r}"
        )

    for key, field in TASK_KEYS.items():
        cell, value = table["task"][key], getattr(spec, field)
        if cell == REQUIRED:
            with pytest.raises(TaskFileError, match="unknown task"):
                build(tmp_path, "[task]\n")
        elif cell == TASK_NAME:
            assert value == spec.task == "digits", f"[task] {key}"
        else:
            assert toml_value(cell) == value, f"[task] {key}: documented {cell}, the code gives {value!r}"

    requests: list = []
    with pytest.raises(TaskFileError, match="stopped before packing"):
        build(tmp_path, '[task]\nname = "imagefolder"\n[data]\npath = "/srv/images"\n', requests)
    (request,) = requests
    for key, cell in table["data"].items():
        value = getattr(request, key)
        if cell == REQUIRED:
            with pytest.raises(TaskFileError, match=f"needs {key}"):
                build(tmp_path, '[task]\nname = "imagefolder"\n[data]\n', [])
        elif cell == UNSET:
            assert value is None, f"[data] {key}: documented unset, the code gives {value!r}"
        else:
            assert toml_value(cell) == value, f"[data] {key}: documented {cell}, the code gives {value!r}"


def test_a_task_file_that_writes_every_documented_default_reads_as_one_that_writes_none(tmp_path):
    from aggregator.task_publication import TaskFileError

    table = task_table()
    written = {
        section: {k: c for k, c in keys.items() if c not in (REQUIRED, UNSET, TASK_NAME)}
        for section, keys in table.items()
    }
    task = "".join(f"{k} = {c[1:-1]}\n" for k, c in written["task"].items())
    swarm = "".join(f"{k} = {c[1:-1]}\n" for k, c in written["swarm"].items())
    full = build(tmp_path, f'[task]\nname = "digits"\n{task}[swarm]\n{swarm}')
    bare = build(tmp_path, '[task]\nname = "digits"\n')
    assert full.params == bare.params and (full.task_id, full.mode, full.seed) == (
        bare.task_id,
        bare.mode,
        bare.seed,
    )

    data = "".join(f"{k} = {c[1:-1]}\n" for k, c in written["data"].items())
    got: list = []
    for extra in (data, ""):
        with pytest.raises(TaskFileError, match="stopped before packing"):
            build(tmp_path, f'[task]\nname = "imagefolder"\n[data]\npath = "/srv/images"\n{extra}', got)
    assert got[0] == got[1]
    unknown = "no_such_setting = 1\n"
    for text in (
        f'[task]\nname = "digits"\n{unknown}',
        f'[task]\nname = "digits"\n[swarm]\n{unknown}',
        f'[task]\nname = "imagefolder"\n[data]\npath = "/srv/images"\n{unknown}',
    ):
        with pytest.raises(TaskFileError, match="no_such_setting"):
            build(tmp_path, text, [])


def _cli_reference():
    spec = importlib.util.spec_from_file_location("cli_reference", ROOT / "scripts" / "cli_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_command_line_reference_is_what_the_commands_say():
    cli_reference = _cli_reference()
    documented = cli_reference.section_in(REFERENCE.read_text())
    assert documented == cli_reference.render(), (
        "docs/reference.md's command-line section differs from the commands: "
        "run .venv/bin/python scripts/cli_reference.py --write"
    )


def _source_files() -> list[Path]:
    files = [ROOT / "Makefile", *sorted((ROOT / "scripts").glob("*.sh"))]
    for package in ("aggregator", "console", "hivemind_adapter", "ledger", "peer", "protocol"):
        files += sorted((ROOT / package).rglob("*.py"))
    for package in ("supernet", "tasks", "testbed", "tests"):
        files += sorted((ROOT / package).rglob("*.py"))
    return files


def test_every_environment_variable_the_code_reads_is_documented():
    reads = re.compile(r"\b(MANTA_[A-Z_]+|HIVEMIND_[A-Z_]+)\b")
    names = {n for path in _source_files() if path != Path(__file__) for n in reads.findall(path.read_text())}
    text = REFERENCE.read_text()
    missing = sorted(n for n in names if f"`{n}`" not in text)
    assert not missing, f"docs/reference.md does not name {missing}"


def test_every_dashboard_metric_is_documented():
    source = (ROOT / "aggregator" / "monitor" / "metrics.py").read_text()
    names = set(re.findall(r'"(manta_[a-z_]+)"', source))
    assert len(names) > 20, "the metric names are no longer written as string literals here"
    text = REFERENCE.read_text()
    missing = sorted(n for n in names if f"`{n}`" not in text)
    assert not missing, f"docs/reference.md does not name {missing}"
