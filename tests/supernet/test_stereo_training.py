"""The stereo training recipe and the registered stereo-synthetic task (tiny sizes)."""

from __future__ import annotations

import pytest
import torch

from supernet.stereo_training import (
    StereoTrainConfig,
    accumulate_stereo_gradients,
    build_stereo_supernet,
    evaluate_stereo,
    evaluate_stereo_subnets,
    mean_disparity_baseline,
    step_configs,
    stereo_batch,
    train_stereo,
)
from tasks import available_tasks, get_task

TINY = dict(
    unit_channels=(8, 8, 8, 8, 8, 16),
    batch_size=2,
    total_steps=4,
    warmup_steps=1,
    log_every=0,
    bn_calibration_batches=1,
    eval_random_subnets=1,
    eval_batch_size=4,
    task_options={"val_size": 4, "height": 64, "width": 64, "max_disparity": 12},
)


@pytest.fixture(scope="module")
def task():
    return get_task("stereo-synthetic", val_size=4, height=64, width=64, max_disparity=12)


def test_stereo_synthetic_is_registered_with_loss_and_metric(task):
    assert "stereo-synthetic" in available_tasks()
    assert task.input_size == (3, 64, 64) and task.metric_name == "epe" and not task.higher_is_better
    batch = stereo_batch(task.val_set, range(2))
    assert batch["left"].shape == (2, 3, 64, 64) and batch["valid"].dtype == torch.bool
    assert task.metric(batch["disparity"], batch) == 0.0
    assert task.loss(batch["disparity"] + 1.0, batch).item() == pytest.approx(0.5)  # smooth L1 of 1 px
    # Training and validation pairs come from different seeds.
    assert not torch.equal(task.train_set[0]["left"], task.val_set[0]["left"])
    with pytest.raises(ValueError, match="option"):
        get_task("stereo-synthetic", colour=True)


def test_config_validation():
    with pytest.raises(ValueError, match="unit_channels"):
        StereoTrainConfig(unit_channels=(8, 8, 8, 8, 8))
    with pytest.raises(ValueError, match="scale_weights"):
        StereoTrainConfig(scale_weights=(1.0, 1.0))
    cfg = StereoTrainConfig(**TINY)
    assert cfg.space().num_units == 6
    assert StereoTrainConfig.from_dict(cfg.to_dict()) == cfg


def test_accumulate_sums_sandwich_gradients_with_distillation(task):
    cfg = StereoTrainConfig(**TINY)
    net = build_stereo_supernet(cfg)
    configs = step_configs(net, 0, cfg)
    assert len(configs) == 3 and configs[0] == net.largest_config() and configs[1] == net.smallest_config()
    batch = stereo_batch(task.train_set, range(2))
    stats = accumulate_stereo_gradients(net, batch, configs, cfg)
    assert len(stats["losses"]) == 3 and stats["distill_losses"][0] == 0 and stats["distill_losses"][1] > 0
    assert stats["samples"] == 2
    assert stats["train_macs"] == sum(3 * net.flops(c, (64, 64)) * 2 for c in configs)
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in net.parameters())
    # Without the largest first, the teacher runs once more (without gradients) and is accounted for.
    stats = accumulate_stereo_gradients(net, batch, configs[1:], cfg)
    assert stats["train_macs"] == net.flops(net.largest_config(), (64, 64)) * 2 + sum(
        3 * net.flops(c, (64, 64)) * 2 for c in configs[1:]
    )


def test_a_short_run_is_deterministic_and_evaluates_subnets_and_exports(task):
    cfg = StereoTrainConfig(**TINY)
    first = train_stereo(cfg, task, progress=lambda line: None)
    second = train_stereo(cfg, task, progress=lambda line: None, final_eval=False)
    # (parameters only: the first run's final evaluation recalibrated its BN statistics)
    for a, b in zip(first["net"].parameters(), second["net"].parameters(), strict=True):
        assert torch.equal(a, b)
    assert first["steps"] == 4 and all(torch.isfinite(torch.tensor(h["loss"])) for h in first["history"])
    names = [row["name"] for row in first["final"]]
    assert names == ["largest", "smallest", "random-1"]
    largest = first["final"][0]
    assert largest["macs"] > first["final"][1]["macs"] and 0 <= largest["d1"] <= largest["bad1"] <= 1
    rows = evaluate_stereo_subnets(
        first["net"], task, cfg, {"smallest": first["net"].smallest_config()}, export=True
    )
    assert rows[0]["exported_epe"] == pytest.approx(rows[0]["epe"], abs=1e-4)
    direct = evaluate_stereo(first["net"].export(first["net"].smallest_config()), task.val_set, 4)
    assert direct["epe"] == pytest.approx(rows[0]["epe"], abs=1e-4)


def test_time_limit_stops_early_and_the_baseline_is_the_mean(task):
    cfg = StereoTrainConfig(**{**TINY, "total_steps": 50})
    result = train_stereo(cfg, task, progress=lambda line: None, max_seconds=0.0, final_eval=False)
    assert result["steps"] == 0 and result["final"] == []
    baseline = mean_disparity_baseline(task, batches=2, batch_size=2)
    assert 0 < baseline["mean_disparity"] < 12 and baseline["epe"] > 0


@pytest.mark.slow
def test_training_reduces_the_error_of_largest_and_smallest(task):
    """A minute or two of training already beats the mean-disparity baseline (the full target is the
    benchmark's: benchmarks/stereo_quality.py)."""
    cfg = StereoTrainConfig(
        **{**TINY, "batch_size": 4, "total_steps": 60, "task_options": {"val_size": 16}, "num_threads": 1}
    )
    result = train_stereo(cfg, progress=lambda line: None)
    baseline = mean_disparity_baseline(result["task"])
    epe = {row["name"]: row["epe"] for row in result["final"]}
    assert epe["largest"] < baseline["epe"] and epe["smallest"] < baseline["epe"]
