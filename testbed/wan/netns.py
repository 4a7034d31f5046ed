"""The few kernel tools the emulated internet is made with (``ip``, ``tc``, ``iptables``, sysctls),
each call bounded and each failure one line that names the command.

Everything here acts on network namespaces named ``manta-tb-<run>-<part>``; nothing touches the
machine's own namespace except creating and deleting those.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

NETNS_DIR = Path("/var/run/netns")
PREFIX = "manta-tb-"
CAP_NET_ADMIN, CAP_SYS_ADMIN = 12, 21


class TestbedError(RuntimeError):
    """The emulated internet cannot be built or measured; the message is one line for the user."""


def run(argv: list[str], timeout: float = 30.0, check: bool = True) -> str:
    """Run a tool and return its stdout; a failure raises TestbedError with the command and its error."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise TestbedError(f"{argv[0]} is not installed") from None
    except subprocess.TimeoutExpired:
        raise TestbedError(f"{' '.join(argv)} did not finish within {timeout:.0f} s") from None
    if check and done.returncode != 0:
        error = (done.stderr.strip() or done.stdout.strip() or f"exit status {done.returncode}").splitlines()
        raise TestbedError(f"{' '.join(argv)}: {error[-1]}")
    return done.stdout


def ip(namespace: str | None, *args: str, check: bool = True) -> str:
    return run(["ip", *(["-n", namespace] if namespace else []), *args], check=check)


def in_namespace(namespace: str, argv: list[str]) -> list[str]:
    """``argv`` run inside ``namespace``: ``ip netns exec`` execs it, so the pid is the program's own."""
    return ["ip", "netns", "exec", namespace, *argv]


def sysctl(namespace: str, key: str, value: str) -> None:
    run(in_namespace(namespace, ["sysctl", "-q", "-w", f"{key}={value}"]))


def namespaces() -> list[str]:
    try:
        return sorted(p.name for p in NETNS_DIR.iterdir())
    except FileNotFoundError:
        return []


def namespace_pids(namespace: str) -> list[int]:
    out = ip(None, "netns", "pids", namespace, check=False)
    return [int(x) for x in out.split() if x.isdigit()]


def kill_namespace_processes(names: list[str], timeout: float = 10.0) -> None:
    """SIGKILL every process that lives in one of ``names``, and wait (bounded) until they are gone."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = [pid for ns in names if (NETNS_DIR / ns).exists() for pid in namespace_pids(ns)]
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)


def delete_namespaces(names: list[str]) -> None:
    """Stop what runs inside, then delete the namespaces (and with them every interface they hold)."""
    kill_namespace_processes(names)
    for ns in names:
        if (NETNS_DIR / ns).exists():
            ip(None, "netns", "del", ns, check=False)


def _capabilities() -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    except OSError:
        pass
    return 0


def require_privileges() -> None:
    """One line saying what is missing, before anything is built."""
    caps = _capabilities()  # root normally holds both; a root shell stripped of them cannot build either
    if not (caps >> CAP_NET_ADMIN & 1 and caps >> CAP_SYS_ADMIN & 1):
        raise TestbedError(
            "the emulated internet needs root (or CAP_NET_ADMIN and CAP_SYS_ADMIN) to create network "
            "namespaces; run it with sudo"
        )
    for tool, package in (
        ("ip", "iproute2"),
        ("tc", "iproute2"),
        ("sysctl", "procps"),
        ("iptables", "iptables"),
    ):
        if shutil.which(tool) is None:
            raise TestbedError(f"{tool} is not installed (apt-get install {package})")
    if not os.access("/dev/net/tun", os.R_OK | os.W_OK):
        raise TestbedError("/dev/net/tun is missing or not accessible: the emulated links need TAP devices")
