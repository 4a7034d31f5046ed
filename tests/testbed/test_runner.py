"""How manta-swarm classifies its peers' exits (testbed.runner.failed_peers)."""

from __future__ import annotations

import signal

from testbed.runner import failed_peers


def test_only_exits_nobody_asked_for_are_failures():
    returncodes = {
        "peer-0": 0,  # left after its rounds, or on the stop's SIGTERM
        "peer-1": None,  # still running
        "peer-2": -signal.SIGKILL,  # the stop's last resort
        "peer-3": -signal.SIGKILL,  # killed by the churn
        "peer-4": -signal.SIGTERM,  # stopped while still starting: no handler installed yet
        "peer-5": -signal.SIGTERM,  # a SIGTERM manta-swarm never sent
        "peer-6": 1,  # an error
        "peer-7": -signal.SIGSEGV,  # a crash
        "peer-8": 1,  # an error, although the churn meant to kill it later
    }
    signalled = {"peer-0": {"term"}, "peer-4": {"term"}, "peer-6": {"term"}, "peer-3": {"kill"}}
    assert failed_peers(returncodes, signalled, killed_by_churn={"peer-3"}) == [
        "peer-5",
        "peer-6",
        "peer-7",
        "peer-8",
    ]
    assert failed_peers(returncodes, signalled, killed_by_churn={"peer-3", "peer-8"})[-1] == "peer-7"
