"""Sub-network search: the search loop, constraint handling, distributed evaluation, the predictor,
the Pareto front and the latency table's structure (never its timing values: the machine is shared)."""

from __future__ import annotations

import copy
import json
import math
import random

import pytest
import torch

from supernet.checkpoint import load_checkpoint, save_trained
from supernet.classification import ClassificationSupernet
from supernet.config import SearchSpace, SubnetConfig
from supernet.search.accuracy import DirectEvaluator
from supernet.search.cost import FlopsCost, InfeasibleBudget, LatencyCost, check_budget
from supernet.search.distributed import (
    DistributedEvaluator,
    SpotChecks,
    answer_share,
    merge_results,
    read_share_answer,
    share_request,
    split_work,
)
from supernet.search.evolution import Candidate, EvolutionSettings, Genome, evolutionary_search, random_search
from supernet.search.latency import (
    LatencyTable,
    LatencyTableError,
    build_latency_table,
    entry_key,
    load_or_build,
    mean_abs_pct_error,
    unit_shapes,
    validate,
)
from supernet.search.pareto import format_front, pareto_front, plot_front
from supernet.search.predictor import AccuracyPredictor, encode, fit_with_holdout
from supernet.search.timing import example_inputs
from supernet.training.loop import train
from supernet.workload import workload_for
from tests.supernet.threads import single_torch_thread  # noqa: F401

TINY = dict(width_mult=0.25, head_channels=64, channel_divisor=4)
INPUT = (1, 32, 32)


@pytest.fixture(scope="module")
def net() -> ClassificationSupernet:
    return ClassificationSupernet(10, 1, **TINY).eval()


class ProxyEvaluator:
    """A real evaluator with a known landscape: log-FLOPs (bigger is better) plus a fixed per-config
    wobble from its hash. Instant, so the search logic can be tested on hundreds of evaluations."""

    def __init__(self, net: ClassificationSupernet) -> None:
        self.net = net
        self.count = 0

    def evaluate(self, configs):
        self.count += len(configs)
        return {
            c.hash: math.log(self.net.flops(c, INPUT)) + 0.05 * int(c.hash[:8], 16) / 2**32 for c in configs
        }


# --------------------------------------------------------------------------------------------------
# The search loop and its constraint handling
# --------------------------------------------------------------------------------------------------


def test_tabulated_flops_equal_the_supernets_count():
    from supernet.stereo.model import StereoSupernet

    stereo = StereoSupernet(widths=(8, 8, 16, 16, 16, 16), stem_channels=8, max_displacement=2)
    rng = random.Random(0)
    for model, size in ((ClassificationSupernet(10, 1, **TINY), INPUT), (stereo, (64, 128))):
        cost = FlopsCost(model, size)
        assert not cost.exact  # the table agreed with net.flops on its probes
        for cfg in [model.space.largest(), *(model.space.sample(rng) for _ in range(30))]:
            assert cost(cfg) == model.flops(cfg, size) / 1e6


def test_evolution_spends_exactly_its_evaluations_inside_the_budget(net):
    cost = FlopsCost(net, INPUT)
    limit = 0.5 * cost(net.largest_config())
    evaluator = ProxyEvaluator(net)
    settings = EvolutionSettings(evaluations=60, population=12, seed=3)
    result = evolutionary_search(net.space, cost, limit, evaluator, settings)
    assert result.evaluations == 60 == evaluator.count
    assert len({c.hash for c in result.candidates}) == 60  # never evaluates a sub-network twice
    assert all(c.cost <= limit for c in result.candidates)
    assert all(net.space.contains(c.config) for c in result.candidates)
    assert result.best.metric == max(c.metric for c in result.candidates)
    assert result.generations >= 5 and result.stopped_early is None


def test_evolution_finds_at_least_what_random_search_finds_with_as_many_evaluations(net):
    cost = FlopsCost(net, INPUT)
    limit = 0.5 * cost(net.largest_config())
    for seed in range(3):
        evo = evolutionary_search(
            net.space,
            cost,
            limit,
            ProxyEvaluator(net),
            EvolutionSettings(evaluations=80, population=16, seed=seed),
        )
        rnd = random_search(net.space, cost, limit, ProxyEvaluator(net), 80, seed=seed)
        assert rnd.evaluations == 80
        assert evo.best.metric >= rnd.best.metric
        assert evo.best.cost > 0.9 * limit  # the proxy rewards using the budget; evolution gets close


def test_search_is_a_function_of_the_seed(net):
    cost = FlopsCost(net, INPUT)
    limit = 0.6 * cost(net.largest_config())

    def run(seed):
        result = evolutionary_search(
            net.space,
            cost,
            limit,
            ProxyEvaluator(net),
            EvolutionSettings(evaluations=30, population=8, seed=seed),
        )
        return [c.hash for c in result.candidates]

    assert run(1) == run(1)
    assert run(1) != run(2)


def test_budget_below_the_smallest_subnetwork_is_reported_not_searched(net):
    cost = FlopsCost(net, INPUT)
    floor = cost(net.smallest_config())
    evaluator = ProxyEvaluator(net)
    with pytest.raises(InfeasibleBudget, match=r"infeasible budget, below the smallest sub-network's"):
        evolutionary_search(net.space, cost, 0.99 * floor, evaluator, EvolutionSettings(evaluations=10))
    with pytest.raises(InfeasibleBudget):
        random_search(net.space, cost, 0.5 * floor, evaluator, 10)
    for bad in (0, -1.0, float("nan"), float("inf")):
        with pytest.raises(InfeasibleBudget, match="positive number"):
            check_budget(cost, bad)
    assert evaluator.count == 0


def test_a_budget_only_the_smallest_meets_ends_the_search_instead_of_looping(net):
    cost = FlopsCost(net, INPUT)
    floor = cost(net.smallest_config())  # multiply-adds grow with every choice: only the smallest fits
    evo = evolutionary_search(net.space, cost, floor, ProxyEvaluator(net), EvolutionSettings(evaluations=20))
    assert [c.config for c in evo.candidates] == [net.smallest_config()]
    assert "exhausted" in evo.stopped_early
    rnd = random_search(net.space, cost, floor, ProxyEvaluator(net), 20)
    assert rnd.evaluations == 1 and rnd.stopped_early


def test_tight_budgets_are_met_by_repair_when_random_draws_never_fit(net):
    cost = FlopsCost(net, INPUT)
    floor = cost(net.smallest_config())
    limit = 1.03 * floor  # a random draw essentially never fits; repaired draws always do
    rng = random.Random(0)
    assert sum(cost(net.space.sample(rng)) <= limit for _ in range(300)) == 0
    result = evolutionary_search(
        net.space,
        cost,
        limit,
        ProxyEvaluator(net),
        EvolutionSettings(evaluations=12, population=6, max_tries=3),
    )
    assert result.evaluations == 12 and all(c.cost <= limit for c in result.candidates)


def test_latency_budget_uses_the_tables_true_cheapest_subnetwork():
    space = SearchSpace(kernel_sizes=(3, 5), expand_ratios=(3, 6), depths=(1, 2), num_units=2)
    entries = {}
    for u in range(2):
        for b in (0, 1):
            for k in space.kernel_sizes:
                for e in space.expand_ratios:
                    # not monotone: the 5x5 kernel is the faster one in unit 1
                    entries[entry_key(u, b, k, e)] = 1.0 + 0.1 * e + (0.5 if (k == 5) == (u == 0) else 0.0)
    table = LatencyTable("synthetic", "cpu", entries, fixed_ms=0.5, scale=1.2)
    cheapest = table.cheapest(space)
    assert cheapest == SubnetConfig([1, 1], [[3], [5]], [[3], [3]])
    cost = LatencyCost(table, space)
    rng = random.Random(0)
    assert all(cost(cheapest) <= cost(space.sample(rng)) for _ in range(200))
    assert check_budget(cost, cost(cheapest)) == cheapest
    with pytest.raises(InfeasibleBudget, match="ms"):
        check_budget(cost, cost(cheapest) - 1e-6)

    class Depth:
        def evaluate(self, configs):
            return {c.hash: float(sum(c.depths)) + 0.01 * sum(map(sum, c.kernel_sizes)) for c in configs}

    limit = cost(cheapest) + 1.5
    result = evolutionary_search(space, cost, limit, Depth(), EvolutionSettings(evaluations=15, population=5))
    assert all(c.cost <= limit for c in result.candidates)


def test_mutated_genomes_keep_inactive_genes():
    space = SearchSpace(num_units=2)
    g = Genome((2, 4), ((3, 5, 7, 7), (3, 3, 5, 7)), ((3, 4, 6, 6), (3, 3, 4, 6)))
    assert g.config() == SubnetConfig([2, 4], [[3, 5], [3, 3, 5, 7]], [[3, 4], [3, 3, 4, 6]])
    assert Genome.of(g.config(), space).config() == g.config()


# --------------------------------------------------------------------------------------------------
# Distributed evaluation (real evaluators, in-process)
# --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny digits supernet after a few training steps, as a checkpoint loaded back."""
    workload = workload_for("digits", dict(TINY, total_steps=4, batch_size=32, bn_calibration_batches=1,
                                           eval_random_subnets=0, log_every=0))  # fmt: skip
    result = train(workload.cfg, workload.task, progress=lambda line: None)
    path = save_trained(tmp_path_factory.mktemp("ckpt") / "tiny.pt", workload, result["net"], round_index=3)
    return load_checkpoint(path)


def helpers(loaded, n):
    return [DirectEvaluator(loaded.workload, copy.deepcopy(loaded.net), val_samples=40) for _ in range(n)]


def test_split_work_is_disjoint_complete_and_deterministic():
    rng = random.Random(0)
    configs = [SearchSpace().sample(rng) for _ in range(40)]
    for n in (1, 2, 3, 5):
        shares = split_work(configs + configs[:5], n)  # duplicates are evaluated once
        assert len(shares) == n
        flat = [c.hash for share in shares for c in share]
        assert sorted(flat) == sorted({c.hash for c in configs})
        assert max(map(len, shares)) - min(map(len, shares)) <= 1  # balanced
        assert split_work(list(reversed(configs)), n) == shares  # order of the request does not matter


def test_search_result_is_identical_with_one_two_or_three_helpers(trained):
    space = trained.net.space
    cost = FlopsCost(trained.net, trained.workload.input_size)
    limit = 0.6 * cost(space.largest())
    settings = EvolutionSettings(evaluations=12, population=6, seed=5)
    outcomes, counts = [], []
    for n in (1, 2, 3):
        workers = helpers(trained, n)
        result = evolutionary_search(space, cost, limit, DistributedEvaluator(workers), settings)
        outcomes.append([(c.hash, c.metric) for c in result.candidates] + [result.best.hash])
        counts.append([w.count for w in workers])
    assert outcomes[0] == outcomes[1] == outcomes[2]
    assert len({m for _, m in outcomes[0][:-1]}) > 1  # real, varied accuracies
    assert all(sum(c) == 12 for c in counts) and all(x > 0 for x in counts[2])  # the work was shared


def test_a_failing_helper_is_covered_by_the_fallback_with_the_same_values(trained):
    rng = random.Random(1)
    configs = [trained.net.space.sample(rng) for _ in range(4)]

    class Offline:
        def evaluate(self, configs):
            raise ConnectionError("peer went away")

    local = helpers(trained, 1)[0]
    reference = local.evaluate(configs)
    distributed = DistributedEvaluator([Offline(), *helpers(trained, 1)], fallback=local)
    assert distributed.evaluate(configs) == dict(sorted(reference.items()))
    with pytest.raises(ConnectionError):
        DistributedEvaluator([Offline(), Offline()]).evaluate(configs)


class Liar:
    """A real evaluator that answers ``1 - value`` except for the hashes in ``spare``: a peer that
    tries to steer the search."""

    def __init__(self, inner: DirectEvaluator, spare: frozenset[str] = frozenset()) -> None:
        self.inner, self.spare, self.count = inner, spare, 0

    def evaluate(self, configs):
        self.count += len(configs)
        return {k: v if k in self.spare else 1.0 - v for k, v in self.inner.evaluate(configs).items()}


def test_spot_checks_choose_a_secret_keyed_fraction_and_at_least_one_per_share():
    rng = random.Random(3)
    configs = list({c.hash: c for c in (SearchSpace().sample(rng) for _ in range(400))}.values())
    checks = SpotChecks(0.25, key=b"k" * 32)
    chosen = checks.choose(configs)
    assert 0.18 < len(chosen) / len(configs) < 0.32 and chosen == checks.choose(list(reversed(configs)))[::-1]
    assert {c.hash for c in SpotChecks(0.25, key=b"j" * 32).choose(configs)} != {c.hash for c in chosen}
    assert len(SpotChecks(1e-9, key=b"k" * 32).choose(configs[:3])) == 1  # never an unchecked share
    assert SpotChecks(0.0).choose(configs) == [] and SpotChecks(0.5).choose([]) == []
    assert SpotChecks(0.5).key != SpotChecks(0.5).key  # random per search
    with pytest.raises(ValueError, match="fraction"):
        SpotChecks(1.5)
    with pytest.raises(ValueError, match="fallback"):
        DistributedEvaluator([ProxyEvaluator(ClassificationSupernet(10, 1, **TINY))], checks=SpotChecks(0.1))


def test_a_lying_helper_is_caught_its_shares_redone_and_the_values_stay_local(trained):
    rng = random.Random(4)
    batches = [[trained.net.space.sample(rng) for _ in range(6)] for _ in range(3)]
    local = helpers(trained, 1)[0]
    reference = [dict(sorted(local.evaluate(b).items())) for b in batches]
    honest, liar = helpers(trained, 1)[0], Liar(helpers(trained, 1)[0])
    checks = SpotChecks(0.1)
    distributed = DistributedEvaluator([honest, liar], fallback=local, checks=checks)
    assert [distributed.evaluate(b) for b in batches] == reference
    assert checks.untrusted == {1} and distributed.failures == 1
    assert checks.of(0) == {
        "verified": checks.checked[0],
        "mismatches": 0,
        "discarded": 0,
        "untrusted": False,
    }
    assert checks.of(1)["mismatches"] == checks.of(1)["verified"] >= 1 and checks.of(1)["discarded"] == 3
    assert liar.count == 3 and honest.count == 3 + 6 + 6  # one share, then the other takes whole batches

    # The limit, and why the key is secret: a liar that knew it would lie only where nobody looks.
    key = b"leaked" * 4
    spared = frozenset(c.hash for b in batches for c in SpotChecks(0.1, key=key).choose(split_work(b, 2)[1]))
    checks = SpotChecks(0.1, key=key)
    distributed = DistributedEvaluator([honest, Liar(local, spared)], fallback=local, checks=checks)
    assert distributed.evaluate(batches[0]) != reference[0] and not checks.untrusted


def test_honest_helpers_under_spot_checks_give_identical_values_and_stay_trusted(trained):
    rng = random.Random(5)
    configs = [trained.net.space.sample(rng) for _ in range(7)]
    local = helpers(trained, 1)[0]
    reference = dict(sorted(local.evaluate(configs).items()))
    checks = SpotChecks(0.3)
    distributed = DistributedEvaluator(helpers(trained, 3), fallback=local, checks=checks)
    assert distributed.evaluate(configs) == reference
    assert not checks.untrusted and not checks.mismatches and distributed.failures == 0
    assert all(checks.of(i)["verified"] >= 1 for i in range(3))  # every share checked at least once


def test_share_messages_round_trip_and_merge_checks(trained):
    rng = random.Random(2)
    configs = [trained.net.space.sample(rng) for _ in range(3)]
    request = json.loads(json.dumps(share_request(configs)))  # survives JSON transport
    answer = json.loads(json.dumps(answer_share(helpers(trained, 1)[0], request, trained.net.space)))
    results = read_share_answer(answer)
    assert set(results) == {c.hash for c in configs}
    assert merge_results([configs], [results]) == dict(sorted(results.items()))
    with pytest.raises(ValueError, match="helper 0: results for the wrong configs"):
        merge_results([configs], [dict(list(results.items())[:2])])
    with pytest.raises(ValueError, match="not a finite number"):
        merge_results([configs[:1]], [{configs[0].hash: float("nan")}])
    with pytest.raises(ValueError, match="not a manta-search-share"):
        answer_share(helpers(trained, 1)[0], {"kind": "other"})

    # Helpers refuse work whose evaluation settings differ from theirs (values would differ).
    helper = helpers(trained, 1)[0]
    other = DirectEvaluator(trained.workload, trained.net, val_samples=40, seed=1)  # another subset
    assert other.settings != helper.settings
    request = share_request(configs, {**other.settings, "digest": trained.digest})
    with pytest.raises(ValueError, match="settings differ from this helper's \\(val_indices\\)"):
        answer_share(helper, request, settings={**helper.settings, "digest": trained.digest})
    same = share_request(configs, {**helper.settings, "digest": trained.digest})
    assert (
        read_share_answer(answer_share(helper, same, settings={**helper.settings, "digest": trained.digest}))
        == results
    )


# --------------------------------------------------------------------------------------------------
# Predictor and Pareto front
# --------------------------------------------------------------------------------------------------


def test_predictor_learns_the_landscape_better_than_the_mean(net):
    space = net.space
    vector = encode(space.largest(), space)
    assert len(vector) == space.num_units * (3 + 4 * (3 + 3)) and set(vector) == {0.0, 1.0}
    rng = random.Random(0)
    configs = [space.sample(rng) for _ in range(150)]
    values = list(ProxyEvaluator(net).evaluate(configs).values())
    predictor, report = fit_with_holdout(space, configs, values, seed=0, epochs=400)
    assert report["n_test"] == 30 and report["n_train"] == 120
    assert report["rmse"] < 0.6 * report["mean_rmse"]
    again = AccuracyPredictor(space, seed=0).fit(configs[:50], values[:50], epochs=50)
    same = AccuracyPredictor(space, seed=0).fit(configs[:50], values[:50], epochs=50)
    assert again.predict(configs[-3:]) == same.predict(configs[-3:])  # same seed and data, same predictor
    assert again.predict([]) == []


def _candidate(cost, metric, depth):
    cfg = SubnetConfig.uniform(5, depth, 3, 3) if depth in (2, 3, 4) else SubnetConfig.uniform(5, 2, 5, 3)
    return Candidate(cfg, metric, cost, "test", 0, Genome.of(cfg, SearchSpace()))


def test_pareto_front_table_and_plot(tmp_path):
    points = [
        _candidate(1.0, 0.90, 2),
        _candidate(2.0, 0.95, 3),
        _candidate(3.0, 0.93, 4),
        _candidate(2.5, 0.96, 5),
    ]
    front = pareto_front(points)
    assert [(c.cost, c.metric) for c in front] == [(1.0, 0.90), (2.0, 0.95), (2.5, 0.96)]
    lower = pareto_front(points, higher_is_better=False)  # e.g. EPE
    assert [(c.cost, c.metric) for c in lower] == [(1.0, 0.90)]
    text = format_front(front, "accuracy", [("MFLOPs", lambda c: f"{c.cost:.1f}")])
    assert text.splitlines()[0].split()[:3] == ["MFLOPs", "accuracy", "(%)"] and "96.00" in text
    path = plot_front(tmp_path / "front.png", [("test", points)], higher_is_better=True, metric_label="accuracy",
                      cost_label="MFLOPs", limit=3.0, chosen=front[-1])  # fmt: skip
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000


# --------------------------------------------------------------------------------------------------
# Latency table: structure, reuse, validation (no timing values asserted)
# --------------------------------------------------------------------------------------------------

QUICK = dict(warmup=1, repeats=3, calibration=3)


def test_latency_table_structure_prediction_and_reuse(net, tmp_path):
    cpu = torch.device("cpu")
    path = tmp_path / "latency.json"
    table, how = load_or_build(path, net, "classification", INPUT, cpu, **QUICK)
    assert how == "built" and path.exists()
    space = net.space
    assert len(table.entries) == space.num_units * 2 * len(space.kernel_sizes) * len(space.expand_ratios)
    assert all(math.isfinite(v) and v > 0 for v in table.entries.values())
    assert table.scale > 0 and table.fixed_ms >= 0 and len(table.meta["calibration"]) == 3
    assert table.meta["threads"] == 1 and table.meta["batch"] == 1
    rng = random.Random(0)
    for cfg in [space.largest(), space.smallest(), *(space.sample(rng) for _ in range(20))]:
        assert math.isfinite(table.predict(cfg)) and table.predict(cfg) > 0
    assert all(table.predict(table.cheapest(space)) <= table.predict(space.sample(rng)) for _ in range(50))

    before = path.read_text()
    again, how = load_or_build(path, net, "classification", INPUT, cpu, **QUICK)
    assert how == "reused" and again.entries == table.entries and path.read_text() == before
    _, how = load_or_build(path, net, "classification", (1, 40, 40), cpu, **QUICK)
    assert how == "rebuilt"  # made for another input size
    other = ClassificationSupernet(10, 1, width_mult=0.5, head_channels=64)
    assert load_or_build(path, other, "classification", INPUT, cpu, **QUICK)[1] == "rebuilt"

    rows = validate(
        table,
        net,
        "classification",
        INPUT,
        cpu,
        [space.sample(rng) for _ in range(3)],
        **dict(warmup=1, repeats=3),
    )
    assert len(rows) == 3 and all(r["measured_ms"] > 0 and math.isfinite(r["error_pct"]) for r in rows)
    assert mean_abs_pct_error(rows) >= 0


def test_a_file_that_is_not_a_latency_table_is_refused_not_overwritten(net, tmp_path):
    path = tmp_path / "notes.json"
    path.write_text('{"mine": true}')
    with pytest.raises(LatencyTableError, match="not a MANTA latency table"):
        load_or_build(path, net, "classification", INPUT, torch.device("cpu"), **QUICK)
    assert path.read_text() == '{"mine": true}'


def test_stereo_latency_table_sees_the_siamese_batch():
    from supernet.stereo.model import StereoSupernet

    stereo = StereoSupernet(widths=(8, 8, 16, 16, 16, 16), stem_channels=8, max_displacement=2).eval()
    inputs = example_inputs("stereo", (64, 128), torch.device("cpu"))
    shapes = unit_shapes(stereo, inputs)
    assert [s[0][0] for s in shapes] == [2, 2, 2, 1, 1, 1]  # encoder: left and right in one batch
    assert shapes[0][0] == (2, 8, 64, 128) and shapes[5][1][-2:] == (1, 2)
    table = build_latency_table(stereo, "stereo", (64, 128), torch.device("cpu"), **QUICK)
    assert len(table.entries) == 6 * 2 * 9
    assert (
        math.isfinite(table.predict(stereo.largest_config())) and table.predict(stereo.smallest_config()) > 0
    )
