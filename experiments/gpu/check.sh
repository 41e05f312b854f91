#!/usr/bin/env bash
# The GPU check of issue 6, for a machine with one GPU (an H200 in mind):
#   OUT=/some/dir experiments/gpu/check.sh
# Builds for sm_90, runs the `gpu` tests, then training throughput (meshtrain
# and PyTorch), calibration and the simulator's prediction. Every step records
# an entry in $OUT/gpu-results.json (status ok / failed / not available) and
# its output in $OUT/gpu-check.log; a failing step never stops the others.
set -uo pipefail
cd "$(dirname "$0")/../.."

OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
LOG="$OUT/gpu-check.log"
RESULTS="$OUT/gpu-results.json"
BUILD="${BUILD:-build-gpu}"
JOBS="${JOBS:-$(nproc)}"
MT="$BUILD/engine/meshtrain"
: >"$LOG"
ENTRIES=()

json_str() {  # a JSON string literal of $1
  local s=${1//\\/\\\\}
  s=${s//\"/\\\"}
  s=${s//$'\n'/\\n}
  s=${s//$'\t'/ }
  printf '"%s"' "$s"
}
# record NAME STATUS SECONDS DETAIL [EXTRA_JSON_FIELDS]
record() {
  local extra=${5:+, $5}
  ENTRIES+=("{\"step\": $(json_str "$1"), \"status\": $(json_str "$2"), \"seconds\": $3, \"detail\": $(json_str "$4")$extra}")
  echo "== $1: $2 ($3 s) $4" | tee -a "$LOG"
}
# run NAME CMD...: runs with output to the log; sets RC and SECS.
run() {
  local name=$1
  shift
  echo "== $name: $*" >>"$LOG"
  local t0=$SECONDS
  "$@" >>"$LOG" 2>&1
  RC=$?
  SECS=$((SECONDS - t0))
}
write_results() {
  {
    echo "{"
    echo "  \"gpu\": $(json_str "$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo unknown)"),"
    echo "  \"commit\": $(json_str "$(git rev-parse HEAD 2>/dev/null || echo unknown)"),"
    echo "  \"steps\": ["
    local i
    for i in "${!ENTRIES[@]}"; do
      [[ $i -gt 0 ]] && echo ","
      printf '    %s' "${ENTRIES[$i]}"
    done
    echo
    echo "  ]"
    echo "}"
  } >"$RESULTS"
}
trap write_results EXIT

# A text corpus for the training runs: any bytes are tokens.
DATA="$OUT/train.txt"
if [[ ! -s "$DATA" ]]; then
  for f in README.md DESIGN.md backends/*.h backends/*/*.h backends/*/*.cc engine/*.cc; do
    [[ -f $f ]] && cat "$f"
  done >"$DATA"
  while [[ $(stat -c %s "$DATA") -lt 4000000 ]]; do cat "$DATA" "$DATA" >"$DATA.tmp" && mv "$DATA.tmp" "$DATA"; done
fi

# 1. Build for sm_90 and run the gpu tests.
run configure cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90
if [[ $RC -ne 0 ]]; then
  record configure failed "$SECS" "cmake failed; see the log"
  exit 1
fi
record configure ok "$SECS" "$(grep -m1 'cuda backend' "$LOG" || true)"
run build ninja -C "$BUILD" -j "$JOBS" test_cuda_host test_cuda_backend test_cuda_training meshtrain
record build "$([[ $RC -eq 0 ]] && echo ok || echo failed)" "$SECS" \
  "ninja test_cuda_host test_cuda_backend test_cuda_training meshtrain"
[[ $RC -ne 0 ]] && exit 1

run gpu-tests ctest --test-dir "$BUILD" -L gpu --output-on-failure --output-junit "$OUT/gpu-tests.xml"
tests_rc=$RC
summary=$(grep -E 'tests passed|tests failed' "$LOG" | tail -1)
skipped=$(grep -c 'SKIPPED: no CUDA device' "$LOG" || true)
status=ok
[[ $tests_rc -ne 0 ]] && status=failed
[[ $skipped -gt 0 ]] && status=failed && summary="$summary; $skipped tests saw no CUDA device"
record gpu-tests "$status" "$SECS" "$summary"
run host-tests ctest --test-dir "$BUILD" -R '^test_cuda_host' --output-on-failure
record host-tests "$([[ $RC -eq 0 ]] && echo ok || echo failed)" "$SECS" "$(grep -E 'tests passed|tests failed' "$LOG" | tail -1)"

# Reads a metrics file (one JSON object per step): "<last loss> <mean tokens/s over steps > 5>".
metrics_summary() {
  python3 - "$1" <<'PY' 2>/dev/null || echo "unparsed"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
late = [r["tokens_per_s"] for r in rows if r.get("step", 0) > 5] or [r["tokens_per_s"] for r in rows]
print(rows[-1]["loss"], sum(late) / len(late))
PY
}

# 1b. The tiny model's first 20 steps, cuda against the cpu backend. The cpu
# backend is the fp32 reference and refuses 16-bit compute, so both cuda runs
# compare with its fp32 losses: cuda fp32 within 1e-4, cuda bf16 within 2%.
rm -f "$OUT/tiny-cpu-fp32.jsonl"
run tiny-cpu-fp32 "$MT" train --backend cpu --model tiny --precision fp32 \
  --steps 20 --seed 1 --dropout 0 --data "$DATA" --metrics "$OUT/tiny-cpu-fp32.jsonl"
rc_cpu=$RC
for precision in fp32 bf16; do
  rm -f "$OUT/tiny-cuda-$precision.jsonl"
  run "tiny-cuda-$precision" "$MT" train --backend cuda --model tiny --precision "$precision" \
    --steps 20 --seed 1 --dropout 0 --data "$DATA" --metrics "$OUT/tiny-cuda-$precision.jsonl"
  if [[ $rc_cpu -ne 0 || $RC -ne 0 ]]; then
    record "tiny-20-steps-$precision" "not available" "$SECS" \
      "meshtrain train --model tiny: cpu fp32 exit $rc_cpu, cuda $precision exit $RC (see the log)"
    continue
  fi
  tol=$([[ $precision == fp32 ]] && echo 1e-4 || echo 0.02)
  verdict=$(python3 - "$OUT/tiny-cpu-fp32.jsonl" "$OUT/tiny-cuda-$precision.jsonl" "$precision" "$tol" <<'PY'
import json, sys
a = [json.loads(l)["loss"] for l in open(sys.argv[1]) if l.strip()]
b = [json.loads(l)["loss"] for l in open(sys.argv[2]) if l.strip()]
tol = float(sys.argv[4])
if sys.argv[3] == "fp32":
    worst = max(abs(x - y) for x, y in zip(a, b))
else:
    worst = max(abs(x - y) / abs(x) for x, y in zip(a, b))
print(("ok" if len(a) == len(b) == 20 and worst <= tol else "failed"), worst)
PY
)
  record "tiny-20-steps-$precision" "${verdict%% *}" "$SECS" \
    "worst loss difference against cpu fp32 ${verdict#* } (tolerance $tol)"
done

# 2. gpt2-124m throughput, B=16 T=1024 bf16, meshtrain and PyTorch.
rm -f "$OUT/gpt2-cuda.jsonl"
run train-gpt2 "$MT" train --backend cuda --model gpt2-124m --micro-batch 16 --seq-len 1024 \
  --precision bf16 --steps 30 --data "$DATA" --metrics "$OUT/gpt2-cuda.jsonl"
if [[ $RC -eq 0 && -s "$OUT/gpt2-cuda.jsonl" ]]; then
  read -r loss mt_tps < <(metrics_summary "$OUT/gpt2-cuda.jsonl")
  # MFU against the H200's dense bf16 peak (989 TFLOP/s), with meshtrain's own
  # model FLOPs per token (models/flops.cc, the count the simulator uses).
  fpt=$("$MT" info --model gpt2-124m --seq-len 1024 --micro-batch 16 --json |
        python3 -c "import json, sys; print(json.load(sys.stdin)['flops_per_token'])" 2>/dev/null)
  mfu=$(python3 -c "print(round($mt_tps * ${fpt:-0} / 989e12, 4))" 2>/dev/null || echo null)
  [[ -z "$fpt" ]] && mfu=null
  record train-gpt2 ok "$SECS" "last loss $loss" "\"tokens_per_s\": ${mt_tps:-null}, \"mfu\": ${mfu:-null}"
else
  mt_tps=""
  record train-gpt2 "not available" "$SECS" "meshtrain train --backend cuda --model gpt2-124m failed (see the log)"
fi
for mode in eager compile; do
  run "torch-$mode" python3 experiments/gpu/torch_gpt2.py --mode "$mode" --out "$OUT/torch-$mode.json"
  if [[ $RC -eq 0 && -s "$OUT/torch-$mode.json" ]]; then
    tps=$(python3 -c "import json; print(json.load(open('$OUT/torch-$mode.json'))['tokens_per_s'])")
    ratio=null
    [[ -n "$mt_tps" ]] && ratio=$(python3 -c "print(round($mt_tps / $tps, 3))")
    record "torch-$mode" ok "$SECS" "PyTorch $mode gpt2-124m" "\"tokens_per_s\": $tps, \"meshtrain_ratio\": $ratio"
  else
    record "torch-$mode" "not available" "$SECS" "PyTorch (or torch.compile) not usable here (see the log)"
  fi
done

# 3. Calibration in the simulator's format.
CAL="$OUT/calibration-h200.json"
# The gpt2-124m step's own shapes join the grid, so step 4 predicts from
# measured shapes rather than interpolated ones.
run calibrate "$MT" calibrate --backend cuda --out "$CAL" --workload gpt2-124m:16:1024
if [[ $RC -eq 0 && -s "$CAL" ]]; then
  record calibrate ok "$SECS" "$CAL"
else
  record calibrate "not available" "$SECS" "meshtrain calibrate --backend cuda failed (see the log)"
fi

# 4. The simulator's prediction of the same step with that calibration.
sim_args=(simulate --model gpt2-124m --cluster h200 --gpus 1 --micro-batch 16 --seq-len 1024 --precision bf16)
[[ -s "$CAL" ]] && sim_args+=(--calibration "$CAL")
to_file() {  # to_file FILE CMD...: CMD's stdout into FILE
  local file=$1
  shift
  "$@" >"$file"
}
SIM_JSON="$OUT/gpt2-simulate.json"
run simulate to_file "$SIM_JSON" "$MT" "${sim_args[@]}" --json
# The measured step is the median step_time_s of the steps after 5 of step 2's
# run. Target: within 10%.
if [[ $RC -eq 0 && -s "$OUT/gpt2-cuda.jsonl" ]]; then
  verdict=$(python3 - "$SIM_JSON" "$OUT/gpt2-cuda.jsonl" <<'PY' 2>/dev/null
import json, statistics, sys
sim = json.load(open(sys.argv[1]))
rows = [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
measured = statistics.median(r["step_time_s"] for r in rows if r["step"] > 5)
predicted = sim["iteration_time_s"]
error = (predicted - measured) / measured
print("ok" if abs(error) <= 0.10 else "failed",
      f'"predicted_s": {predicted}, "measured_s": {measured}, "error": {round(error, 4)}')
PY
)
  if [[ -n "$verdict" ]]; then
    record simulate "${verdict%% *}" "$SECS" "predicted vs measured gpt2-124m step (target within 10%)" \
      "${verdict#* }"
  else
    record simulate failed "$SECS" "could not read the simulate JSON or the step times (see the log)"
  fi
elif [[ $RC -eq 0 ]]; then
  record simulate "not available" "$SECS" "simulated, but no measured gpt2-124m step to compare with"
else
  record simulate "not available" "$SECS" "meshtrain ${sim_args[*]} failed (see the log)"
fi
