"""A background input pipeline: the next mini-batches are decoded and augmented while the model trains
on the current one.

A worker's loop (:func:`supernet.contribution.compute_contribution`) that loads a batch, trains on it,
then loads the next leaves the device waiting while PIL decodes images and the augmentation runs. A
:class:`BatchPrefetcher` moves that work off the training thread:

* **decoding** — the dataset's ``__getitem__`` (a PIL decode and resize for image folders, a shard
  file read) — runs in a small pool of threads; PIL and torch release the GIL while they work;
* **collation and the random augmentation** run in one producer thread, batch after batch *in
  order*, so every batch draws from the augmentation generator exactly what it draws when batches are
  made one at a time in the loop: batch ``i`` is the same whether the pipeline runs ahead or not;
* a bounded queue (``depth`` batches) hands ready batches to the training loop.

Only the augmentation may draw from the generator that ``make_batch`` holds: the training step's own
draws (dropout) must come from another generator, or their interleaving with the producer's draws
would depend on timing. :func:`contribution_generators` gives the two, both seeded from
:func:`tasks.sharding.augmentation_seed`, so a peer and the aggregator replaying it in an audit draw
the same numbers.

Stopping: :meth:`BatchPrefetcher.close` (or leaving the ``with`` block) stops the producer, discards
the batches made ahead and joins every thread of the pipeline before it returns. An exception raised
while a batch is made (a dataset's ``__getitem__``, the augmentation) reaches the consumer, as itself,
when it asks for that batch; batches made before it are delivered first.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch.utils.data import Dataset
from torch.utils.data._utils.collate import default_collate

from supernet.config import derive_seed

__all__ = [
    "DEFAULT_DEPTH",
    "BatchPrefetcher",
    "BatchRecipe",
    "batch_maker",
    "contribution_generators",
    "default_decode_threads",
    "pin_batch",
    "batch_to_device",
]

DEFAULT_DEPTH = 2  # batches made ahead of the one the training step is on
_POLL_S = 0.05  # how often a blocked producer or consumer looks whether the pipeline was stopped


def default_decode_threads() -> int:
    """Decoding threads when none are asked for: up to 4, at most one per CPU."""
    return max(1, min(4, os.cpu_count() or 1))


def contribution_generators(seed: int) -> tuple[torch.Generator, torch.Generator]:
    """The augmentation generator (seeded with ``seed``, from
    :func:`tasks.sharding.augmentation_seed`) and the dropout generator (a seed derived from it) of one
    worker's round."""
    augmentation = torch.Generator().manual_seed(int(seed))
    dropout = torch.Generator().manual_seed(derive_seed("dropout", int(seed)) % (2**63))
    return augmentation, dropout


@dataclass(frozen=True)
class BatchRecipe:
    """How loaded samples become a training batch: ``collate`` (deterministic: may run in a decoding
    process), then ``augment`` (the random part, drawing from the recipe's generator: runs in order, in
    the producer thread). Calling the recipe on a list of samples does both."""

    collate: Callable[[list[Any]], Any]
    augment: Callable[[Any], Any] | None = None

    def __call__(self, samples: list[Any]) -> Any:
        batch = self.collate(samples)
        return batch if self.augment is None else self.augment(batch)


def _stereo_collate(samples: list[Any], channels_last: bool = False) -> Any:
    batch = default_collate(samples)
    if channels_last:
        for key in ("left", "right"):
            batch[key] = batch[key].contiguous(memory_format=torch.channels_last)
    return batch


def batch_maker(workload, generator: torch.Generator) -> BatchRecipe:
    """The recipe of :meth:`supernet.workload.Workload.batch`: the loaded samples of a batch collated
    and augmented as it does (with draws from ``generator``), for a :class:`BatchPrefetcher` that has
    already decoded them."""
    if workload.family == "stereo":
        return BatchRecipe(partial(_stereo_collate, channels_last=bool(workload.cfg.channels_last)))
    augmentation = workload.task.augmentation
    if augmentation is None:
        return BatchRecipe(default_collate)

    def augment(batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        inputs, targets = batch
        return augmentation(inputs, generator), targets

    return BatchRecipe(default_collate, augment)


def pin_batch(batch: Any) -> Any:
    """``batch`` (a tensor, or a tuple, list or dict of them) in page-locked memory."""
    return _map_tensors(batch, lambda t: t.pin_memory())


def batch_to_device(batch: Any, device: torch.device | str, non_blocking: bool = False) -> Any:
    """``batch`` (a tensor, or a tuple, list or dict of them) on ``device``."""
    return _map_tensors(batch, lambda t: t.to(device, non_blocking=non_blocking))


def _map_tensors(batch: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(batch, dict):
        return {k: _map_tensors(v, fn) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(_map_tensors(v, fn) for v in batch)
    return batch


class _Failure:
    def __init__(self, error: BaseException):
        self.error = error


class _IndexBatches:
    """The batch sampler of a decoding DataLoader: ``next_indices()`` for ever (read in the producer
    thread, in order)."""

    def __init__(self, next_indices: Callable[[], Sequence[int]]):
        self._next_indices = next_indices

    def __iter__(self) -> Iterator[list[int]]:
        while True:
            yield [int(i) for i in self._next_indices()]


class BatchPrefetcher:
    """An iterator of ``(indices, batch)``: ``indices = next_indices()`` (called in order, in the
    producer thread), each sample ``dataset[i]`` decoded in one of ``decode_threads`` threads, the
    batch ``make_batch(samples)`` made in order in the producer thread, up to ``depth`` batches ahead
    of the consumer. Endless: the consumer stops when it has enough, then :meth:`close` (or the
    ``with`` block) stops the threads.

    ``processes > 0`` decodes and collates in that many processes instead (a
    :class:`torch.utils.data.DataLoader`, forked), out of the reach of the training thread's GIL —
    what a GPU worker wants, whose training thread spends its time launching kernels; ``make_batch``
    must then be a :class:`BatchRecipe`, whose ``augment`` still runs in order in the producer thread.

    ``depth=0`` runs synchronously in the consumer's thread (no threads at all): the same batches, for
    comparison. ``pin_memory`` puts finished batches in page-locked memory (for a CUDA consumer, whose
    copies to the device can then run asynchronously)."""

    def __init__(
        self,
        dataset: Dataset,
        next_indices: Callable[[], Sequence[int]],
        make_batch: Callable[[list[Any]], Any],
        *,
        depth: int = DEFAULT_DEPTH,
        decode_threads: int | None = None,
        processes: int = 0,
        pin_memory: bool = False,
    ):
        if depth < 0:
            raise ValueError(f"depth: {depth} is negative")
        if processes < 0:
            raise ValueError(f"processes: {processes} is negative")
        if processes > 0 and not isinstance(make_batch, BatchRecipe):
            raise ValueError("processes: decoding processes need make_batch to be a BatchRecipe")
        self._dataset = dataset
        self._next_indices = next_indices
        self._make_batch = make_batch
        self._depth = int(depth)
        self._processes = int(processes)
        self._pin = bool(pin_memory)
        threads = default_decode_threads() if decode_threads is None else int(decode_threads)
        if threads < 0:
            raise ValueError(f"decode_threads: {threads} is negative")
        self._stop = threading.Event()
        self._closed = False
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, self._depth))
        self._decoder: ThreadPoolExecutor | None = None
        self._producer: threading.Thread | None = None
        if self._depth > 0:
            if threads > 0 and self._processes == 0:
                self._decoder = ThreadPoolExecutor(threads, thread_name_prefix="batch-decode")
            target = self._produce_with_processes if self._processes else self._produce
            self._producer = threading.Thread(target=target, name="batch-producer", daemon=True)
            self._producer.start()

    # ------------------------------------------------------------------ consumer side

    def __iter__(self) -> Iterator[tuple[Sequence[int], Any]]:
        return self

    def __next__(self) -> tuple[Sequence[int], Any]:
        if self._closed:
            raise StopIteration
        if self._producer is None:  # synchronous
            indices = self._next_indices()
            batch = self._make_batch([self._dataset[int(i)] for i in indices])
            return indices, (pin_batch(batch) if self._pin else batch)
        while True:
            try:
                item = self._queue.get(timeout=_POLL_S)
                break
            except queue.Empty:
                if not self._producer.is_alive() and self._queue.empty():
                    raise RuntimeError("the batch producer thread ended without a batch") from None
        if isinstance(item, _Failure):
            self.close()
            raise item.error
        return item

    def close(self) -> None:
        """Stop the producer, discard the batches made ahead, join every thread of the pipeline (and
        its decoding processes)."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._producer is not None:
            while self._producer.is_alive():
                self._drain()
                self._producer.join(timeout=_POLL_S)
            self._drain()
        if self._decoder is not None:
            self._decoder.shutdown(wait=True, cancel_futures=True)

    def _drain(self) -> None:
        try:
            while True:
                self._queue.get_nowait()
        except queue.Empty:
            pass

    def __enter__(self) -> BatchPrefetcher:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def threads(self) -> list[threading.Thread]:
        """The pipeline's live threads (none once closed)."""
        out = [self._producer] if self._producer is not None and self._producer.is_alive() else []
        if self._decoder is not None:
            out += [t for t in getattr(self._decoder, "_threads", ()) if t.is_alive()]
        return out

    # ------------------------------------------------------------------ producer side

    def _submit(self) -> tuple[Sequence[int], list[Future] | None]:
        """The next batch's indices, their decoding started (None without decoding threads)."""
        indices = self._next_indices()
        if self._decoder is None:
            return indices, None
        return indices, [self._decoder.submit(self._dataset.__getitem__, int(i)) for i in indices]

    def _samples(self, indices: Sequence[int], futures: list[Future] | None) -> list[Any]:
        if futures is None:
            return [self._dataset[int(i)] for i in indices]
        return [f.result() for f in futures]

    def _produce(self) -> None:
        try:
            pending: Any = self._submit()
        except BaseException as error:  # noqa: BLE001 - handed to the consumer, which re-raises it
            self._put(_Failure(error))
            return
        while not self._stop.is_set():
            indices, futures = pending
            try:  # the next batch decodes while this one is collated, augmented and waits in the queue
                pending = self._submit()
            except BaseException as error:  # noqa: BLE001 - delivered after this batch
                pending = _Failure(error)
            try:
                batch = self._make_batch(self._samples(indices, futures))
                if self._pin:
                    batch = pin_batch(batch)
            except BaseException as error:  # noqa: BLE001 - handed to the consumer, which re-raises it
                self._put(_Failure(error))
                return
            if not self._put((indices, batch)):
                return
            if isinstance(pending, _Failure):
                self._put(pending)
                return

    def _produce_with_processes(self) -> None:
        from torch.utils.data import DataLoader

        recipe: BatchRecipe = self._make_batch  # type: ignore[assignment]
        order: queue.SimpleQueue = queue.SimpleQueue()  # the indices the sampler handed out, in order

        def next_indices() -> Sequence[int]:
            indices = self._next_indices()
            order.put(indices)
            return indices

        methods = torch.multiprocessing.get_all_start_methods()
        loader = DataLoader(
            self._dataset,
            batch_sampler=_IndexBatches(next_indices),
            num_workers=self._processes,
            collate_fn=recipe.collate,
            multiprocessing_context="fork" if "fork" in methods else None,
            prefetch_factor=2,
        )
        batches = None
        try:
            batches = iter(loader)
            while not self._stop.is_set():
                collated = next(batches)
                indices = order.get()
                batch = collated if recipe.augment is None else recipe.augment(collated)
                if self._pin:
                    batch = pin_batch(batch)
                if not self._put((indices, batch)):
                    return
        except BaseException as error:  # noqa: BLE001 - handed to the consumer, which re-raises it
            self._put(_Failure(error))
        finally:
            if batches is not None and hasattr(batches, "_shutdown_workers"):
                batches._shutdown_workers()  # joins the decoding processes now, not when collected

    def _put(self, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False
