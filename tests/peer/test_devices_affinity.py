"""Device selection and node-affinity cohort assignment."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from peer.affinity import cohort_on_lan, host_id, is_nat_address, network_id
from peer.devices import discover_devices, parse_gpus
from protocol.cohort_assignment import RosterEntry, assign_cohorts, cohort_sizes


def test_parse_gpus_accepts_all_none_and_lists_and_names_the_option_on_error():
    assert parse_gpus("all") == "all" and parse_gpus(" NONE ") == "none"
    assert parse_gpus("0,2") == [0, 2]
    for bad in ("x", "1,1", "-1", ","):
        with pytest.raises(ValueError, match="--gpus"):
            parse_gpus(bad)


def test_without_a_gpu_all_falls_back_to_cpu_workers_and_explicit_gpus_are_an_error():
    import torch

    if torch.cuda.device_count():
        pytest.skip("this check is for machines without a visible GPU")
    devices = discover_devices("all")
    assert [d.torch_device for d in devices] == ["cpu"]
    assert [d.index for d in discover_devices("none", cpu_workers=3)] == [0, 1, 2]
    with pytest.raises(ValueError, match="0 GPU"):
        discover_devices("0")


def test_device_discovery_leaves_the_agent_without_torch_cuda():
    # The agent forks hivemind's processes, which must not inherit a CUDA context: discovery runs in a
    # child, so the agent process does not even import torch for it (on a GPU machine it would
    # otherwise create a context in get_device_properties).
    code = (
        "import sys; from peer.devices import discover_devices; d = discover_devices('all'); "
        "print(len(d), 'torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    count, torch_loaded = done.stdout.split()
    assert int(count) >= 1 and torch_loaded == "False"


def _entry(peer, host="h1", net="n1", cohort=None):
    return RosterEntry(peer, host, net, cohort)


def test_same_host_first_then_same_network_then_explicit_names():
    roster = [
        _entry("p1", host="hostA"),
        _entry("p2", host="hostA"),  # same host -> one cohort
        _entry("p3", host="hostB", net="lan1"),
        _entry("p4", host="hostC", net="lan1"),  # alone on host, same /24
        _entry("p5", host="hostD", net="lan2"),
        _entry("p6", host="hostA", cohort="lab"),
        _entry("p7", host="hostE", cohort="lab"),
    ]
    a = assign_cohorts(roster, max_size=8)
    assert a["p1"] == a["p2"] and a["p1"].startswith("host-")
    assert a["p3"] == a["p4"] and a["p3"].startswith("net-") and a["p5"] != a["p3"]
    assert a["p6"] == a["p7"] == "lab"
    assert cohort_sizes(a)["lab"] == 2


def test_oversized_cohorts_split_deterministically_into_near_equal_parts():
    roster = [_entry(f"peer{i:02d}") for i in range(10)]
    a = assign_cohorts(roster, max_size=4)
    sizes = sorted(cohort_sizes(a).values())
    assert sizes == [3, 3, 4] and len(set(a.values())) == 3
    assert (
        assign_cohorts(list(reversed(roster)), max_size=4) == a
    )  # the order the roster arrives in is irrelevant


def test_network_id_groups_by_slash_24():
    assert network_id("192.168.7.10") == network_id("192.168.7.200") != network_id("192.168.8.10")
    assert network_id("2001:db8:1:2::1") == network_id("2001:db8:1:ffff::9")


def test_a_nat_lan_is_its_range_and_its_gateway_never_the_range_alone():
    # Every home router hands out 192.168.1.0/24: two homes must not become one cohort.
    home_a = network_id("192.168.1.2", lan_gateway="02:00:00:00:00:0a")
    home_b = network_id("192.168.1.2", lan_gateway="02:00:00:00:00:0b")
    assert home_a != home_b
    assert network_id("192.168.1.77", lan_gateway="02:00:00:00:00:0A") == home_a  # one LAN, any case
    # A public address is its /24 whatever the gateway.
    assert network_id("198.51.100.7", "02:00:00:00:00:0a") == network_id("198.51.100.9", "02:00:00:00:00:0b")
    assert is_nat_address("10.3.2.1") and is_nat_address("100.64.0.1") and not is_nat_address("198.51.100.7")


def test_a_client_mode_peer_serves_only_a_cohort_on_its_own_host_or_nat_lan():
    """Which cohorts reach a peer behind NAT: those the affinity put on its host or its home LAN
    (by the names assign_cohorts gives them, split parts included), never a public range or a named
    cohort, whose members may sit behind other routers."""
    me_host, home = "a1b2c3d4e5f60718", network_id("192.168.1.5", lan_gateway="02:00:00:00:00:0a")
    roster = [
        _entry("p1", host=me_host, net=home),
        _entry("p2", host=me_host, net=home),
        _entry("p3", host="other-host", net=home),
        _entry("p4", host="third-host", net=home),
        _entry("p5", host="far-host", cohort="lab"),
    ]
    a = assign_cohorts(roster, max_size=8)
    assert cohort_on_lan(a["p1"], me_host, home, "192.168.1.5")  # this host's cohort
    assert cohort_on_lan(a["p3"], "other-host", home, "192.168.1.6")  # this LAN's cohort
    split = assign_cohorts([_entry(f"q{i}", host="h" + str(i), net=home) for i in range(6)], max_size=2)
    assert (
        all(cohort_on_lan(c, "hx", home, "192.168.1.9") for c in split.values())
        and len(set(split.values())) == 3
    )
    assert not cohort_on_lan(a["p5"], me_host, home, "192.168.1.5")  # named: may span routers
    public = network_id("198.51.100.7")
    assert not cohort_on_lan(f"net-{public}", "hx", public, "198.51.100.7")  # a public /24 may be firewalled
    other_home = network_id("192.168.1.5", lan_gateway="02:00:00:00:00:0b")
    assert not cohort_on_lan(f"net-{other_home}", "hx", home, "192.168.1.5")  # another home, same range
    assert not cohort_on_lan(a["p1"], "other-host", home, "192.168.1.6")  # another host's cohort


def test_host_id_differs_between_network_namespaces(tmp_path):
    """Processes in two network namespaces of one machine are two hosts to node affinity (the
    testbed's sites rely on it); two processes in one namespace are one host."""
    import shutil
    import subprocess
    import sys

    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 to create a network namespace")
    ns = f"manta-test-{os.getpid()}"
    probe = [sys.executable, "-c", "from peer.affinity import host_id; print(host_id())"]
    subprocess.run(["ip", "netns", "add", ns], check=True, timeout=30)
    try:
        inside = subprocess.run(
            ["ip", "netns", "exec", ns, *probe], capture_output=True, text=True, timeout=60
        )
        outside = subprocess.run(probe, capture_output=True, text=True, timeout=60)
    finally:
        subprocess.run(["ip", "netns", "del", ns], timeout=30)
    assert inside.returncode == 0 and outside.returncode == 0, inside.stderr + outside.stderr
    assert inside.stdout.strip() != outside.stdout.strip()
    assert outside.stdout.strip() == host_id()
