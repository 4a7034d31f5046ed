#!/usr/bin/env bash
# The GPU machine's checks in one command, run at the repo root of a lent machine that has python3
# with torch but none of MANTA's other dependencies (they travel as wheels in .whl/, carried):
#   setup  install the wheels the machine lacks into /tmp/site, manta-* console scripts into /tmp/bin
#   join   scripts/gpu_join_check.sh: an aggregator and two `manta-peer join --gpus all` peers
#   bench  benchmarks/worker_throughput.py --device cuda: MANTA's worker against a plain PyTorch loop
#   swarm  benchmarks/swarm_capacity.py: the largest full-peer swarm under churn, on the CPU cores
# Every step is bounded (`timeout`) and the next one runs whatever the last did. Everything printed
# goes to $OUT/gpu_check.log, one JSON object of results to $OUT/gpu_check.json.
# Usage: scripts/gpu_device_check.sh   (OUT defaults to /tmp/gpu-check-out; the settings below can
# be given in the environment, e.g. STEPS="join bench" or BENCH_DEVICE=cpu SWARM_PEERS=3 for a dry run)
set -uo pipefail

# ---- time budget, seconds: the whole run ends within TOTAL_BUDGET (+ at most KILL_GRACE) ----------
TOTAL_BUDGET=${TOTAL_BUDGET:-555}
KILL_GRACE=15           # after a step's budget: SIGTERM, then SIGKILL this much later
SETUP_BUDGET=60         # each of: the machine's facts, pip install of ~25 wheels, the import check
JOIN_BUDGET=${JOIN_BUDGET:-150}        # start-up (~30 s), JOIN_ROUNDS rounds, shut-down
JOIN_ROUNDS=${JOIN_ROUNDS:-6}
BENCH_BUDGET=${BENCH_BUDGET:-120}      # a CUDA worker's start-up, then 1 warm-up and 5 timed rounds
BENCH_ARGS=${BENCH_ARGS:---batch-size 64 --subnets 4 --round-batches 24 --rounds 5}
# The swarm takes what is left: its time limit is the rest less SWARM_RESERVE (peers finishing
# their round, the aggregator closing, the summary), at most SWARM_MAX_LIMIT.
SWARM_PEERS=${SWARM_PEERS:-32}
SWARM_CHURN=${SWARM_CHURN:-every:60}
SWARM_RESERVE=130
SWARM_MAX_LIMIT=300
SWARM_MIN_LIMIT=90
SWARM_SITES=${SWARM_SITES:-4}          # used only where the emulated internet can run (iptables, root)
STEPS=${STEPS:-join bench swarm}
BENCH_DEVICE=${BENCH_DEVICE:-cuda}
SITE_DIR=${SITE_DIR:-/tmp/site}        # the wheels' install target (PYTHONPATH)
BIN_DIR=${BIN_DIR:-/tmp/bin}           # manta-* console scripts (PATH)
# ---------------------------------------------------------------------------------------------------

START=$SECONDS
OUT=${OUT:-/tmp/gpu-check-out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/gpu_check.log") 2>&1
TEE_PID=$!
RESULTS=$(mktemp -d /tmp/gpu-check-results.XXXXXX)
export PYTHONUNBUFFERED=1
left() { echo $((TOTAL_BUDGET - (SECONDS - START))); }
say() { echo "[$(printf '%4d' $((SECONDS - START)))s] $*"; }

# One step: its own marker in the environment of every process it starts, so that whatever the
# step leaves behind (a peer's p2pd in a session of its own) is found and ended afterwards.
run_step() {
    local name=$1 budget=$2
    shift 2
    say "=== $name: budget ${budget} s: $*"
    local t0=$SECONDS rc=0
    MANTA_DEVICE_STEP=$name timeout -k "$KILL_GRACE" "$budget" "$@" || rc=$?
    reap "$name"
    say "=== $name: exit $rc after $((SECONDS - t0)) s$([ "$rc" -eq 124 ] && echo ' (timed out)')"
    printf '{"step": "%s", "exit": %d, "seconds": %d, "budget": %d}\n' "$name" "$rc" $((SECONDS - t0)) "$budget" \
        >"$RESULTS/$name.step.json"
    return 0
}

reap() {
    python3 - "$1" <<'EOF'
import os, sys, psutil
left = []
for p in psutil.process_iter(["name"]):
    try:
        if p.pid != os.getpid() and p.environ().get("MANTA_DEVICE_STEP") == sys.argv[1]:
            left.append(p)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        pass
for p in left:
    try:
        p.kill()
    except psutil.NoSuchProcess:
        pass
if left:
    print(f"ended {len(left)} process(es) the step left: {sorted({p.info['name'] for p in left})}")
EOF
}

# ---- setup -----------------------------------------------------------------------------------------
say "=== machine"
uname -srm
nproc
free -g | head -2
timeout 20 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 || echo "no nvidia-smi"
python3 --version
timeout "$SETUP_BUDGET" python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")'
command -v iptables ip tc || true
uptime

say "=== setup: the carried wheels the machine lacks"
setup() {
    [ -d .whl ] || { echo "no .whl folder: carry it (carry: [\".whl\"])"; return 1; }
    local wheels
    wheels=$(python3 scripts/device_env.py wheels .whl) || return 1
    # shellcheck disable=SC2086
    timeout "$SETUP_BUDGET" python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE_DIR" $wheels || return 1
    export PYTHONPATH=$SITE_DIR:$PWD
    export PATH=$BIN_DIR:$PATH
    python3 scripts/device_env.py scripts "$BIN_DIR" || return 1
    local p2pd=$SITE_DIR/hivemind/hivemind_cli/p2pd
    [ -x "$p2pd" ] || chmod +x "$p2pd"
    timeout "$SETUP_BUDGET" python3 -c '
import importlib.metadata as m, google.protobuf, hivemind, pydantic, cryptography, rfc8785
import peer.cli, aggregator.cli, testbed.cli
for name in ("hivemind", "pydantic", "pydantic_core", "cryptography", "protobuf", "typing_extensions", "click", "msgpack", "uvloop", "numpy", "torch", "scikit-learn", "aiohttp", "psutil"):
    try:
        print(f"  {name} {m.version(name)}")
    except m.PackageNotFoundError:
        print(f"  {name} MISSING")
print("  protobuf from", google.protobuf.__file__)
' || return 1
    manta-peer --version && manta-swarm --help >/dev/null && echo "console scripts: ok"
}
setup_rc=0
setup || setup_rc=$?
printf '{"step": "setup", "exit": %d, "seconds": %d}\n' "$setup_rc" $((SECONDS - START)) >"$RESULTS/setup.step.json"
if [ "$setup_rc" -ne 0 ]; then
    say "setup failed (exit $setup_rc): nothing else can run"
else
    # ---- 1: the --gpus all join check --------------------------------------------------------------
    budget=$(( JOIN_BUDGET < $(left) ? JOIN_BUDGET : $(left) ))
    [[ " $STEPS " != *" join "* ]] || GPU_CHECK_TIME_LIMIT=$((budget - 35)) run_step join "$budget" bash scripts/gpu_join_check.sh "$JOIN_ROUNDS"

    # ---- 2: one worker's throughput against a plain loop ------------------------------------------
    budget=$(( BENCH_BUDGET < $(left) ? BENCH_BUDGET : $(left) ))
    # shellcheck disable=SC2086
    [[ " $STEPS " != *" bench "* ]] || run_step bench "$budget" python3 -m benchmarks.worker_throughput --device "$BENCH_DEVICE" $BENCH_ARGS \
        --json "$OUT/worker_throughput.json"

    # ---- 3: the largest swarm of full peers under churn --------------------------------------------
    sites=0
    if [ "$SWARM_SITES" -gt 0 ] && command -v iptables >/dev/null && command -v tc >/dev/null \
        && command -v sysctl >/dev/null && [ -c /dev/net/tun ] && ip netns add manta-probe 2>/dev/null; then
        ip netns del manta-probe
        sites=$SWARM_SITES
        say "iptables, tc and network namespaces work: the swarm runs on the emulated internet ($sites sites)"
    elif [ "$SWARM_SITES" -gt 0 ]; then
        say "no emulated internet here (iptables, tc, sysctl, /dev/net/tun or network namespaces missing): loopback churn"
    else
        say "SWARM_SITES=0: loopback churn"
    fi
    remaining=$(left)
    limit=$((remaining - SWARM_RESERVE))
    [ "$limit" -le "$SWARM_MAX_LIMIT" ] || limit=$SWARM_MAX_LIMIT
    if [[ " $STEPS " != *" swarm "* ]]; then
        say "swarm: not among STEPS ($STEPS)"
    elif [ "$limit" -lt "$SWARM_MIN_LIMIT" ]; then
        say "only $remaining s left: no time for the swarm (needs $((SWARM_MIN_LIMIT + SWARM_RESERVE)) s)"
    else
        deadline=$((limit + SWARM_RESERVE - 10))
        run_step swarm $((deadline + 5)) python3 -m benchmarks.swarm_capacity --peers "$SWARM_PEERS" \
            --churn "$SWARM_CHURN" --sites "$sites" --time-limit "$limit" --deadline "$deadline" \
            --out /tmp/gpu-check-swarm --json "$OUT/swarm_capacity.json"
        [ -f /tmp/gpu-check-swarm/summary.json ] && cp /tmp/gpu-check-swarm/summary.json "$OUT/swarm_summary.json"
    fi
fi

# ---- the machine-readable summary ------------------------------------------------------------------
python3 - "$RESULTS" "$OUT" <<'EOF'
import json, os, sys
from pathlib import Path
results, out = Path(sys.argv[1]), Path(sys.argv[2])
summary = {"steps": {}, "load_average": os.getloadavg()}
for f in sorted(results.glob("*.step.json")):
    step = json.loads(f.read_text())
    summary["steps"][step.pop("step")] = step
for name, file in (("bench", "worker_throughput.json"), ("swarm", "swarm_capacity.json")):
    if (out / file).exists():
        summary.setdefault("results", {})[name] = json.loads((out / file).read_text())
(out / "gpu_check.json").write_text(json.dumps(summary, indent=2) + "\n")
print(json.dumps({k: v for k, v in summary["steps"].items()}))
EOF
rm -rf "$RESULTS"
say "=== done in $((SECONDS - START)) s; results in $OUT/gpu_check.json, log in $OUT/gpu_check.log"
exec >&- 2>&-
wait "$TEE_PID" 2>/dev/null || true
