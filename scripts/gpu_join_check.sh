#!/usr/bin/env bash
# The `--gpus all` path on a machine with GPUs: an aggregator and two peers that join with
# `manta-peer join --gpus all` (each peer one worker per visible GPU), ROUNDS rounds of the digits task.
# Prints each peer's round lines and fails unless both peers committed every round with the same
# state digests and trained on CUDA. Usage: scripts/gpu_join_check.sh [ROUNDS] (needs manta-* on PATH).
# GPU_CHECK_TIME_LIMIT=SECONDS stops the peers after that long and fails, printing the rounds so far
# (default: no limit), so that a run under an outer `timeout` still says how far it got.
set -euo pipefail
ROUNDS=${1:-6}
[[ "$ROUNDS" =~ ^[1-9][0-9]*$ ]] || { echo "ROUNDS must be a positive number, got '$ROUNDS'" >&2; exit 2; }
TIME_LIMIT=${GPU_CHECK_TIME_LIMIT:-0}
[[ "$TIME_LIMIT" =~ ^[0-9]+$ ]] || { echo "GPU_CHECK_TIME_LIMIT must be whole seconds" >&2; exit 2; }
STARTED=$SECONDS
WORK=$(mktemp -d /tmp/manta-gpu-check.XXXXXX)
PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do timeout 30 tail --pid="$pid" -f /dev/null || kill -9 "$pid" 2>/dev/null || true; done
    rm -rf "$WORK"
}
trap cleanup EXIT
cat >"$WORK/task.toml" <<EOF
[task]
id = "digits-gpu-check"
name = "digits"
[swarm]
target_samples_per_round = 256
batch_size = 64
subnets_per_step = 2
EOF
manta-aggregator start --task "$WORK/task.toml" --listen 127.0.0.1:0 --identity "$WORK/agg.key" \
    --data-dir "$WORK/agg" --http off >"$WORK/agg.out" 2>"$WORK/agg.err" &
PIDS+=($!)
for _ in $(seq 120); do
    grep -q "manta-peer join" "$WORK/agg.out" 2>/dev/null && break
    sleep 0.5
done
# The aggregator prints a shell line (`manta-peer join --task T --aggregator-key HEX --initial-peers A
# --initial-peers B ...`, quoted as a shell would need it): its words after `manta-peer join`, unquoted.
LINE=$(grep -m1 "manta-peer join" "$WORK/agg.out") || { echo "no join line"; cat "$WORK/agg.err"; exit 1; }
eval "JOIN=(${LINE#*manta-peer join })"
echo "join arguments: ${JOIN[*]}" | cut -c1-300
for name in alice bob; do
    manta-peer join "${JOIN[@]}" --gpus all --listen 127.0.0.1:0 --identity "$WORK/$name.key" \
        --data-dir "$WORK/$name" --max-rounds "$ROUNDS" >"$WORK/$name.out" 2>"$WORK/$name.err" &
    PIDS+=($!)
done
status=0
while kill -0 "${PIDS[1]}" 2>/dev/null || kill -0 "${PIDS[2]}" 2>/dev/null; do
    if [ "$TIME_LIMIT" -gt 0 ] && [ $((SECONDS - STARTED)) -ge "$TIME_LIMIT" ]; then
        echo "time limit of $TIME_LIMIT s reached: stopping the peers"
        kill -TERM "${PIDS[1]}" "${PIDS[2]}" 2>/dev/null || true
        for _ in $(seq 20); do  # 20 s to finish their round and leave, together
            kill -0 "${PIDS[1]}" 2>/dev/null || kill -0 "${PIDS[2]}" 2>/dev/null || break
            sleep 1
        done
        kill -9 "${PIDS[1]}" "${PIDS[2]}" 2>/dev/null || true
        status=124
        break
    fi
    sleep 1
done
for i in 1 2; do
    code=0
    wait "${PIDS[$i]}" || code=$?
    [ "$status" -ne 0 ] || status=$code
done
for name in alice bob; do
    echo "== $name"
    grep -E "training on|round [0-9]+:" "$WORK/$name.err" | cut -c1-220 || true
done
[ "$status" -eq 0 ] || { echo "a peer failed (exit $status)"; tail -n 20 "$WORK"/*.err "$WORK"/*.out; exit 1; }
digests() { grep -oE "round [0-9]+: committed.*state [0-9a-f]{12}" "$WORK/$1.err" | grep -oE "state [0-9a-f]{12}"; }
[ "$(digests alice | wc -l)" -eq "$ROUNDS" ] || { echo "alice committed fewer than $ROUNDS rounds"; exit 1; }
[ "$(digests alice)" = "$(digests bob)" ] || { echo "the peers' states differ"; exit 1; }
grep -q "training on .*cuda" "$WORK/alice.err" || { echo "no CUDA worker"; exit 1; }
echo "gpu check passed: $ROUNDS rounds committed on CUDA workers, identical states"
