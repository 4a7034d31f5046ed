"""Stereo metrics and the multi-scale training loss.

All metrics are over *valid* pixels only: the given mask, and-ed with a finite ground truth.

* ``epe``   — end-point error, the mean |d̂ − d| in pixels;
* ``bad1``, ``bad2``, ``bad3`` — share (a fraction of 1) of pixels with |d̂ − d| > 1, 2, 3 px;
* ``d1``    — KITTI 2015 D1: share of pixels with |d̂ − d| > 3 px **and** > 5 % of d.

A non-finite prediction on a valid pixel counts as an infinite error (so it is "bad" and the EPE is
``inf``) instead of silently dropping out. With no valid pixel at all every metric is NaN.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

__all__ = ["StereoMetrics", "stereo_metrics", "MultiScaleLoss", "DEFAULT_SCALE_WEIGHTS"]

_THRESHOLDS = {"bad1": 1.0, "bad2": 2.0, "bad3": 3.0}


def _flat_errors(pred: torch.Tensor, gt: torch.Tensor, valid: torch.Tensor | None):
    if pred.shape != gt.shape:
        raise ValueError(f"prediction shape {tuple(pred.shape)} differs from ground truth {tuple(gt.shape)}")
    mask = torch.isfinite(gt)
    if valid is not None:
        if valid.shape != gt.shape:
            raise ValueError(
                f"valid mask shape {tuple(valid.shape)} differs from ground truth {tuple(gt.shape)}"
            )
        mask &= valid.bool()
    gt = gt[mask].double()
    err = (pred.detach()[mask].double() - gt).abs()
    err = torch.where(torch.isfinite(err), err, torch.full_like(err, float("inf")))
    return err, gt


class StereoMetrics:
    """Accumulates the metrics over batches (pixel-weighted, as the benchmarks report them)."""

    def __init__(self):
        self.count = 0
        self.sums = {"epe": 0.0, "bad1": 0.0, "bad2": 0.0, "bad3": 0.0, "d1": 0.0}

    @torch.no_grad()
    def update(self, pred: torch.Tensor, gt: torch.Tensor, valid: torch.Tensor | None = None) -> None:
        err, gt = _flat_errors(pred, gt, valid)
        self.count += err.numel()
        self.sums["epe"] += err.sum().item()
        for name, tau in _THRESHOLDS.items():
            self.sums[name] += (err > tau).sum().item()
        self.sums["d1"] += ((err > 3.0) & (err > 0.05 * gt.abs())).sum().item()

    def compute(self) -> dict[str, float]:
        if self.count == 0:
            return {name: float("nan") for name in self.sums}
        return {name: total / self.count for name, total in self.sums.items()}


def stereo_metrics(
    pred: torch.Tensor, gt: torch.Tensor, valid: torch.Tensor | None = None
) -> dict[str, float]:
    """EPE, bad-1/2/3 and D1 of one prediction (any shape, equal to the ground truth's)."""
    metrics = StereoMetrics()
    metrics.update(pred, gt, valid)
    return metrics.compute()


# Coarse → fine, one per prediction of StereoSupernet (7 scales: 1/64 … 1/1). Like DispNet/FADNet,
# every scale is supervised and the finest one counts most.
DEFAULT_SCALE_WEIGHTS = (0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32)


class MultiScaleLoss:
    """Weighted sum over scales of the mean per-pixel error between each prediction, up-sampled
    (bilinearly) to the ground truth's resolution, and the ground truth, over valid pixels.

    Predictions are disparities in full-resolution pixels at every scale (as StereoSupernet makes
    them), so up-sampling needs no rescaling of values. ``kind`` is ``"l1"`` or ``"smooth_l1"``.
    The weighted sum is divided by the sum of the weights, so the loss stays in pixels. A batch
    without any valid pixel gives a zero loss that still back-propagates (to zero gradients).
    """

    def __init__(self, weights: Sequence[float] = DEFAULT_SCALE_WEIGHTS, kind: str = "smooth_l1"):
        if kind not in ("l1", "smooth_l1"):
            raise ValueError(f"loss kind must be 'l1' or 'smooth_l1', got {kind!r}")
        weights = tuple(float(w) for w in weights)
        if not weights or any(w < 0 for w in weights) or sum(weights) == 0:
            raise ValueError(f"scale weights must be non-negative and not all zero, got {weights}")
        self.weights, self.kind = weights, kind

    def per_scale(self, preds: Sequence[torch.Tensor], gt: torch.Tensor, valid: torch.Tensor | None = None):
        """The unweighted loss of each prediction, coarse to fine."""
        if isinstance(preds, torch.Tensor):
            preds = [preds]
        if gt.dim() != 4 or gt.shape[1] != 1:
            raise ValueError(f"ground truth must be B×1×H×W, got {tuple(gt.shape)}")
        mask = torch.isfinite(gt)
        if valid is not None:
            mask &= valid.bool()
        target = torch.where(mask, gt, torch.zeros_like(gt))
        count = mask.sum()
        losses = []
        for pred in preds:
            if pred.shape[:2] != gt.shape[:2]:
                raise ValueError(
                    f"prediction {tuple(pred.shape)} does not match ground truth {tuple(gt.shape)}"
                )
            if pred.shape[-2:] != gt.shape[-2:]:
                pred = F.interpolate(pred, size=gt.shape[-2:], mode="bilinear", align_corners=False)
            if self.kind == "l1":
                err = (pred - target).abs()
            else:
                err = F.smooth_l1_loss(pred, target, reduction="none")
            losses.append((err * mask).sum() / count.clamp(min=1))
        return losses

    def __call__(self, preds: Sequence[torch.Tensor], gt: torch.Tensor, valid: torch.Tensor | None = None):
        if isinstance(preds, torch.Tensor):  # one prediction (e.g. eval mode): its plain loss
            return self.per_scale([preds], gt, valid)[0]
        if len(preds) != len(self.weights):
            raise ValueError(f"{len(preds)} predictions but {len(self.weights)} scale weights")
        losses = self.per_scale(preds, gt, valid)
        return sum(w * loss for w, loss in zip(self.weights, losses, strict=True)) / sum(self.weights)

    def distillation(self, student: Sequence[torch.Tensor], teacher: Sequence[torch.Tensor]) -> torch.Tensor:
        """In-place distillation for regression: the weighted per-scale error of a sub-network's
        predictions against the (detached) predictions of the largest one, over every pixel — the
        teacher is dense, so it also supervises pixels the ground truth leaves out."""
        if len(student) != len(self.weights) or len(teacher) != len(student):
            raise ValueError(
                f"{len(student)} student and {len(teacher)} teacher predictions, {len(self.weights)} weights"
            )
        total = 0.0
        for weight, s, t in zip(self.weights, student, teacher, strict=True):
            err = (
                (s - t.detach()).abs()
                if self.kind == "l1"
                else F.smooth_l1_loss(s, t.detach(), reduction="none")
            )
            total = total + weight * err.mean()
        return total / sum(self.weights)
