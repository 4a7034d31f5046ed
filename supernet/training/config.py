"""Every hyper-parameter of a supernet training run, in one dataclass: :class:`TrainConfig`."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from supernet.classification import DEFAULT_ACTIVATIONS, DEFAULT_UNIT_CHANNELS
from supernet.config import SearchSpace

__all__ = ["TrainConfig", "SCHEDULES", "OPTIMIZERS"]

SCHEDULES = ("sandwich", "progressive")
OPTIMIZERS = ("sgd", "adamw")


@dataclass
class TrainConfig:
    """Every hyper-parameter of a supernet training run, in one place (JSON-able via ``to_dict``).

    Sequences are stored as tuples. An invalid value raises ``ValueError`` naming its field.
    """

    # task and seed
    task: str = "digits"
    task_options: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    # supernet
    kernel_sizes: tuple[int, ...] = (3, 5, 7)
    expand_ratios: tuple[float, ...] = (3, 4, 6)
    depths: tuple[int, ...] = (2, 3, 4)
    width_mult: float = 1.0
    stem_channels: int = 16
    unit_channels: tuple[int, ...] = DEFAULT_UNIT_CHANNELS
    head_channels: int = 640
    channel_divisor: int = 8
    activations: tuple[str, ...] = DEFAULT_ACTIVATIONS
    stem_stride: int = 1
    dropout: float = 0.0  # mask drawn from the generator given to accumulate_gradients
    kernel_transform: bool = True
    # schedule
    total_steps: int = 1000
    batch_size: int = 64
    num_subnets: int = 4  # K: sub-networks per step (sandwich: largest, smallest, K-2 random)
    schedule: str = "sandwich"  # "sandwich" | "progressive"
    phase_fractions: tuple[float, float, float, float] = (0.1, 0.2, 0.35, 0.35)  # full, kernel, depth, width
    # loss
    label_smoothing: float = 0.0
    distill: bool = True
    distill_weight: float = 1.0
    distill_temperature: float = 1.0
    student_label_weight: float = 1.0
    # optimizer
    optimizer: str = "sgd"  # "sgd" | "adamw"
    lr: float = 0.1
    momentum: float = 0.9
    nesterov: bool = True
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = 5e-5
    warmup_steps: int = 0
    min_lr: float = 0.0
    grad_clip_norm: float | None = None
    # evaluation
    bn_calibration_batches: int = 16
    eval_random_subnets: int = 3
    eval_batch_size: int = 256
    eval_every: int = 0  # steps between evaluations during training (0: only at the end)
    log_every: int = 10
    device: str = "cpu"

    def __post_init__(self) -> None:
        for name in (
            "kernel_sizes",
            "expand_ratios",
            "depths",
            "unit_channels",
            "activations",
            "phase_fractions",
            "betas",
        ):
            setattr(self, name, tuple(getattr(self, name)))
        checks = [
            ("schedule", self.schedule in SCHEDULES, f"one of {SCHEDULES}"),
            ("optimizer", self.optimizer in OPTIMIZERS, f"one of {OPTIMIZERS}"),
            ("total_steps", self.total_steps >= 1, "at least 1"),
            ("batch_size", self.batch_size >= 2, "at least 2 (batch norm)"),
            ("num_subnets", self.num_subnets >= 1, "at least 1"),
            ("lr", self.lr > 0, "positive"),
            ("weight_decay", self.weight_decay >= 0, "non-negative"),
            ("warmup_steps", 0 <= self.warmup_steps < self.total_steps, "in [0, total_steps)"),
            ("min_lr", 0 <= self.min_lr <= self.lr, "in [0, lr]"),
            ("distill_weight", self.distill_weight >= 0, "non-negative"),
            ("distill_temperature", self.distill_temperature > 0, "positive"),
            ("bn_calibration_batches", self.bn_calibration_batches >= 1, "at least 1"),
            ("phase_fractions", len(self.phase_fractions) == 4 and min(self.phase_fractions) >= 0
             and sum(self.phase_fractions) > 0, "four non-negative shares (full, kernel, depth, width)"),
        ]  # fmt: skip
        for name, ok, expected in checks:
            if not ok:
                raise ValueError(f"{name}: {getattr(self, name)!r} is not {expected}")
        self.space()  # validates the choices

    def space(self) -> SearchSpace:
        """The supernet's elastic choices; ``ValueError`` if they do not make a search space."""
        return SearchSpace(self.kernel_sizes, self.expand_ratios, self.depths, len(self.unit_channels))

    def to_dict(self) -> dict[str, Any]:
        """Every field by name, tuples as lists: what :meth:`from_dict` takes back."""
        data = asdict(self)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in data.items()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        """The config ``data`` describes (missing fields take their defaults); ``ValueError`` for an
        unknown key or an invalid value."""
        known = {f.name for f in fields(cls)}
        for key in data:
            if key not in known:
                raise ValueError(f"{key}: unknown training option")
        return cls(**data)
