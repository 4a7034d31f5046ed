"""Scenario, rate and churn parsing: what a developer writes becomes exactly this network, and every
mistake is one line naming the key."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

import testbed
from testbed.churn import parse_churn
from testbed.wan.rates import RateError, format_rate, parse_rate
from testbed.wan.scenario import LinkProfile, ScenarioError, load_scenario, uniform_scenario
from tests.helpers import console_script


def test_rates_are_read_as_tc_writes_them():
    assert parse_rate("20mbit") == 20_000_000
    assert parse_rate("1gbit") == 1_000_000_000
    assert parse_rate("500kbit") == 500_000
    assert parse_rate("1.5Mbit") == 1_500_000
    assert parse_rate("10mbps") == 80_000_000  # tc's bps is bytes per second
    assert parse_rate("1mibit") == 2**20
    assert format_rate(20_000_000) == "20mbit" and format_rate(1_500_000) == "1.5mbit"
    for bad in ("fast", "20 megabit", "-5mbit", "100bit"):
        with pytest.raises(RateError):
            parse_rate(bad)


def test_uniform_sites_share_out_peers_and_put_the_last_ones_behind_nat():
    link = LinkProfile(50_000_000, 200_000_000, 40, 0, 0.1)
    s = uniform_scenario(sites=3, peers=8, link=link, nat=1)
    assert [site.peers for site in s.sites] == [3, 3, 2]
    assert [site.nat for site in s.sites] == [False, False, True]
    # The aggregator's own site: a datacenter link as far from the core as the sites.
    assert s.aggregator.uplink_bps == 10**9 and s.aggregator.delay_ms == 40 and s.aggregator.loss_pct == 0
    with pytest.raises(ScenarioError, match="fewer than --sites"):
        uniform_scenario(sites=4, peers=3, link=link)
    with pytest.raises(ScenarioError, match="--nat 5"):
        uniform_scenario(sites=4, peers=4, link=link, nat=5)
    with pytest.raises(ScenarioError, match="jitter"):
        LinkProfile(delay_ms=5, jitter_ms=10)


def test_a_scenario_file_gives_each_site_its_own_link_and_a_churn_schedule(tmp_path):
    path = tmp_path / "home.toml"
    path.write_text(
        """
seed = 3
[link]
uplink = "20mbit"
downlink = "100mbit"
delay = 80
loss = 0.5
[aggregator]
uplink = "1gbit"
downlink = "1gbit"
delay = 10
[[site]]
name = "office"
peers = 2
uplink = "100mbit"
delay = 20
loss = 0
[[site]]
peers = 1
nat = true
[churn]
every = 60
signal = "int"
[[churn.event]]
at = 30
start = "office"
"""
    )
    s = load_scenario(path)
    office, home = s.sites
    assert (office.name, office.peers, office.link.uplink_bps, office.link.downlink_bps) == (
        "office",
        2,
        10**8,
        10**8,
    )
    assert (office.link.delay_ms, office.link.loss_pct) == (20, 0)
    assert (home.name, home.nat, home.link.uplink_bps, home.link.delay_ms, home.link.loss_pct) == (
        "site-2",
        True,
        20_000_000,
        80,
        0.5,
    )
    assert s.aggregator.delay_ms == 10 and s.seed == 3 and s.peers == 3
    assert s.churn.every_s == 60 and s.churn.signal == "int" and s.churn.events[0].start == "office"
    assert s.churn.scheduled_kills(130) == [60, 120]


@pytest.mark.parametrize(
    "text, message",
    [
        ("[[site]]\npeers = 1\nuplnk = '20mbit'\n", "[[site]] #1: unknown key(s) uplnk"),
        ("[[site]]\npeers = 1\nuplink = 'fast'\n", "[[site]] #1: rate must be written as tc writes it"),
        ("[[site]]\npeers = 'two'\n", "[[site]] #1: peers must be a whole number"),
        ("[link]\ndelay = 5\njitter = 9\n[[site]]\npeers = 1\n", "jitter must be between 0 and the delay"),
        ("[[site]]\npeers = 1\n[churn]\nsignal = 'hup'\n", "churn signal must be 'kill'"),
        ("[[site]]\npeers = 1\n[[churn.event]]\nat = 5\nstart = 'mars'\n", "no site named 'mars'"),
        ("[[site]]\npeers = 1\n[[churn.event]]\nat = 5\n", "give exactly one of kill"),
        ("this is = not toml =", "is not valid TOML"),
        ("[link]\ndelay = 5\n", "needs at least one [[site]]"),
    ],
)
def test_scenario_mistakes_are_one_line_naming_the_key(tmp_path, text, message):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ScenarioError) as caught:
        load_scenario(path)
    assert message in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize("name", ["mixed.toml", "broadband-churn.toml"])
def test_the_shipped_scenarios_load(name):
    scenario = load_scenario(Path(testbed.__file__).parent / "scenarios" / name)
    assert scenario.peers >= 6 and scenario.churn is not None


def test_churn_option_forms():
    assert parse_churn("every:60", "kill", True).every_s == 60
    plan = parse_churn("at:30,90", "int", False)
    assert plan.at_s == (30, 90) and plan.signal == "int" and not plan.replace
    for bad in ("60", "every:", "every:1,2", "at:x", "sometimes:5"):
        with pytest.raises(ScenarioError):
            parse_churn(bad, "kill", True)


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--peers", "2", "--delay", "40"],
            "--delay shape(s) emulated links: add --sites N or --scenario FILE",
        ),
        (["--sites", "2", "--peers", "2", "--uplink", "fast"], "Invalid value for '--uplink'"),
        (["--sites", "3", "--peers", "2"], "--peers 2 is fewer than --sites 3"),
        (["--peers", "2", "--churn", "often"], "--churn must be every:SECONDS or at:T1,T2"),
        (["--check-links"], "--check-links measures emulated links"),
        (["--scenario", "/nonexistent.toml"], "cannot read scenario /nonexistent.toml"),
    ],
)
def test_manta_swarm_network_options_fail_in_one_line(args, message):
    done = subprocess.run([console_script("manta-swarm"), *args], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], done.stderr
