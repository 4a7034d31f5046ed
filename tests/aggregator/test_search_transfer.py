"""One aggregator-side search node and one peer-side evaluation service over real libp2p (two DHT
nodes on 127.0.0.1): the checkpoint travels in pages and is checked, the peer's values equal local
ones, and every mismatch (file hash, state digest, evaluation settings) is refused."""

from __future__ import annotations

import random

import pytest

from aggregator.search_dispatch import CheckpointServer, PeerFailed, RemotePeer, SearchLink
from hivemind_adapter.dht import start_dht, visible_maddrs
from hivemind_adapter.p2p import Endpoint
from peer.search_service import EvaluationService, fetch_checkpoint
from protocol.evaluation_requests import RequestRefused
from protocol.identity import Identity
from protocol.pages import PAGE_BYTES as PAGE
from supernet.checkpoint import load_checkpoint, save_trained
from supernet.search.accuracy import DirectEvaluator
from supernet.search.distributed import evaluator_arguments
from supernet.workload import workload_for
from tests.supernet.threads import single_torch_thread  # noqa: F401

TASK = "digits-local"
LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]


@pytest.fixture
def pair(tmp_path):
    """(search side, peer side): a DHT node serving a checkpoint, and one running the service."""
    workload = workload_for("digits", dict(width_mult=0.25, head_channels=64, channel_divisor=4,
                                           bn_calibration_batches=1))  # fmt: skip
    path = save_trained(tmp_path / "round-00000003.pt", workload, workload.build(), round_index=3)
    aggregator = Identity.generate()
    search_dht = start_dht(host_maddrs=LOOPBACK)
    peer_dht = start_dht(host_maddrs=LOOPBACK, initial_peers=visible_maddrs(search_dht))
    search_side, peer_side = Endpoint(search_dht, "search"), Endpoint(peer_dht, "peer")
    server = CheckpointServer(search_side, TASK, path, page_bytes=PAGE // 4)  # several pages
    service = EvaluationService(peer_side, TASK, (aggregator.public_key_hex,), tmp_path / "peer")
    loaded = load_checkpoint(path)
    local = DirectEvaluator(loaded.workload, loaded.net, val_samples=32, bn_batches=1, seed=5)
    link = SearchLink(
        search_side, aggregator, TASK,
        {"sha256": server.sha256, "size": len(server.data), "digest": loaded.digest, "round": 3},
        evaluator_arguments(local, 5), {**local.settings, "checkpoint": loaded.digest},
    )  # fmt: skip
    try:
        yield link, server, service, peer_side, loaded, local
    finally:
        service.shutdown()
        server.close()
        search_side.close()
        peer_side.close()
        peer_dht.shutdown()
        search_dht.shutdown()


def test_a_peer_downloads_the_checkpoint_once_and_answers_what_this_process_computes(pair):
    link, server, service, peer_side, loaded, local = pair
    configs = [loaded.net.space.sample(random.Random(i)) for i in range(3)]
    peer = RemotePeer(link, peer_side.peer_id, timeout=120)
    assert peer.evaluate(configs) == local.evaluate(configs)
    pages = server.pages
    assert pages == -(-len(server.data) // (PAGE // 4)) > 1
    cached = service.cache / f"{server.sha256}.pt"
    assert cached.read_bytes() == server.data
    assert peer.evaluate(configs[:1]) == local.evaluate(configs[:1])
    assert server.pages == pages and peer.configs == 4 and service.counters["served"] == 2


def test_a_request_naming_another_state_digest_or_other_settings_is_refused(pair):
    link, _server, service, peer_side, loaded, _local = pair
    config = [loaded.net.space.sample(random.Random(0))]
    target = peer_side.peer_id
    wrong_digest = SearchLink(**{**vars(link), "checkpoint": {**link.checkpoint, "digest": "0" * 64}})
    with pytest.raises(PeerFailed, match="refused: the checkpoint's state digest"):
        RemotePeer(wrong_digest, target, timeout=120).evaluate(config)
    other_settings = SearchLink(**{**vars(link), "settings": {**link.settings, "val_indices": 1}})
    with pytest.raises(PeerFailed, match="refused: .*settings differ from this helper's \\(val_indices\\)"):
        RemotePeer(other_settings, target, timeout=120).evaluate(config)
    assert service.counters["refused"] == 2 and service.counters["served"] == 0


def test_a_download_that_does_not_hash_to_the_named_checkpoint_is_not_kept(pair, tmp_path):
    link, server, _service, peer_side, _loaded, _local = pair
    dest = tmp_path / "got.pt"
    with pytest.raises(RequestRefused, match="serves no checkpoint with that SHA-256"):
        fetch_checkpoint(peer_side, link.peer_id, TASK, "1" * 64, len(server.data), dest)
    server.data = server.data[:-1] + bytes([server.data[-1] ^ 1])  # the server's copy is corrupted
    with pytest.raises(RequestRefused, match="SHA-256 mismatch"):
        fetch_checkpoint(peer_side, link.peer_id, TASK, server.sha256, len(server.data), dest)
    assert not dest.exists() and not list(tmp_path.glob(".got.pt*"))
