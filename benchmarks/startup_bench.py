"""What a process pays at start to build a task, its supernet and its state: as it does, and after the
imports the build avoids, side by side in one run.

Every peer agent, worker and aggregator builds the digits task and its supernet at start, all at once
when a local swarm starts. The build imports neither torchvision (which loads torch._dynamo) nor
scikit-learn, and the agent makes no torch optimizer only to learn its state's layout (which imports
torch._dynamo too). The "before" column runs the same build after those imports, in a fresh
interpreter each time, so the ratio is what they would cost.

    python -m benchmarks.startup_bench [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import resource
import shlex
import statistics
import subprocess
import sys
import time

AGENT_NOW = (
    "from supernet.workload import workload_for; from supernet.state import fresh_state_tensors; "
    "w = workload_for('digits'); net = w.build(); fresh_state_tensors(net, w.cfg.optimizer)"
)
AGENT_BEFORE = (
    "import torchvision.transforms.v2, sklearn.datasets; "
    "from supernet.workload import workload_for; from supernet.state import init_optimizer_state; "
    "w = workload_for('digits'); net = w.build(); init_optimizer_state(net, w.make_optimizer(net))"
)
WORKER_NOW = (
    "import torch; from supernet.workload import workload_for; from supernet.state import init_optimizer_state; "
    "w = workload_for('digits'); net = w.build(); init_optimizer_state(net, w.make_optimizer(net)); "
    "w.task.augmentation(torch.zeros(32, 1, 32, 32), torch.Generator())"
)
WORKER_BEFORE = "import torchvision.transforms.v2, sklearn.datasets; " + WORKER_NOW

CASES = [("agent: task, supernet, state", AGENT_NOW, AGENT_BEFORE),
         ("worker: task, supernet, optimizer, one augmented batch", WORKER_NOW, WORKER_BEFORE)]  # fmt: skip


def cpu_seconds(code: str) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of a fresh interpreter running ``code`` (imports included)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, timeout=300)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="fresh interpreters per variant (median)")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    print(f"command: python -m benchmarks.startup_bench {' '.join(shlex.quote(a) for a in sys.argv[1:])}")
    print(f"machine: {os.cpu_count()} cores, load average {load:.2f}")
    print("| process | before: CPU s | now: CPU s | before / now | before: wall s | now: wall s |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, now_code, before_code in CASES:
        now, before = [], []
        for i in range(args.repeats):
            print(f"  {name}: run {i + 1} of {args.repeats}", file=sys.stderr, flush=True)
            before.append(cpu_seconds(before_code))
            now.append(cpu_seconds(now_code))
        b_cpu, n_cpu = statistics.median(c for c, _ in before), statistics.median(c for c, _ in now)
        b_wall, n_wall = statistics.median(w for _, w in before), statistics.median(w for _, w in now)
        print(f"| {name} | {b_cpu:.2f} | {n_cpu:.2f} | {b_cpu / n_cpu:.2f} | {b_wall:.2f} | {n_wall:.2f} |")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
