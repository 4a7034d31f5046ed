"""Per-peer kernel accounts for benchmarks that run many thin peers on one host: one cgroup per peer
(its processes, its ``p2pd`` included, join it), an iptables rule counting the bytes each cgroup
sends, the CPU time and proportional memory of each, and a kill of everything in them. Needs root."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup/unified")


def _iptables(*args: str) -> str:
    return subprocess.run(["iptables", "-w", *args], check=True, capture_output=True, text=True).stdout


class PeerAccounts:
    """One cgroup per thin peer and an iptables rule counting the bytes its processes send."""

    def __init__(self, tag: str, count: int):
        self.chain = f"MSCALE{tag}"[:28]
        self.root = f"manta-scale-{tag}"
        self.cgroups = [f"{self.root}/peer-{i}" for i in range(count)]
        self.flags = Path(tempfile.mkdtemp(prefix="manta-scale-"))
        for group in self.cgroups:
            (CGROUP_ROOT / group).mkdir(parents=True, exist_ok=True)
        _iptables("-N", self.chain)
        _iptables("-I", "OUTPUT", "-j", self.chain)
        for group in self.cgroups:
            _iptables("-A", self.chain, "-m", "cgroup", "--path", group, "-j", "RETURN")

    def bytes_sent(self) -> list[int]:
        out = _iptables("-L", self.chain, "-v", "-n", "-x")
        by_group = {line.split()[-1]: int(line.split()[1]) for line in out.splitlines() if " cgroup " in line}
        return [by_group.get(group, 0) for group in self.cgroups]

    def cpu_seconds(self) -> list[float]:
        """The CPU time each peer's processes used so far (its cgroup's ``usage_usec``, children included)."""
        seconds = []
        for group in self.cgroups:
            stat = (CGROUP_ROOT / group / "cpu.stat").read_text()
            usec = next(int(line.split()[1]) for line in stat.splitlines() if line.startswith("usage_usec"))
            seconds.append(usec / 1e6)
        return seconds

    def pss_mib(self) -> list[float]:
        """Each peer's proportional set size: its processes' share of the memory they use."""
        sizes = []
        for group in self.cgroups:
            total = 0
            for pid in (CGROUP_ROOT / group / "cgroup.procs").read_text().split():
                try:
                    rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
                except OSError:
                    continue
                total += next(
                    (int(line.split()[1]) for line in rollup.splitlines() if line.startswith("Pss:")), 0
                )
            sizes.append(total / 1024)
        return sizes

    def kill(self) -> None:
        """SIGKILL every process still in a peer's cgroup (its agent, DHT, averagers and p2pd)."""
        for group in self.cgroups:
            try:
                (CGROUP_ROOT / group / "cgroup.kill").write_text("1")
            except OSError:
                pass

    def close(self) -> None:
        subprocess.run(["iptables", "-w", "-D", "OUTPUT", "-j", self.chain], capture_output=True)
        subprocess.run(["iptables", "-w", "-F", self.chain], capture_output=True)
        subprocess.run(["iptables", "-w", "-X", self.chain], capture_output=True)
        self.kill()
        shutil.rmtree(self.flags, ignore_errors=True)
        deadline = time.monotonic() + 30
        for group in [*self.cgroups, self.root]:
            while (CGROUP_ROOT / group).exists():
                try:
                    (CGROUP_ROOT / group).rmdir()  # refused while an exiting process is still inside
                except OSError:
                    if time.monotonic() > deadline:
                        print(f"swarm_scale: could not remove cgroup {group}", file=sys.stderr)
                        break
                    time.sleep(0.2)
