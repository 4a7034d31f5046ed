"""A task file's values are type- and range-checked before anything is signed or written: one line
each, from the real parser and the real models."""

from __future__ import annotations

import pytest

from aggregator.task_publication import TaskFileError, build_task_spec, read_task_document
from protocol.identity import Identity

HEADER = '[task]\nname = "digits"\nid = "checked"\n'


@pytest.mark.parametrize(
    "toml, says",
    [
        ("swarm = 3\n" + HEADER, r"\[swarm\] must be a table, got int"),
        ('data = "x"\n' + HEADER, r"\[data\] must be a table, got str"),
        ("task = 1\n", r"\[task\] must be a table, got int"),
        (HEADER + '[swarm]\nlearning_rate = "1e999"\n', r"learning_rate: 1e999 is not in \(0, 100\]"),
        (HEADER + '[swarm]\nlearning_rate = "0"\n', r"learning_rate: 0 is not in \(0, 100\]"),
        (HEADER + '[swarm]\nwidth_mult = "0"\n', r"width_mult: 0 is not in \(0, 4\]"),
        (HEADER + '[swarm]\nwidth_mult = "1e9"\n', r"width_mult: 1e9 is not in \(0, 4\]"),
        (HEADER + '[swarm]\nsync = "outer"\nouter_lr = "1e999"\n', r"outer_lr: 1e999 is not in \(0, 100\]"),
        (
            '[task]\nname = "digits"\nid = "a/../../x"\n',
            r"task_id 'a/../../x' may not contain '\.\.' segments",
        ),
        ('[task]\nname = "digits"\nid = "../x"\n', r"task setting task_id"),
    ],
    ids=[
        "swarm-int",
        "data-str",
        "task-int",
        "lr-inf",
        "lr-zero",
        "width-zero",
        "width-huge",
        "outer-lr",
        "climb",
        "dot",
    ],
)
def test_a_bad_value_is_one_line_before_anything_is_signed(tmp_path, toml, says):
    path = tmp_path / "task.toml"
    path.write_text(toml)
    with pytest.raises(TaskFileError, match=says) as err:
        read_task_document(str(path))
        build_task_spec(str(path), Identity.generate())
    assert "\n" not in str(err.value)
    assert list(tmp_path.iterdir()) == [path]


def test_the_defaults_still_build(tmp_path):
    path = tmp_path / "task.toml"
    path.write_text(HEADER)
    spec = build_task_spec(str(path), Identity.generate())
    assert spec.task_id == "checked" and float(spec.params.learning_rate) > 0
