"""Control traffic is counted as it leaves the process: DHT requests and replies and matchmaking's
join messages, with their payload bytes; an all-reduce's tensors are not."""

from __future__ import annotations

import os

import torch

from hivemind_adapter.allreduce import VerifiedAverager
from hivemind_adapter.control_traffic import control_traffic, is_control
from hivemind_adapter.dht import read_entries, start_dht, store, visible_maddrs
from tests.hivemind_adapter.averager_pair import LOOPBACK, step_pair

VALUE_BYTES = 20_000
TENSOR_FLOATS = 500_000  # 2 MB a member


def test_handler_names_are_told_apart():
    assert is_control("DHTProtocol.rpc_find")
    assert is_control("run-7_cohort::VerifiedAverager.rpc_join_group")
    assert not is_control("run-7_cohort::VerifiedAverager.rpc_aggregate_part")
    assert not is_control("DecentralizedAverager.rpc_download_state")


def test_a_store_and_a_read_count_their_requests_and_replies_with_the_value_s_bytes():
    first = start_dht(host_maddrs=LOOPBACK)
    second = start_dht(host_maddrs=LOOPBACK, initial_peers=visible_maddrs(first))
    try:
        before = control_traffic()
        assert store(second, "control-traffic", os.urandom(VALUE_BYTES), 60.0, subkey="a")
        stored = control_traffic() - before
        # both nodes live in this process: the store request out of one, its reply out of the other
        assert stored.messages >= 2, stored
        assert stored.bytes >= VALUE_BYTES, stored
        before = control_traffic()
        assert read_entries(first, "control-traffic")
        read = control_traffic() - before
        assert read.messages >= 2, read
        assert read.bytes >= VALUE_BYTES, read  # the value came back in a reply
    finally:
        second.shutdown()
        first.shutdown()


def test_an_all_reduce_counts_its_matchmaking_but_not_its_tensors():
    before = control_traffic()
    _, outcomes, wire = step_pair(
        VerifiedAverager, lambda i: [torch.full((TENSOR_FLOATS,), float(i))], 30.0, prefix="control-pair"
    )
    spent = control_traffic() - before
    assert not any(isinstance(o, BaseException) for o in outcomes), outcomes
    sent_tensor_bytes = sum(sent for sent, _ in wire)
    assert sent_tensor_bytes >= TENSOR_FLOATS * 4, wire  # each member sent the other its half
    assert spent.messages > 0, spent  # the join request and the leader's replies, the DHT's declarations
    assert spent.bytes < sent_tensor_bytes / 20, (spent, sent_tensor_bytes)
