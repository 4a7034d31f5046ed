"""A link measured while the host ran other guests on this machine's cores is shown, not judged."""

from __future__ import annotations

from testbed.wan import linkcheck
from testbed.wan.linkcheck import CheckRow, HostSteal, judged_under_steal


def _row(ok: bool | None) -> CheckRow:
    return CheckRow("site-1", "downlink rate", "50mbit", "44mbit on the wire", ok, "sender: 94 retransmitted")


def test_a_rate_off_its_setting_under_host_steal_is_unjudged_with_the_reason():
    row = judged_under_steal(_row(False), 0.2)
    assert row.ok is None and row.verdict == "-"
    assert "20 % of this machine's CPU time" in row.note and "sender: 94 retransmitted" in row.note


def test_a_rate_off_its_setting_on_a_machine_the_host_left_alone_stays_off():
    assert judged_under_steal(_row(False), linkcheck.HOST_STEAL_LIMIT / 2).ok is False


def test_a_rate_on_its_setting_is_judged_whatever_the_host_did():
    assert judged_under_steal(_row(True), 0.5).ok is True


def test_the_hosts_share_is_read_from_proc_stat_and_is_a_fraction():
    steal = HostSteal()
    sum(i * i for i in range(200_000))  # let some CPU time pass
    assert 0.0 <= steal.share() <= 1.0
