"""Spreading a generation's evaluations over helpers, with a result that does not depend on them.

The rule that makes it deterministic: a candidate's metric is a function of the checkpoint and the
config only (:class:`~supernet.search.accuracy.DirectEvaluator` evaluates every config on the same
fixed validation subset after the same BN recalibration), so it does not matter who computes it.
The search consumes results by config hash, never by arrival order, so merging the shares of any
number of helpers gives the identical search.

* :func:`split_work` — the share of each of N helpers: the distinct configs sorted by hash and dealt
  out in turn (the i-th goes to helper ``i mod N``), so shares differ in size by at most one.
* :func:`merge_results` — checks that each helper answered exactly its share with finite values and
  returns one ``{hash: value}`` ordered by hash.
* :class:`DistributedEvaluator` — the two around a list of helpers (any objects with
  ``evaluate(configs) -> {hash: value}``), optionally in parallel (``map_fn``), with a ``fallback``
  evaluator for shares whose helper failed.

Over the network (``manta-aggregator search``, :mod:`aggregator.search_dispatch`): the aggregator
wraps each online peer in an object whose ``evaluate(configs)`` sends a signed request carrying
``share_request(configs, settings)`` (``settings``: its ``DirectEvaluator.settings`` plus the
checkpoint digest), the checkpoint's hash and :func:`evaluator_arguments`, and returns
:func:`read_share_answer` of the reply; it passes the list to ``run_search(options, say,
helpers=..., map_fn=...)``. A peer (:mod:`peer.search_service`) downloads and checks the checkpoint,
builds its evaluator with :func:`evaluator_from_arguments` and answers with ``answer_share(evaluator,
request, net.space, settings=its settings + its checkpoint digest)``, which refuses other settings.
"Each peer evaluates on its validation shard" is thus the *same* fixed validation subset on every
peer: a subset per peer would make a config's value, and so the search, depend on the peer count.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from supernet.config import SearchSpace, SubnetConfig
from supernet.search.accuracy import DirectEvaluator, Evaluator, check_results

__all__ = [
    "DistributedEvaluator",
    "answer_share",
    "evaluator_arguments",
    "evaluator_from_arguments",
    "merge_results",
    "read_share_answer",
    "share_request",
    "split_work",
]

log = logging.getLogger(__name__)

MESSAGE = "manta-search-share"
VERSION = 1


def split_work(configs: Iterable[SubnetConfig], helpers: int) -> list[list[SubnetConfig]]:
    """One share per helper (empty when there are more helpers than configs): the distinct configs
    sorted by hash, dealt out in turn. Depends only on the set of configs and ``helpers``."""
    if helpers < 1:
        raise ValueError(f"helpers: need at least one, got {helpers}")
    unique = {c.hash: c for c in configs}
    shares: list[list[SubnetConfig]] = [[] for _ in range(helpers)]
    for i, key in enumerate(sorted(unique)):
        shares[i % helpers].append(unique[key])
    return shares


def merge_results(
    shares: Sequence[Sequence[SubnetConfig]], results: Sequence[Mapping[str, float]]
) -> dict[str, float]:
    """All helpers' results as one ``{hash: value}`` sorted by hash; ``ValueError`` if any helper
    answered for configs other than exactly its share, or with a non-finite value."""
    if len(shares) != len(results):
        raise ValueError(f"merge: {len(results)} results for {len(shares)} shares")
    merged: dict[str, float] = {}
    for i, (share, result) in enumerate(zip(shares, results, strict=True)):
        check_results(share, dict(result), who=f"helper {i}")
        merged.update({k: float(v) for k, v in result.items()})
    return dict(sorted(merged.items()))


class DistributedEvaluator:
    """An :class:`Evaluator` that splits each request over ``helpers`` and merges their answers.

    ``map_fn(fn, items)`` runs ``fn`` over the (helper, share) pairs (default: the built-in ``map``,
    one after another; pass an executor's ``map`` for parallel helpers). A helper that raises has
    its share evaluated by ``fallback`` if given (else the error propagates); either way the values
    are the same, so the result is too. Fallback evaluations run one at a time even under a parallel
    ``map_fn``: a :class:`DirectEvaluator` recalibrates the BN statistics of its one supernet in place.
    """

    def __init__(
        self,
        helpers: Sequence[Evaluator],
        *,
        map_fn: Callable[[Callable[[Any], Any], Iterable[Any]], Iterable[Any]] | None = None,
        fallback: Evaluator | None = None,
    ) -> None:
        if not helpers:
            raise ValueError("helpers: need at least one evaluator")
        self.helpers = list(helpers)
        self.map_fn = map_fn or map
        self.fallback = fallback
        self.failures = 0
        self._fallback_lock = threading.Lock()

    def _run(self, job: tuple[int, Sequence[SubnetConfig]]) -> dict[str, float]:
        index, share = job
        if not share:
            return {}
        try:
            return dict(self.helpers[index].evaluate(share))
        except Exception as e:  # a remote helper may fail in any way; its share is redone locally
            if self.fallback is None:
                raise
            self.failures += 1
            log.warning("helper %d failed (%s: %s); evaluating its %d configs locally", index,
                        type(e).__name__, e, len(share))  # fmt: skip
            with self._fallback_lock:
                return dict(self.fallback.evaluate(share))

    def evaluate(self, configs: Sequence[SubnetConfig]) -> dict[str, float]:
        shares = split_work(configs, len(self.helpers))
        results = list(self.map_fn(self._run, list(enumerate(shares))))
        return merge_results(shares, results)


def evaluator_arguments(evaluator: DirectEvaluator, seed: int) -> dict[str, int]:
    """What a helper builds the same evaluator from (``seed``: the one ``evaluator`` was built with):
    resolved values, so a helper cannot read "all samples" or "the checkpoint's batches" otherwise."""
    return {
        "val_samples": evaluator.val_samples,
        "bn_batches": int(evaluator.workload.cfg.bn_calibration_batches),
        "seed": int(seed),
    }


def evaluator_from_arguments(workload: Any, net: Any, arguments: Mapping[str, Any]) -> DirectEvaluator:
    """The :class:`DirectEvaluator` that :func:`evaluator_arguments` describes, on a helper's own copy
    of the checkpoint; ``ValueError`` if the arguments are not three positive integers."""
    values = {}
    for name in ("val_samples", "bn_batches", "seed"):
        value = arguments.get(name)
        if not isinstance(value, int) or isinstance(value, bool) or value < (0 if name == "seed" else 1):
            raise ValueError(f"evaluator arguments: {name} must be a non-negative integer, got {value!r}")
        values[name] = value
    return DirectEvaluator(workload, net, **values)


# --------------------------------------------------------------------------------------------------
# Wire format (plain JSON-able dicts; the transport is the network layer's business)
# --------------------------------------------------------------------------------------------------


def share_request(
    configs: Sequence[SubnetConfig], settings: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The message asking a helper to evaluate ``configs``. ``settings`` (e.g. the aggregator's
    ``DirectEvaluator.settings`` plus the checkpoint digest) must equal the helper's own, or it refuses:
    values computed under other settings would change the search."""
    message = {"kind": MESSAGE, "version": VERSION, "configs": [c.to_dict() for c in configs]}
    if settings is not None:
        message["settings"] = dict(settings)
    return message


def answer_share(
    evaluator: Evaluator,
    request: Mapping[str, Any],
    space: SearchSpace | None = None,
    settings: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Evaluate a :func:`share_request` on this helper.

    ``space`` (the supernet's) validates the configs; ``settings`` are this helper's evaluation
    settings, compared with the request's (``ValueError`` if they differ).
    """
    if request.get("kind") != MESSAGE or request.get("version") != VERSION:
        raise ValueError(f"request: not a {MESSAGE} version {VERSION} message")
    wanted = request.get("settings")
    if wanted is not None and settings is not None and dict(wanted) != dict(settings):
        differ = sorted(k for k in set(wanted) | set(settings) if wanted.get(k) != settings.get(k))
        raise ValueError(f"request: evaluation settings differ from this helper's ({', '.join(differ)})")
    configs = [SubnetConfig.from_dict(c, space) for c in request.get("configs", [])]
    results = evaluator.evaluate(configs)
    check_results(configs, results)
    return {"kind": MESSAGE, "version": VERSION, "results": dict(sorted(results.items()))}


def read_share_answer(answer: Mapping[str, Any]) -> dict[str, float]:
    """The ``{hash: value}`` of a helper's :func:`answer_share` reply (checked by :func:`merge_results`)."""
    if answer.get("kind") != MESSAGE or answer.get("version") != VERSION:
        raise ValueError(f"answer: not a {MESSAGE} version {VERSION} message")
    results = answer.get("results")
    if not isinstance(results, dict):
        raise ValueError("answer: no results")
    return {str(k): float(v) for k, v in results.items()}
