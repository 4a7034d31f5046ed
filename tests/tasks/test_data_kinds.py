"""The operator-data kinds are declared once (protocol.shards.DATA_KINDS); every per-kind table and
list elsewhere covers exactly those kinds."""

from __future__ import annotations

import re
import typing

import pytest

from protocol.shards import DATA_KINDS, DataKind, DataSpec
from protocol.task_spec import BUILTIN_TASKS
from tasks import available_tasks
from tasks.shards.dataset import FORMAT_PREFIXES, TASK_OPTIONS
from tasks.shards.pack import SOURCES


def test_the_kinds_are_the_literal_a_data_spec_accepts():
    assert DATA_KINDS == typing.get_args(DataKind)
    assert len(set(DATA_KINDS)) == len(DATA_KINDS)
    assert typing.get_args(DataSpec.model_fields["kind"].annotation) == DATA_KINDS


def test_every_kind_is_a_built_in_task():
    assert set(DATA_KINDS) <= set(available_tasks())


def test_the_protocol_names_exactly_the_built_in_tasks():
    # Commands check --task against BUILTIN_TASKS before torch is loaded; tasks.registry builds them.
    assert list(BUILTIN_TASKS) == available_tasks()


@pytest.mark.parametrize(
    "table", [SOURCES, TASK_OPTIONS, FORMAT_PREFIXES], ids=["SOURCES", "TASK_OPTIONS", "FORMAT_PREFIXES"]
)
def test_every_per_kind_table_covers_exactly_the_kinds(table):
    assert tuple(table) == DATA_KINDS


def test_each_kind_is_listed_by_a_source_of_that_kind():
    for kind, lister in SOURCES.items():
        assert typing.get_type_hints(lister)["return"].kind == kind


def test_manta_swarm_names_the_kinds_in_its_data_help():
    from testbed.cli import main

    (data,) = [p for p in main.params if p.name == "data_path"]
    named = re.search(r"\(tasks ([^)]*)\)", data.help)
    assert named is not None and tuple(named.group(1).split(", ")) == DATA_KINDS, data.help
