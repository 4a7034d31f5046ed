"""`manta-aggregator start` and `manta-peer join` as a user runs them: separate processes on 127.0.0.1."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import time

import psutil
import pytest

from tests.helpers import console_script, socket_files
from tests.peer.cli_swarm import TASK_TOML, Swarm, _env

pytestmark = pytest.mark.swarm


@pytest.fixture
def swarm(tmp_path):
    s = Swarm(tmp_path)
    try:
        yield s
    finally:
        s.stop()


# Slow (make test-all): `manta-swarm` in test_swarm_training also has peers join and hold identical
# state; this one adds three peers in one cohort and a two-worker peer.
@pytest.mark.slow
def test_peers_join_train_together_and_hold_identical_state(swarm):
    names = ["alice", "bob", "carol"]
    extra = {"carol": ["--cpu-workers", "2"]}  # carol's two workers sum their gradients with gloo first
    for name in names:
        swarm.join(name, "--max-rounds", "4", *extra.get(name, []))
    for name in names:
        assert swarm.procs[name].wait(timeout=400) == 0, swarm.log(name)[-3000:]
        assert "Traceback" not in swarm.log(name)
    rounds = {name: swarm.rounds(name) for name in names}
    # Wherever two peers committed the same round, they hold bit-identical state.
    for r in set().union(*(rounds[n].keys() for n in names)):
        digests = {rounds[n][r]["digest"] for n in names if r in rounds[n] and rounds[n][r]["committed"]}
        assert len(digests) <= 1, f"peers differ after round {r}: {digests}"
    together = [
        r
        for r in rounds["alice"]
        if all(
            r in rounds[n] and rounds[n][r]["committed"] and rounds[n][r]["contributors"] == 3 for n in names
        )
    ]
    assert together, f"no round averaged all three peers: {rounds}"
    # Three peers on one host form one cohort.
    assert {rounds[n][together[0]]["cohort"] for n in names} == {rounds["alice"][together[0]]["cohort"]}


# Slow (30 s, `make test-all`): the only test of a second aggregator adopting the first's task; the
# default suite joins through the printed line (tests/aggregator/test_join_line.py).
@pytest.mark.slow
def test_a_second_aggregator_joins_the_first_and_bootstraps_a_newcomer(swarm, tmp_path):
    first = [a for a in swarm.join_args if a.startswith("/ip4/")]
    with socket_closed_port() as port:
        second = swarm._spawn(
            "aggregator2",
            [
                console_script("manta-aggregator"),
                "start",
                "--task",
                str(tmp_path / "task.toml"),
                "--listen",
                f"0.0.0.0:{port}",
                "--announce",
                f"127.0.0.1:{port}",
                "--initial-peers",
                *first,
                "--identity",
                str(tmp_path / "agg2.key"),
                "--data-dir",
                str(tmp_path / "agg2"),
                "--refresh",
                "5",
            ],
        )
    swarm.wait_for(
        lambda: "manta-peer join" in (tmp_path / "aggregator2.out").read_text(), 60, "the second join line"
    )
    line = next(x for x in (tmp_path / "aggregator2.out").read_text().splitlines() if "manta-peer join" in x)
    assert f"/ip4/127.0.0.1/tcp/{port}/p2p/" in line, line  # the announced address, not the 0.0.0.0 listener
    assert "adopting task digits-cli-test" in (tmp_path / "aggregator2.err").read_text()
    # A newcomer that knows only the second aggregator finds the task the first one published.
    peer = swarm._spawn(
        "newcomer",
        [
            console_script("manta-peer"),
            "join",
            "--initial-peers",
            line.split("--initial-peers ")[1].split()[0],
            "--gpus",
            "none",
            "--listen",
            "127.0.0.1:0",
            "--identity",
            str(tmp_path / "n.key"),
            "--data-dir",
            str(tmp_path / "n"),
            "--max-rounds",
            "1",
        ],
    )
    assert peer.wait(timeout=240) == 0, swarm.log("newcomer")[-3000:]
    assert "joined task digits-cli-test" in swarm.log("newcomer")
    assert second.poll() is None
    # The bootstrap node it joined through goes away for good: the second aggregator still stops on
    # SIGTERM within its bounded waits (it once hung in an unbounded DHT read until kill -9).
    swarm.procs["aggregator"].send_signal(signal.SIGKILL)
    swarm.procs["aggregator"].wait(timeout=30)
    time.sleep(2)
    second.send_signal(signal.SIGTERM)
    started = time.monotonic()
    assert second.wait(timeout=120) == 0, swarm.log("aggregator2")[-3000:]
    print(f"the orphaned aggregator stopped {time.monotonic() - started:.1f} s after SIGTERM")


def test_a_plain_hivemind_node_reads_the_published_task(swarm):
    import hivemind

    dht = hivemind.DHT(
        initial_peers=[a for a in swarm.join_args if a.startswith("/ip4/")],
        host_maddrs=["/ip4/127.0.0.1/tcp/0"],
        start=True,
    )
    try:
        found = dht.get("manta_digits-cli-test_task", latest=True)
        assert found is not None
        (entry,) = found.value.values()
        assert entry.value.startswith(b"manta/task/v1\n") and b'"task_id":"digits-cli-test"' in entry.value
    finally:
        dht.shutdown()


def test_unreachable_initial_peer_is_a_one_line_error(tmp_path):
    sockets_before = socket_files()
    with socket_closed_port() as port:
        done = subprocess.run(
            [
                console_script("manta-peer"),
                "join",
                "--initial-peers",
                f"/ip4/127.0.0.1/tcp/{port}/p2p/QmSBUfPjhdbT5M2uQ6xHzpfukzPy4zLikVL22vxNhiqVzx",
                "--gpus",
                "none",
                "--identity",
                str(tmp_path / "p.key"),
                "--data-dir",
                str(tmp_path / "p"),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            env=_env(),
        )
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
    assert errors == [errors[0]] and "cannot reach any initial peer" in errors[0]
    # the daemon that gave up on its bootstrap leaves no socket file behind
    assert not socket_files() - sockets_before, socket_files() - sockets_before


def test_usr1_shows_a_peers_threads_and_kill_9_leaves_none_of_its_processes(swarm):
    peer = swarm.join("victim")
    swarm.wait_for(lambda: 0 in swarm.rounds("victim"), 180, "the victim's first round")
    family = psutil.Process(peer.pid).children(recursive=True)
    names = sorted({p.name() for p in family})
    assert "p2pd" in names and len(family) >= 3, names  # the worker, p2pd, the reaper
    # a peer that seems stuck says where its threads are, and carries on
    os.kill(peer.pid, signal.SIGUSR1)
    # the main thread's stack, with the join command's frames, comes last in the dump
    swarm.wait_for(lambda: "peer/cli.py" in swarm.log("victim"), 10, "every thread's stack")
    assert "most recent call first" in swarm.log("victim") and peer.poll() is None
    os.kill(peer.pid, signal.SIGKILL)
    peer.wait(timeout=10)
    gone, alive = psutil.wait_procs(family, timeout=20)
    assert not alive, f"left running after kill -9: {[(p.pid, p.name()) for p in alive]}"


def test_a_peer_whose_p2p_daemon_died_says_so_in_one_line_and_leaves_nothing(swarm):
    """Its p2pd daemon gone (killed here, as the OOM killer might), a peer can neither average nor
    post: its DHT node ends with the daemon, and it stops with one line and a non-zero exit, instead of
    failing round after round, or hanging on an averager that waits for the daemon forever."""
    peer = swarm.join("orphan")
    swarm.wait_for(lambda: 0 in swarm.rounds("orphan"), 180, "the peer's first round")
    family = psutil.Process(peer.pid).children(recursive=True)
    daemon = next(p for p in family if p.name() == "p2pd")
    assert daemon.parent().pid == peer.pid  # the DHT and the averagers are served from the peer's threads
    listened = _socket_files_of([psutil.Process(peer.pid), *family])
    assert any("hivemind-p2pd" in path for path in listened), listened  # the daemon's, among them
    daemon.kill()
    # it asks its dead daemon nothing on the way out (each question waited out its bound: 27 s in all)
    assert swarm.peer_exit_code("orphan", timeout=20) != 0, swarm.log("orphan")[-3000:]
    log = swarm.log("orphan")
    assert "Traceback" not in log, log[-3000:]
    assert "the peer's DHT node stopped" in log.strip().splitlines()[-1], log[-2000:]
    gone, alive = psutil.wait_procs(family, timeout=20)
    assert not alive, f"left running: {[(p.pid, p.name()) for p in alive]}"
    assert not [path for path in listened if os.path.exists(path)], "socket files left in /tmp"


def _socket_files_of(procs: list[psutil.Process]) -> set[str]:
    """The unix socket files in /tmp that ``procs`` listen on (hivemind's, multiprocessing's)."""
    paths = set()
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            paths |= {c.laddr for c in proc.net_connections(kind="unix") if isinstance(c.laddr, str)}
    return {
        p
        for p in paths
        if p.startswith(tempfile.gettempdir() + "/") and ("hivemind-p2p" in p or "/pymp-" in p)
    }


def test_an_aggregator_whose_dht_process_died_says_so_in_one_line_and_closes_its_ledger(swarm):
    """The operator's side of the same loss: the aggregator stops serving a task nobody can reach,
    appends what it had queued, and exits with one line instead of logging "0 peer(s) online"."""
    agg = swarm.procs["aggregator"]
    family = psutil.Process(agg.pid).children(recursive=True)
    daemon = next(p for p in family if p.name() == "p2pd")
    daemon.parent().kill()  # the aggregator's DHT process
    assert agg.wait(timeout=240) != 0, (swarm.dir / "aggregator.err").read_text()[-3000:]
    log = (swarm.dir / "aggregator.err").read_text()
    assert "Traceback" not in log, log[-3000:]
    assert "the aggregator's DHT process ended" in log.strip().splitlines()[-1], log[-2000:]
    assert "contributions: {" in log, log[-2000:]  # its ledger closed as at a normal stop
    gone, alive = psutil.wait_procs(family, timeout=20)
    assert not alive, f"left running: {[(p.pid, p.name()) for p in alive]}"


class socket_closed_port:
    """A local port with nothing listening on it."""

    def __enter__(self) -> int:
        import socket

        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        self.port = s.getsockname()[1]
        s.close()
        return self.port

    def __exit__(self, *exc) -> None:
        pass


def test_ctrl_c_finishes_the_round_leaves_cleanly_and_withdraws_the_announcement(swarm):
    import hivemind

    from protocol.dht_schema import open_peer_value, peers_key

    swarm.join("stayer", "--max-rounds", "40")
    leaver = swarm.join("leaver", "--max-rounds", "40")
    swarm.wait_for(
        lambda: any(r["contributors"] == 2 for r in swarm.rounds("leaver").values()),
        240,
        "a round the two peers averaged together",
    )
    leaver.send_signal(signal.SIGINT)
    assert leaver.wait(timeout=120) == 0, swarm.log("leaver")[-3000:]
    assert "stopping after this round" in swarm.log("leaver") and "Traceback" not in swarm.log("leaver")
    assert "left after" in (swarm.dir / "leaver.out").read_text()
    dht = hivemind.DHT(
        initial_peers=[a for a in swarm.join_args if a.startswith("/ip4/")],
        host_maddrs=["/ip4/127.0.0.1/tcp/0"],
        start=True,
    )
    try:
        entries = dht.get(peers_key("digits-cli-test"), latest=True).value
        states = {}
        for subkey, item in entries.items():
            announcement = open_peer_value("digits-cli-test", subkey, item.value).announcement.record
            states[announcement.peer_id] = announcement.throughput_milli
    finally:
        dht.shutdown()
    assert sorted(states.values())[0] == 0 and sorted(states.values())[1] > 0, states  # leaver withdrawn
    # The stayer carries on alone without waiting for the departed peer's record to expire.
    before = len(swarm.rounds("stayer"))
    swarm.wait_for(
        lambda: any(
            r["committed"] and r["contributors"] == 1
            for i, r in swarm.rounds("stayer").items()
            if i >= before
        ),
        120,
        "a round the stayer commits alone",
    )


@pytest.mark.slow  # 39 s; a client-mode peer across cohorts: test_swarm_wan's NAT site; fp16: averaging/test_hierarchy
def test_a_client_mode_peer_trains_with_a_public_peer_across_cohorts_in_fp16(tmp_path):
    """A peer behind NAT (--client-mode: connects out, serves nothing, never reduces) and a public peer,
    in two explicit cohorts, so their averages cross the cohort boundary in fp16."""
    s = Swarm(tmp_path, TASK_TOML + "cross_cohort_fp16 = true\n")
    try:
        s.join("public", "--max-rounds", "3", "--cohort", "lab-a")
        s.join("natted", "--max-rounds", "3", "--cohort", "lab-b", "--client-mode")
        for name in ("public", "natted"):
            assert s.procs[name].wait(timeout=400) == 0, s.log(name)[-3000:]
            assert "Traceback" not in s.log(name)
        public, natted = s.rounds("public"), s.rounds("natted")
        shared = [r for r in public if r in natted and public[r]["committed"] and natted[r]["committed"]]
        assert shared and all(public[r]["digest"] == natted[r]["digest"] for r in shared), (public, natted)
        assert all(public[r]["contributors"] == 2 for r in shared)
        assert {public[shared[0]]["cohort"], natted[shared[0]]["cohort"]} == {"lab-a", "lab-b"}
    finally:
        s.stop()
