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
* :class:`SpotChecks` — because honest values equal local ones exactly, the fallback can re-evaluate
  a secret, keyed choice of each helper's configs and compare with ``==``: one mismatch and the
  helper's whole share is redone locally and the helper gets no further shares in that search. The
  limit: a share that passes its checks is used as answered, so a helper lying on a few values of a
  share goes unnoticed with the probability that the checks miss all of them. The key is random per
  search (:func:`secrets.token_bytes`) and never sent, so no helper can tell which values are checked.

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

import hashlib
import hmac
import logging
import secrets
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from supernet.config import SearchSpace, SubnetConfig
from supernet.search.accuracy import DirectEvaluator, Evaluator, check_results

__all__ = [
    "DistributedEvaluator",
    "SpotChecks",
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


@dataclass
class SpotChecks:
    """Which of a helper's configs are re-evaluated locally, and what the checks found.

    A config is checked when the keyed HMAC-SHA256 of its hash, read as a number in [0, 1), falls
    below ``fraction``; a non-empty share with none below gets its lowest one checked, so every share
    is checked at least once when ``fraction`` > 0. ``key`` must stay secret from the helpers (a
    helper that knew it would lie only on unchecked configs). The counters are per helper index.
    """

    fraction: float = 0.0
    key: bytes = field(default_factory=lambda: secrets.token_bytes(32), repr=False)
    checked: dict[int, int] = field(default_factory=dict)  # configs re-evaluated locally
    mismatches: dict[int, int] = field(default_factory=dict)  # of which the helper's value differed
    discarded: dict[int, int] = field(default_factory=dict)  # configs of shares thrown away
    untrusted: set[int] = field(default_factory=set)  # helpers that get no further shares

    def __post_init__(self) -> None:
        if not 0.0 <= self.fraction <= 1.0:
            raise ValueError(f"spot checks: fraction must be in [0, 1], got {self.fraction}")
        if self.fraction > 0 and len(self.key) < 16:
            raise ValueError("spot checks: the key must have at least 16 bytes")

    def _draw(self, config: SubnetConfig) -> float:
        digest = hmac.new(self.key, config.hash.encode(), hashlib.sha256).digest()
        return int.from_bytes(digest[:8], "big") / 2**64

    def choose(self, share: Sequence[SubnetConfig]) -> list[SubnetConfig]:
        """The configs of ``share`` to re-evaluate (none when ``fraction`` is 0 or the share is empty)."""
        if self.fraction <= 0 or not share:
            return []
        draws = {c.hash: self._draw(c) for c in share}
        chosen = [c for c in share if draws[c.hash] < self.fraction]
        return chosen or [min(share, key=lambda c: (draws[c.hash], c.hash))]

    def of(self, index: int) -> dict[str, Any]:
        """Helper ``index``'s counts, JSON-able."""
        return {
            "verified": self.checked.get(index, 0),
            "mismatches": self.mismatches.get(index, 0),
            "discarded": self.discarded.get(index, 0),
            "untrusted": index in self.untrusted,
        }


class DistributedEvaluator:
    """An :class:`Evaluator` that splits each request over ``helpers`` and merges their answers.

    ``map_fn(fn, items)`` runs ``fn`` over the (helper, share) pairs (default: the built-in ``map``,
    one after another; pass an executor's ``map`` for parallel helpers). A helper that raises, or
    answers for other configs than its share, has its share evaluated by ``fallback`` if given (else
    the error propagates); either way the values are the same, so the result is too. Fallback
    evaluations run one at a time even under a parallel ``map_fn``: a :class:`DirectEvaluator`
    recalibrates the BN statistics of its one supernet in place.

    ``checks`` (needs ``fallback``): after a helper answers, :meth:`SpotChecks.choose` picks configs
    the fallback re-evaluates; any value that is not exactly the fallback's discards the whole share
    (redone by the fallback, counted in ``failures``) and makes the helper untrusted: later requests
    are dealt out over the trusted helpers only, or evaluated by the fallback when none is left.
    Values are merged by hash, so the result is still the fallback's value for every config.
    """

    def __init__(
        self,
        helpers: Sequence[Evaluator],
        *,
        map_fn: Callable[[Callable[[Any], Any], Iterable[Any]], Iterable[Any]] | None = None,
        fallback: Evaluator | None = None,
        checks: SpotChecks | None = None,
    ) -> None:
        if not helpers:
            raise ValueError("helpers: need at least one evaluator")
        if checks is not None and checks.fraction > 0 and fallback is None:
            raise ValueError("spot checks need a fallback evaluator to compare with")
        self.helpers = list(helpers)
        self.map_fn = map_fn or map
        self.fallback = fallback
        self.checks = checks or SpotChecks()
        self.failures = 0
        self._fallback_lock = threading.Lock()
        self._count_lock = threading.Lock()

    def _local(self, configs: Sequence[SubnetConfig]) -> dict[str, float]:
        assert self.fallback is not None
        if not configs:
            return {}
        with self._fallback_lock:
            return dict(self.fallback.evaluate(configs))

    def _count(self, counter: dict[int, int], index: int, n: int) -> None:
        with self._count_lock:
            counter[index] = counter.get(index, 0) + n

    def _run(self, job: tuple[int, Sequence[SubnetConfig]]) -> dict[str, float]:
        index, share = job
        if not share:
            return {}
        try:
            result = dict(self.helpers[index].evaluate(share))
            check_results(share, result, who=f"helper {index}")
        except Exception as e:  # a remote helper may fail in any way; its share is redone locally
            if self.fallback is None:
                raise
            with self._count_lock:
                self.failures += 1
            log.warning("helper %d failed (%s: %s); evaluating its %d configs locally", index,
                        type(e).__name__, e, len(share))  # fmt: skip
            return self._local(share)
        checked = self.checks.choose(share)
        if not checked:
            return result
        truth = self._local(checked)
        self._count(self.checks.checked, index, len(checked))
        wrong = sum(1 for c in checked if result[c.hash] != truth[c.hash])
        if not wrong:
            return result
        self._count(self.checks.mismatches, index, wrong)
        self._count(self.checks.discarded, index, len(share))
        with self._count_lock:
            self.failures += 1
            self.checks.untrusted.add(index)
        log.warning("helper %d: %d of %d spot-checked values differ from local ones; its share is redone "
                    "locally and it gets no further shares", index, wrong, len(checked))  # fmt: skip
        return {**truth, **self._local([c for c in share if c.hash not in truth])}

    def evaluate(self, configs: Sequence[SubnetConfig]) -> dict[str, float]:
        trusted = [i for i in range(len(self.helpers)) if i not in self.checks.untrusted]
        if not trusted:
            unique = list({c.hash: c for c in configs}.values())
            return dict(sorted(self._local(unique).items()))
        shares = split_work(configs, len(trusted))
        results = list(self.map_fn(self._run, list(zip(trusted, shares, strict=True))))
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
