"""SubnetConfig (immutability, JSON, hash, validation), SearchSpace and the sandwich rule."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import rfc8785
import torch

from supernet import SearchSpace, SubnetConfig, sandwich_configs

SPACE = SearchSpace()

# The hash of the default largest config: receipts carry these, so the encoding must never drift.
LARGEST_HASH = "8361600d2dcc232de412e77afab7adebcf3bb82434d8eabbe20699c6ddb5a6dc"


def test_default_space_is_the_once_for_all_space():
    assert SPACE.kernel_sizes == (3, 5, 7)
    assert SPACE.expand_ratios == (3, 4, 6)
    assert SPACE.depths == (2, 3, 4)
    assert SPACE.num_units == 5
    assert SPACE.size() == (9**2 + 9**3 + 9**4) ** 5


def test_config_is_immutable_and_hashable():
    cfg = SPACE.largest()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.depths = (2, 2, 2, 2, 2)
    assert isinstance(cfg.kernel_sizes, tuple) and isinstance(cfg.kernel_sizes[0], tuple)
    assert len({cfg, SPACE.largest(), SPACE.smallest()}) == 2


def test_json_round_trip_and_hash_is_sha256_of_canonical_json():
    rng = random.Random(5)
    for _ in range(20):
        cfg = SPACE.sample(rng)
        text = cfg.to_json()
        back = SubnetConfig.from_json(text, SPACE)
        assert back == cfg and back.hash == cfg.hash
        assert cfg.hash == hashlib.sha256(rfc8785.dumps(json.loads(text))).hexdigest()
        # key order and whitespace of the input do not matter
        shuffled = json.dumps(dict(reversed(list(json.loads(text).items()))), indent=2)
        assert SubnetConfig.from_json(shuffled).hash == cfg.hash
    assert SPACE.largest().hash == LARGEST_HASH


def test_lists_and_integral_floats_normalise():
    cfg = SubnetConfig([2], [[3, 5]], [[3.0, 4.5]])
    assert cfg.depths == (2,) and cfg.expand_ratios == ((3, 4.5),)
    assert isinstance(cfg.expand_ratios[0][0], int)
    assert cfg.hash == SubnetConfig((2,), ((3, 5),), ((3, 4.5),)).hash


def _with(cfg: SubnetConfig, **changes) -> dict:
    data = cfg.to_dict()
    data.update(changes)
    return data


@pytest.mark.parametrize(
    "mutate, field",
    [
        (lambda d: d["kernel_sizes"][1].__setitem__(0, 4), "kernel_sizes[1][0]"),
        (lambda d: d["expand_ratios"][0].__setitem__(1, 5), "expand_ratios[0][1]"),
        (lambda d: d.update(depths=[9, 2, 2, 2, 2], kernel_sizes=[[3] * 9] + [[3] * 2] * 4,
                            expand_ratios=[[3] * 9] + [[3] * 2] * 4), "depths[0]"),
        (lambda d: [d[k].pop() for k in ("depths", "kernel_sizes", "expand_ratios")], "depths"),
    ],
    ids=["kernel-4", "expand-5", "depth-9", "four-units"],
)  # fmt: skip
def test_invalid_values_raise_value_error_naming_the_field(mutate, field):
    data = SPACE.smallest().to_dict()
    mutate(data)
    cfg = SubnetConfig.from_dict(data)  # structurally fine
    with pytest.raises(ValueError) as err:
        SPACE.validate(cfg)
    assert str(err.value).startswith(field)
    with pytest.raises(ValueError, match=r"^" + field.replace("[", r"\[").replace("]", r"\]")):
        SubnetConfig.from_json(json.dumps(data), SPACE)


@pytest.mark.parametrize(
    "data, field",
    [
        ({"depths": [2], "kernel_sizes": [[3]], "expand_ratios": [[3, 3]]}, "kernel_sizes[0]"),
        ({"depths": [2, 2], "kernel_sizes": [[3, 3]], "expand_ratios": [[3, 3]]}, "kernel_sizes"),
        ({"depths": [2], "kernel_sizes": [[3, "x"]], "expand_ratios": [[3, 3]]}, "kernel_sizes[0][1]"),
        ({"depths": [True], "kernel_sizes": [[3]], "expand_ratios": [[3]]}, "depths[0]"),
        ({"depths": [0], "kernel_sizes": [[]], "expand_ratios": [[]]}, "depths[0]"),
        ({"depths": [1], "kernel_sizes": [[3]]}, "expand_ratios"),
        ({"depths": [1], "kernel_sizes": [[3]], "expand_ratios": [[3]], "width": 2}, "width"),
    ],
)
def test_malformed_configs_raise_value_error_naming_the_field(data, field):
    with pytest.raises(ValueError) as err:
        SubnetConfig.from_dict(data)
    assert str(err.value).startswith(field)


def test_bad_json_is_a_value_error():
    with pytest.raises(ValueError, match="^config: not valid JSON"):
        SubnetConfig.from_json("{depths: 1")


def test_space_checks_and_restrict():
    with pytest.raises(ValueError, match="^kernel_sizes"):
        SearchSpace(kernel_sizes=(3, 4))
    with pytest.raises(ValueError, match="^depths"):
        SearchSpace(depths=())
    sub = SPACE.restrict(kernel_sizes=(7, 5), depths=[4])
    assert sub.kernel_sizes == (5, 7) and sub.depths == (4,) and sub.expand_ratios == SPACE.expand_ratios
    with pytest.raises(ValueError, match="^expand_ratios"):
        SPACE.restrict(expand_ratios=(8,))
    assert SearchSpace.from_dict(SPACE.to_dict()) == SPACE
    assert SPACE.contains(SPACE.sample(1)) and not sub.contains(SPACE.smallest())


def _rng_states():
    return random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state().clone()


def _same_states(a, b) -> bool:
    return a[0] == b[0] and np.array_equal(a[1], b[1]) and torch.equal(a[2], b[2])


def test_sampling_is_deterministic_valid_and_leaves_global_rng_alone():
    before = _rng_states()
    one = [SPACE.sample(random.Random(3)) for _ in range(3)]
    assert len({c.hash for c in one}) == 1
    from_numpy = [SPACE.sample(np.random.default_rng(3)) for _ in range(2)]
    assert from_numpy[0] == from_numpy[1]
    rng = random.Random(11)
    many = [SPACE.sample(rng) for _ in range(200)]
    for cfg in many:
        SPACE.validate(cfg)
    assert len({c.hash for c in many}) > 190
    # every choice shows up
    assert {k for c in many for row in c.kernel_sizes for k in row} == {3, 5, 7}
    assert {d for c in many for d in c.depths} == {2, 3, 4}
    assert _same_states(before, _rng_states())


def test_sandwich_rule():
    before = _rng_states()
    configs = sandwich_configs(SPACE, seed=7, round=3, k=5)
    assert configs[0] == SPACE.largest() and configs[1] == SPACE.smallest() and len(configs) == 5
    assert configs == sandwich_configs(SPACE, seed=7, round=3, k=5)
    assert configs[2:] != sandwich_configs(SPACE, seed=7, round=4, k=5)[2:]
    assert configs[2:] != sandwich_configs(SPACE, seed=8, round=3, k=5)[2:]
    assert configs[2:] != sandwich_configs(SPACE, seed=7, round=3, k=5, salt="cohort-2")[2:]
    # a prefix property: asking for more sub-networks extends the list
    assert sandwich_configs(SPACE, 7, 3, 3) == configs[:3]
    assert sandwich_configs(SPACE, 7, 3, 1) == [SPACE.largest()]
    assert sandwich_configs(SPACE, 7, 3, 2) == [SPACE.largest(), SPACE.smallest()]
    restricted = SPACE.restrict(expand_ratios=(6,), depths=(4,))
    for cfg in sandwich_configs(SPACE, 7, 3, 6, space=restricted):
        restricted.validate(cfg)
    with pytest.raises(ValueError, match="^k"):
        sandwich_configs(SPACE, 7, 3, 0)
    with pytest.raises(ValueError, match="^round"):
        sandwich_configs(SPACE, 7, -1, 2)
    assert _same_states(before, _rng_states())


def test_sandwich_rule_is_the_same_in_another_process():
    """Peers derive the same sub-networks without communicating (different hash seeds, no shared state)."""
    ours = [
        c.hash for c in sandwich_configs(SPACE, seed=12345678901234567890, round=41, k=6, salt="peerset-a")
    ]
    code = textwrap.dedent(
        """
        import random
        random.seed(999)
        from supernet import SearchSpace, sandwich_configs
        cfgs = sandwich_configs(SearchSpace(), seed=12345678901234567890, round=41, k=6, salt="peerset-a")
        print(",".join(c.hash for c in cfgs))
        """
    )
    env = dict(os.environ, PYTHONHASHSEED="4242")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip().split(",") == ours
