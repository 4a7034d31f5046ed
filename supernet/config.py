"""Sub-network configurations, search spaces and the deterministic sandwich rule.

Stable API (other packages build on it: the stereo supernet, the swarm, receipts):

* :class:`SearchSpace` — the choices a supernet offers: per-block kernel sizes and expand ratios,
  per-unit depths, and the number of units. Frozen; ``restrict(...)`` gives a sub-space (used by the
  progressive-shrinking phases). ``largest()``, ``smallest()``, ``sample(rng)`` and ``validate(cfg)``.
* :class:`SubnetConfig` — one sub-network: ``depths`` (one per unit) and, per unit, one kernel size
  and one expand ratio *per active block* (so ``len(kernel_sizes[u]) == depths[u]``). Storing only the
  active blocks makes the representation canonical: two configs are equal exactly when they describe
  the same network, and ``.hash`` (SHA-256 of the RFC 8785 canonical JSON) is a stable identity that
  receipts can carry.
* :func:`sandwich_configs` — the sandwich rule (largest, smallest, then ``k - 2`` random) drawn from a
  private generator seeded by a hash of ``(task seed, round, salt)``, so every peer derives the same
  list without communicating. Global RNG state is never touched.

Every check raises ``ValueError`` whose message starts with the offending field, e.g.
``"kernel_sizes[1][0]: 4 is not an allowed kernel size (3, 5, 7)"``.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import rfc8785

__all__ = [
    "SearchSpace",
    "SubnetConfig",
    "RandomLike",
    "derive_seed",
    "make_rng",
    "sandwich_configs",
]

Number = int | float
RandomLike = random.Random | np.random.Generator | int
"""What ``sample`` accepts: a ``random.Random``, a ``numpy.random.Generator`` or an int seed."""


def _norm_number(value: Any, field_name: str) -> Number:
    """Ints stay ints; integral floats become ints (3.0 -> 3) so equal values hash equally."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{field_name}: expected a number, got {value!r}")
    if isinstance(value, (np.integer, int)):
        return int(value)
    value = float(value)
    if not np.isfinite(value):
        raise ValueError(f"{field_name}: expected a finite number, got {value!r}")
    return int(value) if value.is_integer() else value


def _norm_int(value: Any, field_name: str) -> int:
    number = _norm_number(value, field_name)
    if not isinstance(number, int):
        raise ValueError(f"{field_name}: expected an integer, got {value!r}")
    return number


def _as_sequence(value: Any, field_name: str) -> Sequence:
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise ValueError(f"{field_name}: expected a list, got {value!r}")
    return list(value)


def derive_seed(*parts: Any) -> int:
    """A 64-bit seed from a SHA-256 of ``parts`` (ints and strings); the same on every machine."""
    payload = json.dumps(["manta.seed", *parts], separators=(",", ":")).encode("utf-8")
    return int.from_bytes(hashlib.sha256(payload).digest()[:8], "big")


def make_rng(rng: RandomLike) -> random.Random | np.random.Generator:
    """Normalise an rng argument: an int becomes a fresh ``random.Random(int)``."""
    if isinstance(rng, (random.Random, np.random.Generator)):
        return rng
    if isinstance(rng, (int, np.integer)) and not isinstance(rng, bool):
        return random.Random(int(rng))
    raise TypeError(f"rng: expected random.Random, numpy Generator or int, got {type(rng).__name__}")


def _choice(rng: random.Random | np.random.Generator, options: Sequence):
    if isinstance(rng, np.random.Generator):
        return options[int(rng.integers(len(options)))]
    return options[rng.randrange(len(options))]


# --------------------------------------------------------------------------------------------------
# SubnetConfig
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SubnetConfig:
    """One sub-network of a supernet with ``len(depths)`` units.

    ``depths[u]`` — how many blocks of unit ``u`` run (its first ``depths[u]`` blocks);
    ``kernel_sizes[u][b]`` / ``expand_ratios[u][b]`` — kernel size and expand ratio of block ``b`` of
    unit ``u``, for the active blocks only.

    Lists are accepted and stored as tuples; the object is immutable and hashable. Structural checks
    (types, matching lengths) happen here; whether the values are allowed by a particular supernet is
    :meth:`SearchSpace.validate`.
    """

    depths: tuple[int, ...]
    kernel_sizes: tuple[tuple[int, ...], ...]
    expand_ratios: tuple[tuple[Number, ...], ...]

    _FIELDS = ("depths", "kernel_sizes", "expand_ratios")

    def __post_init__(self) -> None:
        depths = tuple(
            _norm_int(d, f"depths[{u}]") for u, d in enumerate(_as_sequence(self.depths, "depths"))
        )
        if not depths:
            raise ValueError("depths: a config needs at least one unit")
        for u, d in enumerate(depths):
            if d < 1:
                raise ValueError(f"depths[{u}]: {d} is not a positive depth")
        nested = {}
        for name, norm in (("kernel_sizes", _norm_int), ("expand_ratios", _norm_number)):
            units = _as_sequence(getattr(self, name), name)
            if len(units) != len(depths):
                raise ValueError(
                    f"{name}: {len(units)} units, but depths has {len(depths)} (one entry per unit)"
                )
            rows = []
            for u, row in enumerate(units):
                row = _as_sequence(row, f"{name}[{u}]")
                if len(row) != depths[u]:
                    raise ValueError(
                        f"{name}[{u}]: {len(row)} entries, but depths[{u}] is {depths[u]} "
                        "(one entry per active block)"
                    )
                rows.append(tuple(norm(v, f"{name}[{u}][{b}]") for b, v in enumerate(row)))
            nested[name] = tuple(rows)
        object.__setattr__(self, "depths", depths)
        object.__setattr__(self, "kernel_sizes", nested["kernel_sizes"])
        object.__setattr__(self, "expand_ratios", nested["expand_ratios"])

    # ---- views ------------------------------------------------------------------------------------
    @property
    def num_units(self) -> int:
        return len(self.depths)

    def blocks(self) -> list[tuple[int, int, int, Number]]:
        """``(unit, block, kernel_size, expand_ratio)`` for every active block, in network order."""
        return [
            (u, b, self.kernel_sizes[u][b], self.expand_ratios[u][b])
            for u in range(self.num_units)
            for b in range(self.depths[u])
        ]

    # ---- serialisation ------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "depths": list(self.depths),
            "kernel_sizes": [list(r) for r in self.kernel_sizes],
            "expand_ratios": [list(r) for r in self.expand_ratios],
        }

    def canonical_json(self) -> bytes:
        """RFC 8785 canonical JSON bytes; the input of :attr:`hash`."""
        return rfc8785.dumps(self.to_dict())

    def to_json(self) -> str:
        return self.canonical_json().decode("utf-8")

    @property
    def hash(self) -> str:
        """SHA-256 (hex) of the canonical JSON: the config's stable identity."""
        return hashlib.sha256(self.canonical_json()).hexdigest()

    @classmethod
    def from_dict(cls, data: Any, space: SearchSpace | None = None) -> SubnetConfig:
        if not isinstance(data, dict):
            raise ValueError(f"config: expected a JSON object, got {type(data).__name__}")
        for key in data:
            if key not in cls._FIELDS:
                raise ValueError(f"{key}: unknown field (expected {', '.join(cls._FIELDS)})")
        for key in cls._FIELDS:
            if key not in data:
                raise ValueError(f"{key}: missing field")
        cfg = cls(**{k: data[k] for k in cls._FIELDS})
        if space is not None:
            space.validate(cfg)
        return cfg

    @classmethod
    def from_json(cls, text: str | bytes, space: SearchSpace | None = None) -> SubnetConfig:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"config: not valid JSON ({exc.msg} at position {exc.pos})") from None
        return cls.from_dict(data, space)

    @classmethod
    def uniform(cls, num_units: int, depth: int, kernel_size: int, expand_ratio: Number) -> SubnetConfig:
        """Every unit with the same depth, every block with the same kernel and expand ratio."""
        return cls(
            depths=(depth,) * num_units,
            kernel_sizes=((kernel_size,) * depth,) * num_units,
            expand_ratios=((expand_ratio,) * depth,) * num_units,
        )

    def __str__(self) -> str:
        units = []
        for u in range(self.num_units):
            blocks = ",".join(
                f"k{k}e{e}" for k, e in zip(self.kernel_sizes[u], self.expand_ratios[u], strict=True)
            )
            units.append(f"d{self.depths[u]}[{blocks}]")
        return " ".join(units)


# --------------------------------------------------------------------------------------------------
# SearchSpace
# --------------------------------------------------------------------------------------------------


def _sorted_unique(values: Iterable, name: str, norm) -> tuple:
    values = tuple(sorted({norm(v, name) for v in _as_sequence(values, name)}))
    if not values:
        raise ValueError(f"{name}: needs at least one choice")
    return values


@dataclass(frozen=True)
class SearchSpace:
    """The elastic choices of a supernet (defaults: the once-for-all MobileNetV3 space).

    ``kernel_sizes`` and ``expand_ratios`` are chosen per block, ``depths`` per unit. Values are
    stored sorted and de-duplicated. Kernel sizes must be odd (same padding).
    """

    kernel_sizes: tuple[int, ...] = (3, 5, 7)
    expand_ratios: tuple[Number, ...] = (3, 4, 6)
    depths: tuple[int, ...] = (2, 3, 4)
    num_units: int = 5

    def __post_init__(self) -> None:
        kernels = _sorted_unique(self.kernel_sizes, "kernel_sizes", _norm_int)
        for k in kernels:
            if k < 1 or k % 2 == 0:
                raise ValueError(f"kernel_sizes: {k} is not a positive odd kernel size")
        expands = _sorted_unique(self.expand_ratios, "expand_ratios", _norm_number)
        for e in expands:
            if e <= 0:
                raise ValueError(f"expand_ratios: {e} is not a positive expand ratio")
        depths = _sorted_unique(self.depths, "depths", _norm_int)
        for d in depths:
            if d < 1:
                raise ValueError(f"depths: {d} is not a positive depth")
        num_units = _norm_int(self.num_units, "num_units")
        if num_units < 1:
            raise ValueError(f"num_units: {num_units} is not a positive number of units")
        object.__setattr__(self, "kernel_sizes", kernels)
        object.__setattr__(self, "expand_ratios", expands)
        object.__setattr__(self, "depths", depths)
        object.__setattr__(self, "num_units", num_units)

    # ---- extremes -------------------------------------------------------------------------------
    @property
    def max_kernel(self) -> int:
        return self.kernel_sizes[-1]

    @property
    def max_expand(self) -> Number:
        return self.expand_ratios[-1]

    @property
    def max_depth(self) -> int:
        return self.depths[-1]

    def largest(self) -> SubnetConfig:
        return SubnetConfig.uniform(
            self.num_units, self.depths[-1], self.kernel_sizes[-1], self.expand_ratios[-1]
        )

    def smallest(self) -> SubnetConfig:
        return SubnetConfig.uniform(
            self.num_units, self.depths[0], self.kernel_sizes[0], self.expand_ratios[0]
        )

    def sample(self, rng: RandomLike) -> SubnetConfig:
        """A uniformly random config: a depth per unit, then a kernel and an expand ratio per block.

        The draw order is fixed (unit by unit: depth, then kernel and expand ratio of each active
        block), so the same generator state gives the same config on every machine.
        """
        rng = make_rng(rng)
        depths, kernels, expands = [], [], []
        for _ in range(self.num_units):
            d = _choice(rng, self.depths)
            ks, es = [], []
            for _ in range(d):
                ks.append(_choice(rng, self.kernel_sizes))
                es.append(_choice(rng, self.expand_ratios))
            depths.append(d)
            kernels.append(ks)
            expands.append(es)
        return SubnetConfig(depths, kernels, expands)

    def size(self) -> int:
        """How many distinct sub-networks the space holds."""
        per_block = len(self.kernel_sizes) * len(self.expand_ratios)
        per_unit = sum(per_block**d for d in self.depths)
        return per_unit**self.num_units

    # ---- checks -------------------------------------------------------------------------------
    def validate(self, cfg: SubnetConfig) -> SubnetConfig:
        """Return ``cfg`` if every value is allowed here, else raise ``ValueError`` naming the field."""
        if not isinstance(cfg, SubnetConfig):
            raise ValueError(f"config: expected a SubnetConfig, got {type(cfg).__name__}")
        if cfg.num_units != self.num_units:
            raise ValueError(f"depths: {cfg.num_units} units, but the supernet has {self.num_units}")
        for u, d in enumerate(cfg.depths):
            if d not in self.depths:
                raise ValueError(f"depths[{u}]: {d} is not an allowed depth {self.depths}")
        for u, row in enumerate(cfg.kernel_sizes):
            for b, k in enumerate(row):
                if k not in self.kernel_sizes:
                    raise ValueError(
                        f"kernel_sizes[{u}][{b}]: {k} is not an allowed kernel size {self.kernel_sizes}"
                    )
        for u, row in enumerate(cfg.expand_ratios):
            for b, e in enumerate(row):
                if e not in self.expand_ratios:
                    raise ValueError(
                        f"expand_ratios[{u}][{b}]: {e} is not an allowed expand ratio {self.expand_ratios}"
                    )
        return cfg

    def contains(self, cfg: SubnetConfig) -> bool:
        try:
            self.validate(cfg)
        except ValueError:
            return False
        return True

    def restrict(
        self,
        kernel_sizes: Iterable[int] | None = None,
        expand_ratios: Iterable[Number] | None = None,
        depths: Iterable[int] | None = None,
    ) -> SearchSpace:
        """A sub-space (each given choice list must be a subset of this space's)."""
        new = SearchSpace(
            kernel_sizes=self.kernel_sizes if kernel_sizes is None else tuple(kernel_sizes),
            expand_ratios=self.expand_ratios if expand_ratios is None else tuple(expand_ratios),
            depths=self.depths if depths is None else tuple(depths),
            num_units=self.num_units,
        )
        for name in ("kernel_sizes", "expand_ratios", "depths"):
            extra = set(getattr(new, name)) - set(getattr(self, name))
            if extra:
                raise ValueError(f"{name}: {sorted(extra)} not in this space {getattr(self, name)}")
        return new

    def to_dict(self) -> dict[str, Any]:
        return {
            "kernel_sizes": list(self.kernel_sizes),
            "expand_ratios": list(self.expand_ratios),
            "depths": list(self.depths),
            "num_units": self.num_units,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SearchSpace:
        known = {"kernel_sizes", "expand_ratios", "depths", "num_units"}
        for key in data:
            if key not in known:
                raise ValueError(f"{key}: unknown search-space field")
        return cls(**data)


# --------------------------------------------------------------------------------------------------
# Sandwich rule
# --------------------------------------------------------------------------------------------------


class _HasSpace(Protocol):
    space: SearchSpace


def sandwich_configs(
    net: _HasSpace | SearchSpace,
    seed: int | str,
    round: int,
    k: int,
    salt: str = "",
    *,
    space: SearchSpace | None = None,
) -> list[SubnetConfig]:
    """The sandwich rule for one round: ``[largest, smallest, random_1, ..., random_{k-2}]``.

    Deterministic from ``(seed, round, salt)`` alone (``salt`` e.g. a cohort id), so every peer that
    knows the task seed and the round number draws the same list without communicating. The random
    configs come from a private ``random.Random`` seeded with a SHA-256 of those values; global RNG
    state is neither read nor changed. ``k == 1`` gives only the largest, ``k == 2`` largest and
    smallest. ``space`` (default: ``net.space``, or ``net`` itself when it is a :class:`SearchSpace`)
    lets a training phase draw from a restricted space.
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k: need a positive number of sub-networks, got {k!r}")
    if isinstance(round, bool) or not isinstance(round, (int, np.integer)) or round < 0:
        raise ValueError(f"round: need a non-negative integer, got {round!r}")
    if space is None:
        space = net if isinstance(net, SearchSpace) else net.space
    rng = random.Random(derive_seed("sandwich", seed, int(round), str(salt)))
    configs = [space.largest()]
    if k >= 2:
        configs.append(space.smallest())
    configs.extend(space.sample(rng) for _ in range(k - 2))
    return configs
