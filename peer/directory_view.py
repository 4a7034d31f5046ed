"""The cohort directory as this peer reads it (:mod:`protocol.cohort_directory`).

The headers come from one DHT key with one entry per aggregator of the task, whatever the swarm's
size, read at most every :data:`HEADER_READ_EVERY` seconds. The DHT holds each aggregator's newest
header only, which may govern a later attempt than one still to plan: on a new epoch the peer asks
that aggregator for the headers of every epoch it serves, each checked as the DHT checks one. A
page comes from the aggregator that
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
from protocol.cohort_directory import (
    HEADERS_REQUEST,
    CohortPage,
    DirectoryError,
    DirectoryHeader,
    governing,
    page_request,
    parse_headers_reply,
)
from protocol.dht_schema import directory_key, open_directory_value
from protocol.handler_names import directory_handler
from protocol.record_lifetimes import DIRECTORY_TTL
from protocol.sealing import RecordRejected, Sealed
from protocol.task_spec import TaskSpec

logger = logging.getLogger(__name__)

HEADER_READ_EVERY = 5.0  # seconds one read of the headers serves
HEADERS_TIMEOUT = 5.0  # seconds an aggregator has to send the headers of the epochs it serves
HEADERS_KEPT = 4  # epochs kept per signer: the DHT holds its newest only, which may govern a later attempt
PAGES_KEPT = 64  # checked pages kept (a few epochs of this peer's cohort and those it asked for)
WHOLE_KEPT = 2  # whole directories kept: the epoch that governs and the one before it


class DirectoryUnavailable(Exception):
    """No checked page could be had (no header governs the attempt, or its signer did not answer
    with a page that holds under it); the message says which."""


@dataclass(frozen=True)
class CohortView:
    """A cohort of one directory, checked: the header that lists it, its signer, the page."""

    header: DirectoryHeader
    signer: str  # the aggregator key (hex) that sealed the header
    page: CohortPage


@dataclass(frozen=True)
class WholeDirectory:
    """Every cohort's checked page of one directory, in leaf order (the cohorts' ranks)."""

    header: DirectoryHeader
    signer: str  # the aggregator key (hex) that sealed the header
    pages: tuple[CohortPage, ...]

    def rank_of(self, peer_id: str) -> int | None:
        """The leaf index of the cohort that lists ``peer_id`` (None: it is no member)."""
        for page in self.pages:
            if any(m.peer_id == peer_id for m in page.members):
                return page.index
        return None

    def keys(self) -> dict[str, str]:
        """Peer id -> MANTA public key (hex) of every member."""
        return {m.peer_id: m.public_key for page in self.pages for m in page.members}


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
        self._lock = threading.Lock()  # guards _headers, _read_at, _pages and _whole
        self._headers: dict[str, dict[int, DirectoryHeader]] = {}  # signer key -> epoch -> header
        self._read_at = float("-inf")
        self._pages: OrderedDict[tuple[str, int, str], CohortView] = OrderedDict()  # (signer, epoch, asked)
        self._whole: OrderedDict[tuple[str, int], WholeDirectory] = OrderedDict()  # (signer, epoch)
        self._governs = False  # whether the last whole() call gave a directory to plan from

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
            unseen = {
                s.public_key.hex()
                for s in found
                if s.record.epoch not in self._headers.get(s.public_key.hex(), {})
            }
        for signer in sorted(unseen):  # a new epoch: the ones its DHT entry replaced may govern yet
            found += self._served_headers(signer)
        with self._lock:
            for sealed in found:
                epochs = self._headers.setdefault(sealed.public_key.hex(), {})
                epochs[sealed.record.epoch] = sealed.record  # a re-signed header: the same directory
                for old in sorted(epochs)[:-HEADERS_KEPT]:
                    del epochs[old]
            self._read_at = time.monotonic()
            return self._listed()

    def _served_headers(self, signer: str) -> list[Sealed[DirectoryHeader]]:
        """The sealed headers of every epoch ``signer``'s aggregator serves, each checked as the DHT
        checks one (empty if it cannot be asked: the DHT's newest alone then)."""
        server = self.aggregator_peer(signer)
        if server is None:
            return []
        try:
            reply = self.endpoint.call(
                server, directory_handler(self.task.task_id), HEADERS_REQUEST, HEADERS_TIMEOUT
            )
            wires = parse_headers_reply(reply)
        except Exception as e:  # gone, too slow or malformed: the headers the DHT holds are all there is
            logger.debug(f"aggregator {signer[:8]}'s headers: {type(e).__name__}: {e}")
            return []
        opened = []
        for wire in wires:
            try:  # sealed by ``signer`` (the subkey it would have in the DHT), for this task
                opened.append(open_directory_value(self.task.task_id, signer, wire, self._keys))
            except RecordRejected:
                continue
        return opened

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

    def whole(self, attempt: int, timeout: float = 10.0) -> WholeDirectory | None:
        """Every page of the directory that governs ``attempt``, checked, each epoch's fetched once;
        None if no directory governs it, or the one that does was last signed more than
        :data:`~protocol.record_lifetimes.DIRECTORY_TTL` ago (its aggregator is gone).
        DirectoryUnavailable if a page did not come within ``timeout`` or the pages do not add up
        to the header's size."""
        try:
            whole = self._whole_governing(attempt, timeout)
        except Exception:
            with self._lock:
                self._governs = False
            raise
        with self._lock:
            self._governs = whole is not None
        return whole

    def _whole_governing(self, attempt: int, timeout: float) -> WholeDirectory | None:
        found = self.governing(attempt)
        if found is None or time.time() - found[1].timestamp / 1000 > DIRECTORY_TTL:
            return None
        signer, header = found
        with self._lock:
            kept = self._whole.get((signer, header.epoch))
        if kept is not None:
            return kept
        deadline = time.monotonic() + timeout
        pages = []
        for index in range(header.cohorts):
            request = page_request(header.epoch, index=index)
            view = self._page(signer, header, request, max(0.1, deadline - time.monotonic()))
            if view.page.index != index:
                raise DirectoryUnavailable(
                    f"asked for page {index} of epoch {header.epoch}, got {view.page.index}"
                )
            pages.append(view.page)
        whole = WholeDirectory(header, signer, tuple(pages))
        if len(whole.keys()) != header.size:
            raise DirectoryUnavailable(
                f"directory epoch {header.epoch}: its pages list {len(whole.keys())} members, its header {header.size}"
            )
        logger.info(
            f"cohort directory epoch {header.epoch}: {header.size} member(s) in {header.cohorts} cohort(s), "
            f"from attempt {header.first_attempt}"
        )
        with self._lock:
            self._whole[(signer, header.epoch)] = whole
            while len(self._whole) > WHOLE_KEPT:
                self._whole.popitem(last=False)
            for key in [
                k
                for k in self._pages
                if k[:2] == (signer, header.epoch) and k[2].startswith(f"{header.epoch} #")
            ]:
                del self._pages[key]  # held whole now
        return whole

    def member_keys(self) -> dict[str, str]:
        """Peer id -> public key of the members of the whole directories kept (the governing epoch
        and the one before, whose attempts' votes may still arrive; the newer binding wins). Empty
        where the last :meth:`whole` gave none to plan from: those rounds admit their roster."""
        with self._lock:
            if not self._governs:
                return {}
            kept = list(self._whole.values())
        return {peer: key for whole in kept for peer, key in whole.keys().items()}

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
