#!/usr/bin/env bash
# The GPU check, for a bare machine with one GPU (an H200 in mind): run from
# the tarball that experiments/gpu/pack.sh makes, with nothing of ours
# installed there (only the NVIDIA driver, CUDA's runtime libraries and
# Python with PyTorch):
#
#   tar xzf meshtrain-gpu.tar.gz -C /tmp && OUT=/some/dir /tmp/meshtrain-gpu/experiments/gpu/check.sh
#
# Steps, in order of what matters most if the time runs out (each under its
# own time limit; DEADLINE seconds in all, default 480, after which the
# remaining steps are recorded as skipped):
#   1. the gpu tests (the test binaries themselves; no CMake there);
#   2. the tiny model's first 20 steps, cuda fp32 and bf16 against the cpu backend;
#   3. training throughput, bf16, T 1024: gpt2-124m-v256 (B16) and gpt3-xl-v256
#      (1.21B, B8), meshtrain (and again with MESHTRAIN_CUDA_ATTENTION=tuned),
#      then PyTorch eager and torch.compile on the
#      same model file and batch (experiments/gpu/torch_gpt.py); MFU from
#      meshtrain's own FLOPs per token (`meshtrain info`) against 989 TFLOP/s;
#   4. a device-time trace of gpt2-124m-v256: where a step's device time goes, by op;
#   5. `calibrate --backend cuda` at bf16 on both models' shapes, and the
#      simulator's prediction of each measured step with it (target: within 10%);
#   6. gpt2-124m with its real vocabulary on a token file (make_tokens.py), and
#      fp32 throughput against PyTorch fp32.
# Writes at most 8 files under $OUT (what a lent machine returns): gpu-check.log
# (every command and its output), gpu-results.json (one entry per step:
# status ok / failed / skipped / not available), gpu-summary.md (the tables),
# and artifacts.tar.gz (metrics, traces, calibration, simulations, torch rows).
set -uo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
OUT="${OUT:-$PWD/gpu-out}"
DEADLINE="${DEADLINE:-480}"
mkdir -p "$OUT"
WORK="$(mktemp -d)"
LOG="$OUT/gpu-check.log"
RESULTS="$OUT/gpu-results.json"
SUMMARY="$OUT/gpu-summary.md"
: >"$LOG"
: >"$SUMMARY"
ENTRIES=()
START=$SECONDS
PEAK_TFLOPS=989

# ---- the packed binaries, or a build tree's --------------------------------------------------
if [[ -x "$ROOT/bin/meshtrain" ]]; then
  BIN="$ROOT/bin"
  export LD_LIBRARY_PATH="$ROOT/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
else
  BIN="$ROOT/${BUILD:-build-gpu}/bin-flat"
  mkdir -p "$BIN"
  for b in engine/meshtrain tests/cuda/test_cuda_host tests/cuda/test_cuda_backend tests/cuda/test_cuda_training; do
    ln -sf "$ROOT/${BUILD:-build-gpu}/$b" "$BIN/"
  done
fi
MT="$BIN/meshtrain"
MODELS="$HERE/models"

json_str() {  # a JSON string literal of $1
  local s=${1//\\/\\\\}
  s=${s//\"/\\\"}
  s=${s//$'\n'/\\n}
  s=${s//$'\t'/ }
  printf '"%s"' "$s"
}
# record NAME STATUS SECONDS DETAIL [EXTRA_JSON_FIELDS]
record() {
  local extra=${5:+, $5} shown=""
  [[ -n ${5:-} ]] && shown=" {$5}"
  ENTRIES+=("{\"step\": $(json_str "$1"), \"status\": $(json_str "$2"), \"seconds\": $3, \"detail\": $(json_str "$4")$extra}")
  echo "== $1: $2 ($3 s) $4$shown" | tee -a "$LOG"
}
# run NAME LIMIT CMD...: the command under a time limit, output to the log; sets RC and SECS.
run() {
  local name=$1 limit=$2
  shift 2
  echo "== $name (limit ${limit}s): $*" >>"$LOG"
  local t0=$SECONDS
  timeout --kill-after=5 "$limit" "$@" >>"$LOG" 2>&1
  RC=$?
  SECS=$((SECONDS - t0))
  [[ $RC -eq 124 || $RC -eq 137 ]] && echo "== $name: timed out after ${limit}s" >>"$LOG"
}
# left: seconds before the deadline.
left() { echo $((DEADLINE - (SECONDS - START))); }
table() {  # a section of the summary: heading $1, then a Markdown table's header of the columns $2...
  local title=$1 header="|" rule="|" col
  shift
  for col in "$@"; do header+=" $col |" rule+="---|"; done
  { echo "## $title"; echo; echo "$header"; echo "$rule"; } >>"$SUMMARY"
}
# budget NAME NEEDED: false (and the step recorded skipped) when less than NEEDED seconds are left.
budget() {
  if (($(left) < $2)); then
    record "$1" skipped 0 "$(left) s left of the ${DEADLINE} s deadline, $2 s needed"
    return 1
  fi
}
write_results() {
  {
    echo "{"
    echo "  \"gpu\": $(json_str "$(nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader 2>/dev/null || echo unknown)"),"
    echo "  \"commit\": $(json_str "$(tr '\n' ' ' <"$ROOT/COMMIT" 2>/dev/null || git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)"),"
    echo "  \"seconds\": $((SECONDS - START)),"
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
  tar -C "$WORK" --exclude=train.txt --exclude='tokens-*.bin' -czf "$OUT/artifacts.tar.gz" . 2>/dev/null
}
trap write_results EXIT

# ---- 0. the machine and the libraries the binaries need ------------------------------------------
{
  echo "# GPU check: $(tr '\n' ' ' <"$ROOT/COMMIT" 2>/dev/null || echo unknown)"
  echo
  echo "GPU: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo none)"
  echo
} >>"$SUMMARY"
nvidia-smi >>"$LOG" 2>&1
# CUDA's libraries are not packed: find the machine's (the toolkit's lib64,
# or the pip wheels PyTorch brought) for each library ldd cannot resolve.
for lib in $(ldd "$MT" "$BIN"/test_cuda_* 2>/dev/null | awk '/not found/{print $1}' | sort -u); do
  found=$(find /usr/local /usr/lib /opt /usr/local/lib/python3* /usr/lib/python3 -name "$lib" 2>/dev/null | head -1)
  if [[ -z $found ]]; then
    found=$(python3 -c "import nvidia, os, sys; [print(os.path.join(r, sys.argv[1])) for p in nvidia.__path__ for r, _, fs in os.walk(p) if sys.argv[1] in fs]" "$lib" 2>/dev/null | head -1)
  fi
  [[ -n $found ]] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$(dirname "$found")"
  echo "library $lib: ${found:-NOT FOUND}" >>"$LOG"
done
missing=$(ldd "$MT" | grep 'not found' | tr -s ' \t' ' ')
if [[ -n $missing ]]; then
  record libraries failed 0 "unresolved: $missing"
  exit 1
fi
record libraries ok 0 "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"

# A text corpus (any bytes are tokens for the vocab-256 models).
DATA="$WORK/train.txt"
for f in "$ROOT"/README.md "$HERE"/*.sh "$HERE"/*.py; do cat "$f"; done >"$DATA"
while [[ $(stat -c %s "$DATA") -lt 8000000 ]]; do cat "$DATA" "$DATA" >"$DATA.tmp" && mv "$DATA.tmp" "$DATA"; done

# ---- 1. gpu tests ----------------------------------------------------------------------------------
for t in test_cuda_host test_cuda_backend test_cuda_training; do
  budget "$t" 30 || continue
  before=$(grep -c 'SKIPPED: no CUDA device' "$LOG")
  run "$t" 150 "$BIN/$t"
  line=$(grep -E 'All tests passed|test cases:' "$LOG" | tail -1)
  # A test that saw no device checked nothing: on a GPU machine that is a failure.
  skipped=$(($(grep -c 'SKIPPED: no CUDA device' "$LOG") - before))
  status=$([[ $RC -eq 0 ]] && echo ok || echo failed)
  [[ $skipped -gt 0 ]] && status=failed && line="$line; $skipped checks saw no CUDA device"
  record "$t" "$status" "$SECS" "$line"
done
# The names of failing test cases, for the summary.
grep -B1 -A0 'FAILED:' "$LOG" | head -40 >"$WORK/failed-tests.txt"

# ---- 2. tiny, cuda against cpu ---------------------------------------------------------------------
if budget tiny-20-steps 40; then
  run tiny-cpu-fp32 60 "$MT" train --backend cpu --model tiny --precision fp32 --steps 20 --seed 1 --dropout 0 \
    --data "$DATA" --metrics "$WORK/tiny-cpu-fp32.jsonl" --quiet
  rc_cpu=$RC
  for precision in fp32 bf16; do
    run "tiny-cuda-$precision" 60 "$MT" train --backend cuda --model tiny --precision "$precision" --steps 20 \
      --seed 1 --dropout 0 --data "$DATA" --metrics "$WORK/tiny-cuda-$precision.jsonl" --quiet
    if [[ $rc_cpu -ne 0 || $RC -ne 0 ]]; then
      record "tiny-20-steps-$precision" failed "$SECS" "cpu exit $rc_cpu, cuda $precision exit $RC (see the log)"
      continue
    fi
    # cuda fp32 within 1e-4 of cpu fp32 (absolute, per step); bf16 within 2% (relative).
    tol=$([[ $precision == fp32 ]] && echo 1e-4 || echo 0.02)
    verdict=$(python3 - "$WORK/tiny-cpu-fp32.jsonl" "$WORK/tiny-cuda-$precision.jsonl" "$precision" "$tol" <<'PY'
import json, sys
a = [json.loads(l)["loss"] for l in open(sys.argv[1]) if l.strip()]
b = [json.loads(l)["loss"] for l in open(sys.argv[2]) if l.strip()]
tol = float(sys.argv[4])
d = [abs(x - y) if sys.argv[3] == "fp32" else abs(x - y) / abs(x) for x, y in zip(a, b)]
print("ok" if len(a) == len(b) == 20 and max(d) <= tol else "failed", max(d))
PY
)
    record "tiny-20-steps-$precision" "${verdict%% *}" "$SECS" "worst loss difference against cpu fp32 ${verdict#* } (tolerance $tol)"
  done
fi

# ---- 3. throughput against PyTorch ---------------------------------------------------------------------
# name:model-file:batch
CONFIGS=("gpt2-124m-v256:$MODELS/gpt2-124m-v256.json:16" "gpt3-xl-v256:$MODELS/gpt3-xl-v256.json:8")
declare -A MT_TPS MT_STEP FPT
# metrics_summary FILE: "<last loss> <median tokens/s after step 5> <median step_time_s after step 5> <first step s>"
metrics_summary() {
  python3 - "$1" <<'PY' 2>/dev/null || echo "unparsed"
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
late = [r for r in rows if r.get("step", 0) > 5] or rows
print(rows[-1]["loss"], statistics.median(r["tokens_per_s"] for r in late),
      statistics.median(r["step_time_s"] for r in late), rows[0]["step_time_s"])
PY
}
for cfg in "${CONFIGS[@]}"; do
  IFS=: read -r name model batch <<<"$cfg"
  budget "train-$name" 60 || continue
  fpt=$("$MT" info --model "$model" --seq-len 1024 --micro-batch "$batch" --json 2>>"$LOG" |
        python3 -c "import json, sys; print(json.load(sys.stdin)['flops_per_token'])" 2>>"$LOG")
  FPT[$name]=${fpt:-0}
  t0=$SECONDS
  run "train-$name" 150 "$MT" train --backend cuda --model "$model" --micro-batch "$batch" --seq-len 1024 \
    --precision bf16 --steps 30 --data "$DATA" --metrics "$WORK/$name-cuda.jsonl" --quiet
  if [[ $RC -eq 0 && -s "$WORK/$name-cuda.jsonl" ]]; then
    read -r loss tps step first < <(metrics_summary "$WORK/$name-cuda.jsonl")
    MT_TPS[$name]=$tps
    MT_STEP[$name]=$step
    mfu=$(python3 -c "print(round($tps * ${fpt:-0} / ($PEAK_TFLOPS * 1e12), 4))")
    record "train-$name" ok "$SECS" "B$batch T1024 bf16, last loss $loss; process wall $SECS s, first step ${first}s" \
      "\"tokens_per_s\": $tps, \"step_s\": $step, \"mfu\": $mfu, \"flops_per_token\": ${fpt:-null}"
  else
    record "train-$name" failed "$SECS" "meshtrain train --backend cuda --model $model failed (exit $RC; see the log)"
  fi
done
# The tuned attention kernels (opt-in until the gpu test
# test_cuda_attention_tuned has shown their bits equal the reference's): the
# same runs with MESHTRAIN_CUDA_ATTENTION=tuned.
for cfg in "${CONFIGS[@]}"; do
  IFS=: read -r name model batch <<<"$cfg"
  budget "train-$name-tuned-attention" 60 || continue
  run "train-$name-tuned-attention" 150 env MESHTRAIN_CUDA_ATTENTION=tuned "$MT" train --backend cuda \
    --model "$model" --micro-batch "$batch" --seq-len 1024 --precision bf16 --steps 30 --data "$DATA" \
    --metrics "$WORK/$name-cuda-tuned.jsonl" --quiet
  if [[ $RC -eq 0 && -s "$WORK/$name-cuda-tuned.jsonl" ]]; then
    read -r loss tps step first < <(metrics_summary "$WORK/$name-cuda-tuned.jsonl")
    ratio=$(python3 -c "print(round($tps / ${MT_TPS[$name]:-0}, 3))" 2>/dev/null || echo null)
    record "train-$name-tuned-attention" ok "$SECS" "last loss $loss" \
      "\"tokens_per_s\": $tps, \"step_s\": $step, \"over_reference\": $ratio"
  else
    record "train-$name-tuned-attention" failed "$SECS" "exit $RC (see the log)"
  fi
done
# PyTorch in one process (imported once): compile first, it is the target.
torch_args=()
for cfg in "${CONFIGS[@]}"; do
  IFS=: read -r name model batch <<<"$cfg"
  torch_args+=(--config "$name:$model:$batch:1024:bf16")
done
if budget torch-bf16 120; then
  run torch-bf16 $(($(left) > 260 ? 260 : $(left))) python3 "$HERE/torch_gpt.py" "${torch_args[@]}" \
    --modes compile eager --out "$WORK/torch.jsonl"
  record torch-bf16 "$([[ -s $WORK/torch.jsonl ]] && echo ok || echo failed)" "$SECS" "torch_gpt.py, exit $RC"
fi
table "Throughput, bf16, T 1024, one GPU (median step after 5 of 30; PyTorch: 15 steps, 5 warm-up)" \
  model batch "meshtrain tok/s" MFU "PyTorch mode" "PyTorch tok/s" "meshtrain / PyTorch"
for cfg in "${CONFIGS[@]}"; do
  IFS=: read -r name model batch <<<"$cfg"
  python3 - "$WORK/torch.jsonl" "$name" "$batch" "${MT_TPS[$name]:-0}" "${FPT[$name]:-0}" "$PEAK_TFLOPS" <<'PY' >>"$SUMMARY" 2>>"$LOG"
import json, sys
path, name, batch, tps, fpt, peak = sys.argv[1:7]
tps, fpt = float(tps), float(fpt)
rows = [json.loads(l) for l in open(path) if l.strip()] if __import__("os").path.exists(path) else []
mfu = f"{tps * fpt / (float(peak) * 1e12):.1%}" if tps else "-"
mine = [r for r in rows if r["name"] == name] or [{"mode": "-", "error": "not run"}]
for r in mine:
    if "tokens_per_s" in r:
        print(f"| {name} | {batch} | {tps:,.0f} | {mfu} | {r['mode']} | {r['tokens_per_s']:,.0f} "
              f"(MFU {r['tokens_per_s'] * fpt / (float(peak) * 1e12):.1%}) | {tps / r['tokens_per_s']:.2f}x |")
    else:
        print(f"| {name} | {batch} | {tps:,.0f} | {mfu} | {r['mode']} | {r.get('error', '')[:80]} | - |")
PY
done
echo >>"$SUMMARY"

# ---- 4. a trace with device times ----------------------------------------------------------------------
if budget trace 30; then
  name=gpt2-124m-v256
  run "trace-$name" 90 "$MT" train --backend cuda --model "$MODELS/$name.json" --micro-batch 16 --seq-len 1024 \
    --precision bf16 --steps 4 --data "$DATA" --trace "$WORK/$name-trace.json" --quiet
  if [[ $RC -eq 0 && -s "$WORK/$name-trace.json" ]]; then
    python3 - "$WORK/$name-trace.json" <<'PY' >"$WORK/trace-summary.md" 2>>"$LOG"
import collections, json, sys
doc = json.load(open(sys.argv[1]))
events = doc["traceEvents"] if isinstance(doc, dict) else doc
xs = [e for e in events if e.get("ph") == "X"]
dev = [e for e in xs if (e.get("args") or {}).get("clock") == "device"]
# Each step ends in one read (loss and gradient norm together): the steps
# between the first and the last read are whole (update of the step before,
# forward and backward), and step 1 (cuBLAS's first plans) is left out.
reads = sorted(e["ts"] + e.get("dur", 0) for e in xs if e["name"] == "read")
lo, hi = (reads[0], reads[-1]) if len(reads) >= 2 else (float("-inf"), float("inf"))
steps = max(len(reads) - 1, 1)
use = [e for e in (dev or xs) if lo <= e["ts"] < hi]
by = collections.defaultdict(lambda: [0.0, 0])
for e in use:
    by[e["name"]][0] += e.get("dur", 0)
    by[e["name"]][1] += 1
total = sum(v[0] for v in by.values()) or 1
span = (hi - lo) / steps if len(reads) >= 2 else 0
print(f"{len(xs)} events, {len(dev)} with device times ({'device' if dev else 'HOST ENQUEUE'} clock below); "
      f"{steps} whole steps: {total / steps / 1e3:.1f} ms of op time per step in a step of {span / 1e3:.1f} ms "
      f"(read to read), {len(use) // steps} ops per step.\n")
print("| op | calls per step | ms per step | share of op time |")
print("|---|---|---|---|")
for name, (t, n) in sorted(by.items(), key=lambda kv: -kv[1][0])[:25]:
    print(f"| {name} | {n / steps:g} | {t / steps / 1e3:.2f} | {t / total:.1%} |")
PY
    record "trace-$name" "$(grep -q 'device clock below' "$WORK/trace-summary.md" && echo ok || echo failed)" \
      "$SECS" "$(head -1 "$WORK/trace-summary.md")"
    { echo "## Where the device time goes (gpt2-124m-v256, B16, bf16)"; echo; cat "$WORK/trace-summary.md"; echo; } >>"$SUMMARY"
    gzip -f "$WORK/$name-trace.json"
  else
    record "trace-$name" failed "$SECS" "train --trace failed (exit $RC)"
  fi
fi

# ---- 5. calibration at bf16 and the simulator's prediction ----------------------------------------------
table "Simulated against measured step (calibrate --backend cuda --precision bf16)" \
  model "measured s" "simulated s" error
for cfg in "${CONFIGS[@]}"; do
  IFS=: read -r name model batch <<<"$cfg"
  budget "calibrate-$name" 45 || continue
  CAL="$WORK/calibration-$name.json"
  # A bf16 calibration also times each GEMM shape in FP8, fast and split accumulator (issue 28), hence 120 s.
  run "calibrate-$name" 120 "$MT" calibrate --backend cuda --precision bf16 --out "$CAL" --workload "$model:$batch:1024"
  if [[ $RC -ne 0 || ! -s "$CAL" ]]; then
    record "calibrate-$name" failed "$SECS" "meshtrain calibrate --backend cuda --precision bf16 failed (exit $RC)"
    continue
  fi
  # The FP8 GEMMs against bf16 and the split accumulator against the fast one, median over shapes.
  fp8=$(python3 - "$CAL" <<'PY' 2>>"$LOG"
import json, statistics, sys
g = json.load(open(sys.argv[1])).get("gemm", [])
t = {(e["m"], e["n"], e["k"], e.get("dtype", "bf16")): e["time_us"] for e in g}
def ratio(num, den):
    r = [t[s[:3] + (num,)] / t[s] for s in t if s[3] == den and s[:3] + (num,) in t]
    return f"{statistics.median(r):.3f} over {len(r)} shapes" if r else "none"
print(f"fp8/bf16 time {ratio('fp8', 'bf16')}; fp8_split/fp8 time {ratio('fp8_split', 'fp8')}")
PY
)
  record "calibrate-$name" ok "$SECS" "$CAL; ${fp8:-fp8 GEMMs not read}"
  sim="$WORK/simulate-$name.json"
  run "simulate-$name" 60 sh -c "\"$MT\" simulate --model \"$model\" --cluster h200 --gpus 1 --micro-batch $batch \
    --seq-len 1024 --precision bf16 --calibration \"$CAL\" --json >\"$sim\""
  if [[ $RC -eq 0 && -n "${MT_STEP[$name]:-}" ]]; then
    verdict=$(python3 - "$sim" "${MT_STEP[$name]}" <<'PY' 2>>"$LOG"
import json, sys
predicted = json.load(open(sys.argv[1]))["iteration_time_s"]
measured = float(sys.argv[2])
e = (predicted - measured) / measured
print("ok" if abs(e) <= 0.10 else "failed", predicted, measured, round(e, 4))
PY
)
    read -r st pred meas err <<<"$verdict"
    record "simulate-$name" "${st:-failed}" "$SECS" "predicted vs measured step (target within 10%)" \
      "\"predicted_s\": ${pred:-null}, \"measured_s\": ${meas:-null}, \"error\": ${err:-null}"
    echo "| $name | $meas | $pred | $(python3 -c "print(f'{$err:+.1%}')" 2>/dev/null) |" >>"$SUMMARY"
  else
    record "simulate-$name" failed "$SECS" "simulate exit $RC, or no measured step to compare"
  fi
done
echo >>"$SUMMARY"

# ---- 6. real vocabulary on a token file; fp32 -------------------------------------------------------------
if budget train-gpt2-124m-tokens 40 && [[ -f "$HERE/make_tokens.py" ]]; then
  TOK="$WORK/tokens-50257.bin"
  python3 "$HERE/make_tokens.py" "$DATA" "$TOK" --vocab 50257 --tokens 4000000 >>"$LOG" 2>&1
  run train-gpt2-124m-tokens 90 "$MT" train --backend cuda --model gpt2-124m --micro-batch 16 --seq-len 1024 \
    --precision bf16 --steps 20 --data "$TOK" --metrics "$WORK/gpt2-124m-tokens.jsonl" --quiet
  if [[ $RC -eq 0 && -s "$WORK/gpt2-124m-tokens.jsonl" ]]; then
    read -r loss tps step first < <(metrics_summary "$WORK/gpt2-124m-tokens.jsonl")
    record train-gpt2-124m-tokens ok "$SECS" "vocab 50257 from an llm.c token file, last loss $loss" "\"tokens_per_s\": $tps"
  else
    record train-gpt2-124m-tokens failed "$SECS" "exit $RC (see the log)"
  fi
fi
if budget fp32 60; then
  name=gpt2-124m-v256
  run "train-$name-fp32" 90 "$MT" train --backend cuda --model "$MODELS/$name.json" --micro-batch 8 --seq-len 1024 \
    --precision fp32 --steps 12 --data "$DATA" --metrics "$WORK/$name-fp32.jsonl" --quiet
  [[ $RC -eq 0 ]] && read -r loss tps step first < <(metrics_summary "$WORK/$name-fp32.jsonl")
  run torch-fp32 $(($(left) > 120 ? 120 : $(left))) python3 "$HERE/torch_gpt.py" \
    --config "$name:$MODELS/$name.json:8:1024:fp32" --modes eager --steps 10 --warmup 4 --out "$WORK/torch-fp32.jsonl"
  ttps=$(python3 -c "import json; print(json.loads(open('$WORK/torch-fp32.jsonl').readline())['tokens_per_s'])" 2>/dev/null)
  record "fp32-$name" "$([[ -n ${tps:-} && -n $ttps ]] && echo ok || echo failed)" "$SECS" \
    "B8 fp32 (no TF32 on either side)" "\"tokens_per_s\": ${tps:-null}, \"torch_eager_tokens_per_s\": ${ttps:-null}"
fi
echo "Total: $((SECONDS - START)) s" >>"$SUMMARY"
cat "$SUMMARY"
