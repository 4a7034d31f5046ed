"""Constrained sub-network search: evolution (mutation + crossover) and a random-search baseline.

Both spend a fixed number of **evaluations** (distinct sub-networks whose metric is requested from
the evaluator), so they can be compared like for like, and both only ever evaluate sub-networks
inside the budget.

**Constraint handling that always terminates.** :func:`~supernet.search.cost.check_budget` first
raises :class:`~supernet.search.cost.InfeasibleBudget` if even the cheapest sub-network is over the
budget. Otherwise a candidate is drawn (random, mutated or crossed over) at most ``max_tries`` times;
if every draw is over budget, the last one is *repaired*: genes that differ from the cheapest
sub-network are set to its values one at a time (in a seeded random order) until it fits — at most
one step per gene, and the cheapest sub-network itself fits. Duplicates are skipped with a bounded
number of attempts too; a generation that finds nothing new ends the search early (a small space
can be exhausted) and the result says so.

**Genomes.** A candidate is a genome with a kernel size and expand ratio for *every* block slot, not
just the active ones, as in once-for-all: a block switched off by a depth mutation keeps its genes
and can come back. The sub-network is the genome truncated to the active blocks
(:meth:`Genome.config`); identity and duplicates are by the config's hash.

**Determinism.** Every choice comes from one ``random.Random`` seeded from ``seed``, and results are
looked up by config hash, so the search is a function of the seed and the metric values alone — the
same however many helpers evaluated them (:mod:`supernet.search.distributed`).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from supernet.config import Number, SearchSpace, SubnetConfig, derive_seed
from supernet.search.accuracy import Evaluator, check_results
from supernet.search.cost import CostModel, check_budget

__all__ = [
    "Candidate",
    "EvolutionSettings",
    "Genome",
    "SearchResult",
    "evolutionary_search",
    "random_search",
]


@dataclass(frozen=True)
class Genome:
    """Depth per unit; kernel size and expand ratio per block slot (``space.max_depth`` per unit)."""

    depths: tuple[int, ...]
    kernels: tuple[tuple[int, ...], ...]
    expands: tuple[tuple[Number, ...], ...]

    def config(self) -> SubnetConfig:
        return SubnetConfig(
            self.depths,
            [row[:d] for row, d in zip(self.kernels, self.depths, strict=True)],
            [row[:d] for row, d in zip(self.expands, self.depths, strict=True)],
        )

    @classmethod
    def random(cls, space: SearchSpace, rng: random.Random) -> Genome:
        depths, kernels, expands = [], [], []
        for _ in range(space.num_units):
            depths.append(rng.choice(space.depths))
            kernels.append(tuple(rng.choice(space.kernel_sizes) for _ in range(space.max_depth)))
            expands.append(tuple(rng.choice(space.expand_ratios) for _ in range(space.max_depth)))
        return cls(tuple(depths), tuple(kernels), tuple(expands))

    @classmethod
    def of(cls, cfg: SubnetConfig, space: SearchSpace) -> Genome:
        """``cfg`` as a genome (inactive slots get the smallest choices)."""
        pad = space.max_depth
        return cls(
            cfg.depths,
            tuple(row + (space.kernel_sizes[0],) * (pad - len(row)) for row in cfg.kernel_sizes),
            tuple(row + (space.expand_ratios[0],) * (pad - len(row)) for row in cfg.expand_ratios),
        )


@dataclass(frozen=True)
class Candidate:
    """An evaluated sub-network: its metric, its cost under the budget's cost model, how it was found."""

    config: SubnetConfig
    metric: float
    cost: float
    method: str
    generation: int
    genome: Genome = field(repr=False, compare=False)

    @property
    def hash(self) -> str:
        return self.config.hash


@dataclass
class SearchResult:
    method: str
    best: Candidate
    candidates: list[Candidate]  # every evaluated sub-network, in evaluation order
    generations: int
    limit: float
    cost_name: str
    higher_is_better: bool
    stopped_early: str | None = None

    @property
    def evaluations(self) -> int:
        return len(self.candidates)


@dataclass(frozen=True)
class EvolutionSettings:
    """``evaluations`` in total; ``population`` per generation, of which the best ``parent_fraction``
    are kept as parents; children are ``mutation_fraction`` mutations (each gene redrawn with
    probability ``mutation_prob``), the rest uniform crossovers of two parents."""

    evaluations: int = 100
    population: int = 16
    parent_fraction: float = 0.25
    mutation_prob: float = 0.1
    mutation_fraction: float = 0.5
    max_tries: int = 50
    seed: int = 0

    def __post_init__(self) -> None:
        checks = [
            ("evaluations", self.evaluations >= 1, "at least 1"),
            ("population", self.population >= 2, "at least 2"),
            ("parent_fraction", 0 < self.parent_fraction < 1, "in (0, 1)"),
            ("mutation_prob", 0 < self.mutation_prob <= 1, "in (0, 1]"),
            ("mutation_fraction", 0 <= self.mutation_fraction <= 1, "in [0, 1]"),
            ("max_tries", self.max_tries >= 1, "at least 1"),
        ]
        for name, ok, expected in checks:
            if not ok:
                raise ValueError(f"{name}: {getattr(self, name)!r} is not {expected}")


class _Search:
    """State shared by both methods: the budget, the evaluated set, sampling and repair."""

    def __init__(
        self,
        method: str,
        space: SearchSpace,
        cost: CostModel,
        limit: float,
        evaluator: Evaluator,
        higher_is_better: bool,
        seed: int,
        max_tries: int,
        progress: Callable[[str], None] | None,
    ) -> None:
        self.method, self.space, self.cost, self.limit = method, space, cost, float(limit)
        self.evaluator, self.higher_is_better, self.max_tries = evaluator, higher_is_better, max_tries
        self.cheapest = check_budget(cost, self.limit)
        self.rng = random.Random(derive_seed("search", method, seed))
        self.evaluated: dict[str, Candidate] = {}
        self.order: list[Candidate] = []
        self.say = progress or (lambda line: None)

    # ---- ranking ----------------------------------------------------------------------------------
    def rank(self, c: Candidate) -> tuple:
        """Sort key, best first: metric, then lower cost, then hash (a total, reproducible order)."""
        return (-c.metric if self.higher_is_better else c.metric, c.cost, c.hash)

    # ---- feasibility --------------------------------------------------------------------------------
    def fits(self, g: Genome) -> bool:
        return self.cost(g.config()) <= self.limit

    def repair(self, g: Genome) -> Genome:
        """Move genes to the cheapest sub-network's values, one at a time, until ``g`` fits."""
        cheap = self.cheapest
        depths, kernels, expands = list(g.depths), [list(r) for r in g.kernels], [list(r) for r in g.expands]
        limit_steps = self.space.num_units * (1 + 2 * self.space.max_depth) + 1
        for _ in range(limit_steps):
            current = Genome(tuple(depths), tuple(map(tuple, kernels)), tuple(map(tuple, expands)))
            if self.fits(current):
                return current
            diffs = [("d", u, 0) for u in range(len(depths)) if depths[u] != cheap.depths[u]]
            for u in range(len(depths)):
                for b in range(min(depths[u], cheap.depths[u])):
                    if kernels[u][b] != cheap.kernel_sizes[u][b]:
                        diffs.append(("k", u, b))
                    if expands[u][b] != cheap.expand_ratios[u][b]:
                        diffs.append(("e", u, b))
            if not diffs:
                break
            kind, u, b = self.rng.choice(diffs)
            if kind == "d":
                depths[u] = cheap.depths[u]
            elif kind == "k":
                kernels[u][b] = cheap.kernel_sizes[u][b]
            else:
                expands[u][b] = cheap.expand_ratios[u][b]
        return Genome.of(cheap, self.space)  # the cheapest fits (check_budget); reached only defensively

    def feasible(self, draw: Callable[[], Genome]) -> Genome:
        """A draw that fits: up to ``max_tries`` draws, then the last one repaired."""
        g = draw()
        for _ in range(self.max_tries - 1):
            if self.fits(g):
                return g
            g = draw()
        return g if self.fits(g) else self.repair(g)

    def fresh(self, draw: Callable[[], Genome], count: int, taken: set[str]) -> list[Genome]:
        """Up to ``count`` feasible genomes whose configs are neither evaluated nor in ``taken``.

        Gives up after ``max_tries`` duplicates in a row: the space near the parents (or all of the
        feasible space) is then taken to be exhausted.
        """
        out: list[Genome] = []
        misses = 0
        while len(out) < count and misses < self.max_tries:
            g = self.feasible(draw)
            key = g.config().hash
            if key in self.evaluated or key in taken:
                misses += 1
                continue
            misses = 0
            taken.add(key)
            out.append(g)
        return out

    def random_genome(self) -> Genome:
        return Genome.random(self.space, self.rng)

    # ---- evaluation -----------------------------------------------------------------------------------
    def evaluate(self, genomes: Sequence[Genome], generation: int) -> list[Candidate]:
        configs = [g.config() for g in genomes]
        results = self.evaluator.evaluate(configs)
        check_results(configs, results)
        out = []
        for g, cfg in zip(genomes, configs, strict=True):
            c = Candidate(cfg, float(results[cfg.hash]), self.cost(cfg), self.method, generation, g)
            self.evaluated[c.hash] = c
            self.order.append(c)
            out.append(c)
        best = min(self.order, key=self.rank)
        self.say(
            f"{self.method} generation {generation}: {len(out)} evaluated ({len(self.order)} in all), "
            f"best {best.metric:.4g} at {best.cost:.4g} {self.cost.unit}"
        )
        return out

    def result(self, generations: int, stopped: str | None) -> SearchResult:
        return SearchResult(
            self.method,
            min(self.order, key=self.rank),
            list(self.order),
            generations,
            self.limit,
            self.cost.name,
            self.higher_is_better,
            stopped,
        )


_EXHAUSTED = "no new sub-network within the budget could be found (the feasible space is exhausted)"


def _mutate(g: Genome, space: SearchSpace, rng: random.Random, p: float) -> Genome:
    def redraw(value, options):
        return rng.choice(options) if rng.random() < p else value

    return Genome(
        tuple(redraw(d, space.depths) for d in g.depths),
        tuple(tuple(redraw(k, space.kernel_sizes) for k in row) for row in g.kernels),
        tuple(tuple(redraw(e, space.expand_ratios) for e in row) for row in g.expands),
    )


def _crossover(a: Genome, b: Genome, rng: random.Random) -> Genome:
    def pick(x, y):
        return x if rng.random() < 0.5 else y

    return Genome(
        tuple(pick(x, y) for x, y in zip(a.depths, b.depths, strict=True)),
        tuple(
            tuple(pick(x, y) for x, y in zip(ra, rb, strict=True))
            for ra, rb in zip(a.kernels, b.kernels, strict=True)
        ),
        tuple(
            tuple(pick(x, y) for x, y in zip(ra, rb, strict=True))
            for ra, rb in zip(a.expands, b.expands, strict=True)
        ),
    )


def evolutionary_search(
    space: SearchSpace,
    cost: CostModel,
    limit: float,
    evaluator: Evaluator,
    settings: EvolutionSettings = EvolutionSettings(),
    *,
    higher_is_better: bool = True,
    progress: Callable[[str], None] | None = None,
) -> SearchResult:
    """The best sub-network within ``cost(cfg) <= limit`` found with ``settings.evaluations`` evaluations.

    Generation 0 is ``population`` random feasible sub-networks; each later generation keeps the best
    ``parent_fraction`` as parents and evaluates ``population - parents`` new children (mutations and
    crossovers, topped up with random ones if too few new children turn up).
    """
    s = _Search("evolution", space, cost, limit, evaluator, higher_is_better, settings.seed,
                settings.max_tries, progress)  # fmt: skip
    budget = settings.evaluations
    initial = s.fresh(s.random_genome, min(settings.population, budget), set())
    population = s.evaluate(initial, 0)
    n_parents = max(1, round(settings.population * settings.parent_fraction))
    n_children = max(1, settings.population - n_parents)
    n_mutations = round(n_children * settings.mutation_fraction)
    generation, stopped = 0, None
    while len(s.order) < budget:
        generation += 1
        parents = sorted(population, key=s.rank)[:n_parents]
        want = min(n_children, budget - len(s.order))
        taken: set[str] = set()

        def mutant(parents: list[Candidate] = parents) -> Genome:
            return _mutate(s.rng.choice(parents).genome, space, s.rng, settings.mutation_prob)

        def cross(parents: list[Candidate] = parents) -> Genome:
            a, b = s.rng.sample(parents, 2) if len(parents) >= 2 else (parents[0], parents[0])
            return _crossover(a.genome, b.genome, s.rng)

        children = s.fresh(mutant, min(n_mutations, want), taken)
        children += s.fresh(cross, want - len(children), taken)
        children += s.fresh(s.random_genome, want - len(children), taken)
        if not children:
            stopped = _EXHAUSTED
            break
        population = parents + s.evaluate(children, generation)
    return s.result(generation + 1, stopped)


def random_search(
    space: SearchSpace,
    cost: CostModel,
    limit: float,
    evaluator: Evaluator,
    evaluations: int,
    *,
    batch: int = 16,
    seed: int = 0,
    max_tries: int = 50,
    higher_is_better: bool = True,
    progress: Callable[[str], None] | None = None,
) -> SearchResult:
    """The baseline: ``evaluations`` distinct random sub-networks within the budget (drawn like
    evolution's generation 0, in batches of ``batch``); the best of them."""
    if evaluations < 1:
        raise ValueError(f"evaluations: need at least 1, got {evaluations}")
    s = _Search("random", space, cost, limit, evaluator, higher_is_better, seed, max_tries, progress)
    generation, stopped = 0, None
    while len(s.order) < evaluations:
        genomes = s.fresh(s.random_genome, min(batch, evaluations - len(s.order)), set())
        if not genomes:
            stopped = _EXHAUSTED
            break
        s.evaluate(genomes, generation)
        generation += 1
    if not s.order:
        raise ValueError("random search: no sub-network could be evaluated")
    return s.result(generation, stopped)
