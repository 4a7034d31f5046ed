#!/usr/bin/env bash
# The default suite in two phases (what `make test` runs):
#   1. the tests that share the machine well, spread over JOBS pytest-xdist workers (an idle one
#      takes tests queued for another, so no worker ends the phase alone);
#   2. the `swarm` and `exclusive` tests one at a time, with nothing else running: they start many
#      processes, or measure rates and round trips, and what competes for the CPU changes their timing.
# Extra arguments go to both phases (a file or -k selects within each). Exits non-zero if either
# phase failed; a phase that selects no test (pytest's status 5) is not a failure.
set -uo pipefail
# The suite starts hundreds of Python processes (peers, aggregators, console scripts) and collects
# its tests in each phase and worker: with bytecode caching off, every one compiles the sources again.
unset PYTHONDONTWRITEBYTECODE
py=$1
shift
jobs=${JOBS:-$(python3 -c 'import os; print(max(1, min(4, len(os.sched_getaffinity(0)))))')}
start=$SECONDS
status=0
run_phase() {
  "$py" -m pytest "$@"
  local rc=$?
  if [[ $rc -ne 0 && $rc -ne 5 ]]; then status=$rc; fi
}
echo "manta: phase 1 of 2: the tests that share the machine, on $jobs worker(s)"
run_phase -m "not slow and not swarm and not exclusive" -n "$jobs" --dist worksteal "$@"
echo "manta: phase 2 of 2: swarm and exclusive tests, one at a time"
run_phase -m "not slow and (swarm or exclusive)" "$@"
echo "manta: test suite $([[ $status -eq 0 ]] && echo passed || echo FAILED) in $((SECONDS - start)) s"
exit $status
