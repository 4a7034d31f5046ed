"""Stereo metrics and the multi-scale loss on hand-computable cases."""

from __future__ import annotations

import math

import pytest
import torch

from tasks.stereo import MultiScaleLoss, StereoMetrics, stereo_metrics


def test_metrics_on_a_hand_computed_case():
    gt = torch.tensor([10.0, 10.0, 10.0, 100.0, 2.0, float("nan"), 5.0])
    pred = torch.tensor([10.5, 12.0, 14.0, 104.0, 6.0, 0.0, 50.0])
    valid = torch.tensor([True, True, True, True, True, True, False])
    # valid errors: 0.5, 2, 4, 4, 4 (the NaN ground truth and the masked pixel are left out)
    m = stereo_metrics(pred, gt, valid)
    assert m["epe"] == pytest.approx(14.5 / 5)
    assert m["bad1"] == pytest.approx(4 / 5)
    assert m["bad2"] == pytest.approx(3 / 5)  # an error of exactly 2 is not "above 2"
    assert m["bad3"] == pytest.approx(3 / 5)
    # D1: > 3 px and > 5 % of d: 4 > 0.5 yes, 4 > 5 (d = 100) no, 4 > 0.1 yes
    assert m["d1"] == pytest.approx(2 / 5)


def test_metrics_accumulate_pixel_weighted_over_batches():
    acc = StereoMetrics()
    acc.update(torch.zeros(1, 1, 1, 3), torch.ones(1, 1, 1, 3))  # errors 1, 1, 1
    acc.update(torch.zeros(1, 1, 1, 1), torch.full((1, 1, 1, 1), 5.0))  # error 5
    m = acc.compute()
    assert m["epe"] == pytest.approx(8 / 4)
    assert m["bad3"] == pytest.approx(1 / 4) and m["d1"] == pytest.approx(1 / 4)


def test_non_finite_prediction_counts_as_infinite_error_and_empty_mask_gives_nan():
    m = stereo_metrics(torch.tensor([float("nan"), 1.0]), torch.tensor([1.0, 1.0]))
    assert math.isinf(m["epe"]) and m["bad1"] == pytest.approx(0.5)
    empty = stereo_metrics(torch.ones(3), torch.ones(3), torch.zeros(3, dtype=torch.bool))
    assert all(math.isnan(v) for v in empty.values())


def test_metrics_reject_mismatched_shapes():
    with pytest.raises(ValueError, match="differs"):
        stereo_metrics(torch.zeros(2, 3), torch.zeros(3, 2))


def test_multiscale_loss_weights_and_upsampling():
    gt = torch.full((1, 1, 4, 4), 3.0)
    valid = torch.ones_like(gt, dtype=torch.bool)
    valid[..., 0, 0] = False
    gt[..., 0, 0] = float("nan")  # masked NaN must not leak into the loss
    coarse = torch.full((1, 1, 1, 1), 1.0, requires_grad=True)  # error 2 everywhere after upsampling
    fine = torch.full((1, 1, 4, 4), 3.5, requires_grad=True)  # error 0.5
    loss_fn = MultiScaleLoss(weights=(1.0, 3.0), kind="l1")
    assert [v.item() for v in loss_fn.per_scale([coarse, fine], gt, valid)] == pytest.approx([2.0, 0.5])
    loss = loss_fn([coarse, fine], gt, valid)
    assert loss.item() == pytest.approx((1 * 2.0 + 3 * 0.5) / 4)
    loss.backward()
    assert torch.isfinite(fine.grad).all() and fine.grad[0, 0, 0, 0] == 0
    assert loss_fn(fine, gt, valid).item() == pytest.approx(0.5)  # one tensor: its plain loss


def test_multiscale_loss_smooth_l1_and_empty_mask():
    gt = torch.zeros(1, 1, 2, 2)
    pred = torch.tensor([[[[0.5, 2.0], [0.0, 0.0]]]], requires_grad=True)
    loss = MultiScaleLoss(weights=(1.0,), kind="smooth_l1")([pred], gt)
    assert loss.item() == pytest.approx((0.5 * 0.25 + 1.5) / 4)
    none = MultiScaleLoss(weights=(1.0,))([pred], gt, torch.zeros_like(gt, dtype=torch.bool))
    none.backward()
    assert none.item() == 0.0 and (pred.grad == 0).all()


def test_multiscale_loss_rejects_bad_arguments():
    with pytest.raises(ValueError, match="scale weights"):
        MultiScaleLoss(weights=(1.0, 2.0))([torch.zeros(1, 1, 2, 2)] * 3, torch.zeros(1, 1, 2, 2))
    with pytest.raises(ValueError, match="non-negative"):
        MultiScaleLoss(weights=(-1.0,))
    with pytest.raises(ValueError, match="kind"):
        MultiScaleLoss(kind="l2")
    with pytest.raises(ValueError, match="B×1×H×W"):
        MultiScaleLoss(weights=(1.0,))([torch.zeros(1, 1, 2, 2)], torch.zeros(2, 2))


def test_distillation_loss_compares_scale_by_scale_over_all_pixels():
    loss_fn = MultiScaleLoss(weights=(1.0, 1.0), kind="l1")
    teacher = [torch.zeros(1, 1, 1, 1), torch.zeros(1, 1, 2, 2)]
    student = [torch.full((1, 1, 1, 1), 2.0, requires_grad=True), torch.ones(1, 1, 2, 2, requires_grad=True)]
    kd = loss_fn.distillation(student, teacher)
    assert kd.item() == pytest.approx((2.0 + 1.0) / 2)
    kd.backward()
    assert student[1].grad.abs().sum() > 0
    with pytest.raises(ValueError, match="teacher"):
        loss_fn.distillation(student, teacher[:1])
