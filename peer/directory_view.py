"""The cohort directory as this peer reads it (:mod:`protocol.cohort_directory`).

The headers come from one DHT key with one entry per aggregator of the task, whatever the swarm's
size, read at most every :data:`HEADER_READ_EVERY` seconds; a page comes from the aggregator that
signed its header and is checked against that header before use, then kept for its epoch. So a
round learns its cohort and the size of the roster it commits against in a constant number of
lookups, and every peer of an attempt counts against the same roster.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from hivemind_adapter.dht import read_signed
from hivemind_adapter.p2p import Endpoint
from protocol.cohort_directory import CohortPage, DirectoryError, DirectoryHeader, governing, page_request
from protocol.dht_schema import directory_key, open_directory_value
from protocol.handler_names import directory_handler
from protocol.task_spec import TaskSpec

logger = logging.getLogger(__name__)

HEADER_READ_EVERY = 5.0  # seconds one read of the headers serves
HEADERS_KEPT = 4  # epochs kept per signer: the DHT holds its newest only, which may govern a later attempt
PAGES_KEPT = 64  # checked pages kept (a few epochs of this peer's cohort and those it asked for)


class DirectoryUnavailable(Exception):
    """No checked page could be had (no header governs the attempt, or its signer did not answer
    with a page that holds under it); the message says which."""


@dataclass(frozen=True)
class CohortView:
    """A cohort of one directory, checked: the header that lists it, its signer, the page."""

    header: DirectoryHeader
    signer: str  # the aggregator key (hex) that sealed the header
    page: CohortPage


class DirectoryView:
    """Headers and checked pages of ``task``'s cohort directory. ``aggregator_peer(key)``: the peer
    id an aggregator key runs as (its published binding), or None."""

    def __init__(
        self,
        dht,
        endpoint: Endpoint,
        task: TaskSpec,
        peer_id: str,
        aggregator_peer: Callable[[str], str | None],
    ):
        self.dht, self.endpoint, self.task, self.peer_id = dht, endpoint, task, peer_id
        self.aggregator_peer = aggregator_peer
        self._keys = frozenset(task.aggregator_keys)
        self._lock = threading.Lock()  # guards _headers, _read_at and _pages
        self._headers: dict[str, dict[int, DirectoryHeader]] = {}  # signer key -> epoch -> header
        self._read_at = float("-inf")
        self._pages: OrderedDict[tuple[str, int, str], CohortView] = OrderedDict()  # (signer, epoch, asked)

    def headers(self, fresh: bool = False) -> dict[str, list[DirectoryHeader]]:
        """Signer key -> the headers read of it, oldest epoch first (the DHT is read again if the
        last read is older than :data:`HEADER_READ_EVERY`)."""
        with self._lock:
            if not fresh and time.monotonic() - self._read_at < HEADER_READ_EVERY:
                return self._listed()
        found = read_signed(
            self.dht,
            directory_key(self.task.task_id),
            lambda sub, value: open_directory_value(self.task.task_id, sub, value, self._keys),
        )
        with self._lock:
            for sealed in found:
                epochs = self._headers.setdefault(sealed.public_key.hex(), {})
                epochs[sealed.record.epoch] = sealed.record  # a re-signed header: the same directory
                for old in sorted(epochs)[:-HEADERS_KEPT]:
                    del epochs[old]
            self._read_at = time.monotonic()
            return self._listed()

    def _listed(self) -> dict[str, list[DirectoryHeader]]:
        """(Under the lock.)"""
        return {signer: [epochs[e] for e in sorted(epochs)] for signer, epochs in self._headers.items()}

    def governing(self, attempt: int) -> tuple[str, DirectoryHeader] | None:
        """(signer, header) of the directory that governs ``attempt`` (of the signer with the
        lowest key, if several aggregators publish), or None."""
        for signer, headers in sorted(self.headers().items()):
            header = governing(headers, attempt)
            if header is not None:
                return signer, header
        return None

    def own_cohort(self, attempt: int, timeout: float = 10.0) -> CohortView:
        """This peer's cohort in the directory that governs ``attempt``; DirectoryUnavailable if
        none governs it, or this peer is in none of its cohorts, or no checked page came."""
        found = self.governing(attempt)
        if found is None:
            raise DirectoryUnavailable(f"no cohort directory governs attempt {attempt} yet")
        signer, header = found
        view = self._page(signer, header, page_request(header.epoch, peer_id=self.peer_id), timeout)
        if all(m.peer_id != self.peer_id for m in view.page.members):
            raise DirectoryUnavailable(f"this peer is in no cohort of directory epoch {header.epoch}")
        return view

    def cohort(self, signer: str, header: DirectoryHeader, cohort: str, timeout: float = 10.0) -> CohortView:
        """``cohort``'s checked page in ``header``'s directory; DirectoryUnavailable if none came."""
        view = self._page(signer, header, page_request(header.epoch, cohort=cohort), timeout)
        if view.page.cohort != cohort:
            raise DirectoryUnavailable(f"asked for cohort {cohort}, got {view.page.cohort}")
        return view

    def _page(self, signer: str, header: DirectoryHeader, request: bytes, timeout: float) -> CohortView:
        key = (signer, header.epoch, request.decode())
        with self._lock:
            kept = self._pages.get(key)
        if kept is not None:
            return kept
        server = self.aggregator_peer(signer)
        if server is None:
            raise DirectoryUnavailable(
                f"aggregator {signer[:8]} of directory epoch {header.epoch} is not reachable"
            )
        try:
            reply = self.endpoint.call(server, directory_handler(self.task.task_id), request, timeout)
        except Exception as e:  # gone or too slow: the caller decides what to do without a page
            raise DirectoryUnavailable(f"aggregator {signer[:8]}: {type(e).__name__}: {e}") from None
        try:
            page = CohortPage.from_bytes(reply)
            page.check(header)
        except DirectoryError as e:
            detail = _error_of(reply) or str(e)
            raise DirectoryUnavailable(f"directory epoch {header.epoch}: {detail}") from None
        view = CohortView(header, signer, page)
        with self._lock:
            self._pages[key] = view
            while len(self._pages) > PAGES_KEPT:
                self._pages.popitem(last=False)
        return view


def _error_of(reply: bytes) -> str | None:
    try:
        value = json.loads(reply)
    except ValueError:
        return None
    return str(value["error"]) if isinstance(value, dict) and "error" in value else None
