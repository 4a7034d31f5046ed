"""Helpers shared by the monitor tests: real signed records, plain HTTP, and the exposition grammar."""

from __future__ import annotations

import json
import re
import socket
import time
import urllib.error
import urllib.request
from typing import Any

from aggregator.monitor.swarm_reader import SwarmReading
from protocol.dht_schema import open_peer_value, open_progress_value
from protocol.identity import Identity
from protocol.records import Affinity, DeviceInfo, PeerAnnouncement, PeerProgress
from protocol.sealing import seal
from tests.protocol.factories import binding_wire, certificate_wire, endorsement_of, peer_id_of

TASK_ID = "digits-monitor-test"
ALICE, BOB, CAROL = (Identity.from_seed(bytes([40 + i]) * 32) for i in range(3))


def reading(announcements=(), records=(), rejected: int = 0) -> SwarmReading:
    return SwarmReading(tuple(announcements), tuple(records), rejected)


def progress(
    identity: Identity,
    round_index: int,
    samples: int,
    loss: float,
    throughput: float = 10.0,
    cohort: str = "cohort-a",
    timestamp: int | None = None,
    finished: tuple[int, int, float] | None = None,
    traffic: tuple[int, int] = (0, 0),
    averaging: bool = False,
) -> PeerProgress:
    """A PeerProgress signed by ``identity``, opened back through the DHT validator's own check;
    ``finished``: (round, samples, loss) of the last round the peer finished; ``traffic``: (outer
    steps, cross-cohort bytes) since the peer started; ``averaging``: published while it averages."""
    done_round, done_samples, done_loss = finished or (0, 0, 0.0)
    record = PeerProgress(
        task_id=TASK_ID,
        peer_id=peer_id_of(identity),
        public_key=identity.public_key_hex,
        endorsement=endorsement_of(identity),
        round=round_index,
        samples=samples,
        throughput_milli=int(throughput * 1000),
        loss_micro=int(loss * 1e6),
        cohort_id=cohort,
        state_round=round_index,
        timestamp=timestamp if timestamp is not None else int(time.time() * 1000),
        finished_round=done_round,
        finished_samples=done_samples,
        finished_loss_micro=int(done_loss * 1e6),
        averaging=averaging,
        outer_steps=traffic[0],
        cross_cohort_bytes=traffic[1],
    )
    return open_progress_value(TASK_ID, identity.public_key_hex, seal(record, identity)).record


def announcement_value(identity: Identity, throughput: float = 10.0, timestamp: int | None = None) -> list:
    """The DHT value of a member's announcement: [sealed announcement, binding, certificate]."""
    record = PeerAnnouncement(
        task_id=TASK_ID,
        peer_id=peer_id_of(identity),
        public_key=identity.public_key_hex,
        devices=(DeviceInfo(kind="cpu", name="test cpu", memory_mb=1024),),
        throughput_milli=int(throughput * 1000),
        affinity=Affinity(host_id="ab" * 8, network_id="cd" * 8),
        cohort_id="auto",
        timestamp=timestamp if timestamp is not None else int(time.time() * 1000),
    )
    return [seal(record, identity), binding_wire(identity), certificate_wire(identity, task_id=TASK_ID)]


def announcement(
    identity: Identity, throughput: float = 10.0, timestamp: int | None = None
) -> PeerAnnouncement:
    value = announcement_value(identity, throughput, timestamp)
    return open_peer_value(TASK_ID, identity.public_key_hex, value).announcement.record


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(url: str, method: str = "GET", timeout: float = 15.0) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body) of one request; HTTP errors are answers, not exceptions."""
    request = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def get_json(url: str) -> Any:
    status, headers, body = http(url)
    assert status == 200, (url, status, body[:300])
    assert headers["Content-Type"].startswith("application/json"), headers
    return json.loads(body)


_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\\\|\\"|\\n)*"'
_VALUE = r"(?:[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|NaN|[-+]Inf)"
_SAMPLE = re.compile(rf"^({_NAME})(?:\{{({_LABEL}(?:,{_LABEL})*)\}})? ({_VALUE})$")
_COMMENT = re.compile(rf"^# (HELP|TYPE) ({_NAME}) (.+)$")


def parse_exposition(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Parse Prometheus text format strictly: every line must be a HELP, TYPE or sample line, each
    family's HELP and TYPE come once and before its samples. Returns {name: [(labels, value)]}."""
    assert text.endswith("\n"), "the exposition ends with a newline"
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    typed: dict[str, str] = {}
    for line in text.rstrip("\n").split("\n"):
        comment = _COMMENT.match(line)
        if comment:
            kind, name, rest = comment.groups()
            if kind == "TYPE":
                assert name not in typed and name not in samples, f"TYPE of {name} repeated or late"
                assert rest in ("gauge", "counter"), line
                typed[name] = rest
            continue
        match = _SAMPLE.match(line)
        assert match, f"not a valid exposition line: {line!r}"
        name, labels_text, value = match.groups()
        assert name in typed, f"sample of {name} before its TYPE"
        labels = dict(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', labels_text or ""))
        samples.setdefault(name, []).append((labels, float(value)))
    return samples
