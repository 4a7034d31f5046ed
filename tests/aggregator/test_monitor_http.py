"""The dashboard's HTTP side: a real server on 127.0.0.1 over a real ledger file of signed receipts."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import socket
import time

import pytest

from aggregator.monitor.app import STATIC
from aggregator.monitor.server import DashboardError, DashboardServer, parse_dashboard_option, url_for
from aggregator.monitor.service import Monitor
from ledger.rewards import compute_rewards
from ledger.store import LedgerStore
from protocol.merkle import verify_inclusion
from tests.aggregator.monitor_helpers import (
    ALICE,
    announcement,
    get_json,
    http,
    parse_exposition,
    progress,
    reading,
)
from tests.ledger.helpers import AGGREGATOR, build_ledger


@pytest.fixture
def served(tmp_path):
    monitor = Monitor(tmp_path, AGGREGATOR.public_key, evaluate=False)
    monitor.serve("127.0.0.1:0")
    try:
        yield monitor, monitor.url.rstrip("/")
    finally:
        monitor.close()


def _digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_ledger_head_rewards_and_proofs_from_a_real_ledger(served, tmp_path):
    monitor, base = served
    # Before the first receipt there is no ledger file: an empty ledger, and proofs are 404.
    monitor.ledger_view.refresh()
    assert get_json(f"{base}/api/ledger") == {
        "present": False,
        "path": str(tmp_path / "ledger.sqlite"),
        "head": None,
        "rewards": None,
        "error": None,
    }
    status, _, body = http(f"{base}/api/ledger/proof/0")
    assert status == 404 and json.loads(body)["error"] == "there is no ledger yet"

    wires = build_ledger(tmp_path / "ledger.sqlite", batches=3, revoke=2)  # 15 receipts, 1 revocation
    monitor.ledger_view.refresh()
    with LedgerStore.open(tmp_path / "ledger.sqlite", readonly=True) as store:
        root, size, latest = store.root().hex(), store.size, store.latest_checkpoint()
    ledger = get_json(f"{base}/api/ledger")
    assert ledger["present"] and ledger["head"]["size"] == size == 16 and ledger["head"]["root"] == root
    assert (
        ledger["head"]["checkpoint"]["seq"] == latest.seq
        and ledger["head"]["checkpoint"]["note"] == latest.note
    )
    assert ledger["rewards"] == json.loads(
        json.dumps(compute_rewards(wires, AGGREGATOR.public_key).to_json())
    )
    assert ledger["rewards"]["revocations"] == 1
    assert get_json(f"{base}/api/status")["ledger"] == ledger["head"]

    before = _digest(tmp_path / "ledger.sqlite")
    for index in (0, 7, 15):
        proof = get_json(f"{base}/api/ledger/proof/{index}")
        entry = base64.b64decode(proof["entry"])
        assert entry == wires[index] and proof["checkpoint"]["size"] == 16
        hashes = [bytes.fromhex(h) for h in proof["proof"]]
        # Checked here independently of the server, against the root the ledger signed.
        assert verify_inclusion(entry, index, 16, hashes, bytes.fromhex(latest.checkpoint.root))
        assert proof["verified"] is True
    assert get_json(f"{base}/api/ledger/proof/15")["kind"] == "revocation"
    assert get_json(f"{base}/api/ledger/proof/3")["record"]["round"] == 0

    for index in (16, 10**12):
        status, headers, body = http(f"{base}/api/ledger/proof/{index}")
        assert status == 404 and headers["Content-Type"].startswith("application/json")
        assert json.loads(body) == {
            "error": f"no entry {index} under the latest checkpoint (16 entries)",
            "status": 404,
        }
    metrics = parse_exposition(http(f"{base}/metrics")[2].decode())
    assert metrics["manta_ledger_entries"] == [({}, 16.0)] and metrics["manta_ledger_revocations"] == [
        ({}, 1.0)
    ]
    assert len(metrics["manta_ledger_key_credits_flops"]) == 5
    assert _digest(tmp_path / "ledger.sqlite") == before  # reading changed nothing


def test_a_corrupted_ledger_is_reported_not_fatal(served, tmp_path):
    monitor, base = served
    (tmp_path / "ledger.sqlite").write_bytes(b"this is not a database" * 100)
    monitor.ledger_view.refresh()
    ledger = get_json(f"{base}/api/ledger")
    assert not ledger["present"] and "not a MANTA ledger" in ledger["error"]
    status, _, body = http(f"{base}/api/ledger/proof/0")
    assert status == 503 and "not a MANTA ledger" in json.loads(body)["error"]
    assert get_json(f"{base}/api/status")["ledger"] is None


def test_unknown_routes_are_404_and_other_methods_405_all_as_json(served):
    monitor, base = served
    monitor.aggregates.observe(reading([announcement(ALICE)], [progress(ALICE, 1, 64, 1.0)]), time.time())
    before = json.dumps([monitor.aggregates.rounds(), monitor.aggregates.peers(0.0)])
    for path in (
        "/nope",
        "/api",
        "/api/status/x",
        "/api/ledger/proof/",
        "/api/ledger/proof/x1",
        "/static/missing.js",
    ):
        status, headers, body = http(base + path)
        assert status == 404 and headers["Content-Type"].startswith("application/json"), path
        assert json.loads(body) == {"error": f"no such resource: {path}", "status": 404}
    for method in ("POST", "PUT", "DELETE", "PATCH"):
        for path in (
            "/",
            "/api/status",
            "/api/rounds",
            "/api/peers",
            "/api/ledger",
            "/api/ledger/proof/0",
            "/metrics",
            "/static/app.js",
        ):
            status, headers, body = http(base + path, method)
            assert status == 405, (method, path, status)
            assert set(headers["Allow"].split(", ")) == {"GET", "HEAD"}
            assert json.loads(body)["error"] == f"{method} is not allowed here (read-only API)"
    status, _, body = http(f"{base}/api/rounds?since=abc")
    assert status == 400 and "since" in json.loads(body)["error"]
    assert json.dumps([monitor.aggregates.rounds(), monitor.aggregates.peers(0.0)]) == before


def test_api_shapes_and_the_page_assets_are_local(served):
    monitor, base = served
    monitor.aggregates.observe(reading([announcement(ALICE)], [progress(ALICE, 1, 64, 1.0)]), time.time())
    assert get_json(f"{base}/api/rounds?since=1")["rounds"][0]["samples"] == 64
    assert get_json(f"{base}/api/rounds?since=2") == {"rounds": []}
    assert [p["fingerprint"] for p in get_json(f"{base}/api/peers")["peers"]] == [ALICE.fingerprint]
    status = get_json(f"{base}/api/status")
    assert status["peers_online"] == 1 and status["round"]["current"] == 1 and status["task"] is None
    assert (
        status["aggregator"]["fingerprint"] == AGGREGATOR.fingerprint
        and status["aggregator"]["dashboard"] == f"{base}/"
    )

    code, headers, page = http(base + "/")
    assert code == 200 and headers["Content-Type"].startswith("text/html")
    assert "default-src 'self'" in headers["Content-Security-Policy"]
    assets = re.findall(r'(?:src|href)="([^"]+)"', page.decode())
    assert {"/static/app.js", "/static/charts.js", "/static/style.css"} <= set(assets)
    for asset in assets:
        assert asset.startswith("/"), f"the page refers to {asset}: every asset must be served here"
        assert http(base + asset)[0] == 200, asset
    for file in STATIC.iterdir():
        text = file.read_text()
        assert not re.search(r"(?:https?:)?//[a-z0-9.-]+\.[a-z]{2,}", text), (
            f"{file.name} refers to another host"
        )
    assert http(base + "/api/status", "HEAD")[0] == 200


def test_a_taken_port_is_one_line_error_unless_falling_back(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = DashboardServer(Monitor(tmp_path, AGGREGATOR.public_key, evaluate=False))
        with pytest.raises(DashboardError) as error:
            server.start(f"127.0.0.1:{port}")
        assert str(error.value) == (
            f"--http 127.0.0.1:{port}: the port is taken; choose another with --http HOST:PORT, or --http off"
        )
        url = server.start(f"127.0.0.1:{port}", fallback=True)
        try:
            assert url != f"http://127.0.0.1:{port}/" and get_json(url + "api/status")["peers_online"] == 0
        finally:
            server.stop()
    with pytest.raises(DashboardError, match="cannot listen there"):
        DashboardServer(None).start("192.0.2.1:8080")  # an address this machine does not have


def test_the_http_option():
    assert parse_dashboard_option(None) == ("127.0.0.1:8080", True)
    assert parse_dashboard_option("off") == (None, False)
    assert parse_dashboard_option("0.0.0.0:9000") == ("0.0.0.0:9000", False)
    with pytest.raises(DashboardError, match="--http must be HOST:PORT"):
        parse_dashboard_option("8080")
    assert url_for("0.0.0.0", 9000) == "http://127.0.0.1:9000/" and url_for("::", 1) == "http://[::1]:1/"
