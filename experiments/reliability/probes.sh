#!/usr/bin/env bash
# Issue 18's probes: every command with bad flags, malformed, extreme and
# special files, corrupt and contested checkpoints, signals, and sizes beyond
# the machine, each run under a time limit (PT, default 60 s) and a 6 GB
# address-space cap. One line per probe:
#   ok   refused with an error (exit 1..123, message shown)
#   ran  exit 0 (check the line: was it meant to run?)
#   BAD  killed by a signal, by the limit (a hang or a runaway), or crashed
#
#   experiments/reliability/probes.sh [build-dev/engine/meshtrain] > probes.log
#   ONLY=29 experiments/reliability/probes.sh ...   only the probes whose names start with 29
# Results: experiments/RESULTS.md, "Reliability probes and sanitizers".
# Timings under a loaded machine can exceed PT for work that is merely slow:
# rerun a BAD line alone before calling it a hang.
set -u
M=$(realpath "${1:-build-dev/engine/meshtrain}")
R=$(realpath "$(dirname "$0")/../..")
V=$(dirname "$M")/../experiments/validate_sim  # the validation tool of the same build
W=$(mktemp -d /tmp/meshtrain-probes.XXXXXX)
F=$W/f
PT=${PT:-60}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Runs "$@" under the limits: sets OUT, RC and DT (seconds).
limited() {
  local t0; t0=$(date +%s.%N)
  OUT=$( (ulimit -v 6000000; timeout -s KILL "$PT" "$@") 2>&1 ); RC=$?
  DT=$(echo "$(date +%s.%N) - $t0" | bc)
}
probe() {
  local name=$1; shift; [ "$1" = "--" ] && shift
  local verdict msg
  [[ "$name" == "${ONLY:-}"* ]] || return 0
  limited "$@"
  verdict=ok; [ $RC -ge 124 ] && verdict=BAD; [ $RC -eq 0 ] && verdict=ran
  msg=$(echo "$OUT" | grep -iE "error|refus|must|warn|cannot|not |is a" | head -2 | tr '\n' ' ' | cut -c1-300)
  [ -z "$msg" ] && msg=$(echo "$OUT" | tail -2 | tr '\n' ' ' | cut -c1-300)
  printf '%-5s rc=%-3s %5.1fs %-42s | %s\n' "$verdict" "$RC" "$DT" "$name" "$msg"
}
mkdir -p $F; cd $F
deep() { python3 - "$@" <<'PY'
import sys
pre, n, post = sys.argv[1], int(sys.argv[2]), sys.argv[3]
open(sys.argv[4],'w').write(pre + '['*n + ']'*n + post)
PY
}
deep '{"layers":2,"hidden":64,"heads":4,"vocab":256,"seq_len":64,"name":' 100000 '}' deep-model.json
deep '{"tp":' 100000 '}' deep-plan.json
deep '{"base":"h200","device":' 100000 '}' deep-cluster.json
deep '{"version":' 100000 '}' deep-cal.json
deep '{"segments":[{"modules":' 100000 '}]}' deep-seg.json
echo '{"layers":2,"hidden":64,"heads":4,"vocab":256,"seq_len":1e400}' > big-model.json
echo '{"tp":1e400}' > big-plan.json
echo '{"tp":4294967297}' > wrap-plan.json
echo '{"layers":2147483648,"hidden":64,"heads":4,"vocab":256,"seq_len":64}' > layers-2g.json
echo '{"layers":1000000000,"hidden":64,"heads":4,"vocab":256,"seq_len":64}' > layers-1g.json
echo '{"layers":2,"hidden":1000000,"heads":4,"vocab":256,"seq_len":64}' > hidden-1m.json
echo '{"layers":2,"hidden":64,"heads":4,"vocab":256,"seq_len":64,"experts":8,"top_k":2}' > moe.json
echo '{"layers":2,"hidden":64,"heads":4,"vocab":256,"seq_len":64,"experts":8,"top_k":9}' > moe-topk.json
echo '{"layers":2,"hidden":64,"heads":4,"vocab":256,"seq_len":64,"experts":0,"top_k":2}' > moe-e0.json
echo '{"layers":2,"hidden":64,"heads":4,"vocab":256,"seq_len":64,"experts":8,"top_k":2,"capacity_factor":1e300}' > moe-cf.json
echo '{"layers":2,"hidden":64,"heads":4,"vocab":256,"seq_len":64,"experts":1048576,"top_k":2}' > moe-huge.json
echo '{"base":"h200","nvlink_GBps":1e-300,"device":{"memory_GiB":1e300}}' > tiny-cluster.json
echo '{"base":"h200","gpus_per_node":0}' > zero-cluster.json
echo '{"tp":0}' > zero-plan.json
echo '{"pp":0}' > zero-pp.json
echo '{"segments":[{"modules":["embed"],"tp":0}]}' > seg-zero.json
echo '{"segments":[{"blocks":[0,99999999999]}]}' > seg-blocks.json
echo '{"segments":[{"blocks":[5,2]}]}' > seg-rev.json
echo '{"segments":[{"modules":["nope"]}]}' > seg-mod.json
echo '{"segments":[]}' > seg-empty.json
echo '{"segments":{}}' > seg-obj.json
echo '{"segments":[{"modules":["vision","projector"],"tp":2,"ranks":[0,1]},{"modules":["language"],"pp":4,"ranks":[2,1048576]}]}' > seg-ranks.json
echo '{"segments":[{"modules":["vision","projector"],"ranks":[-1,0]},{"modules":["language"]}]}' > seg-neg.json
echo '{"segments":[{"modules":["vision","projector"],"microbatches":0},{"modules":["language"]}]}' > seg-mb0.json
echo '{"segments":[{"modules":["vision","projector"],"microbatches":1e9},{"modules":["language"]}]}' > seg-mb1e9.json
echo '{"segments":[{"modules":["vision","projector"],"tp":2},{"modules":["language"],"tp":2}], "tp":2}' > seg-ok.json
echo '{"segments":[{"modules":["vision"]},{"modules":["vision","projector","language"]}]}' > seg-overlap.json
echo '{"segments":[{"modules":["vision","projector"],"cp":2},{"modules":["language"]}]}' > seg-cp.json
mkfifo fifo
mkdir adir
echo '[0.5, 0.5]' > routing-short.json
echo '[NaN]' > routing-nan.json
echo '[-1,2,3,4,5,6,7,8]' > routing-neg.json
echo '[1e308,1e308,1e308,1e308,1e308,1e308,1e308,1e308]' > routing-huge.json
echo '[0,0,0,0,0,0,0,0]' > routing-zero.json
head -c 30000 /dev/urandom > data.bin
printf '%s\n' $(seq 1 3000) > data.txt
echo '{"layers":65536,"hidden":64,"heads":4,"vocab":256,"seq_len":64}' > layers-max.json
echo '{"segments":[{"blocks":[0,2]},{"blocks":[3,5]}]}' > seg-moe.json
echo '{"segments":[{"blocks":[0,14],"dp":1048576,"microbatches":4096}]}' > seg-fpe.json
echo '{"segments":[{"blocks":[0,14],"ranks":[0,4294967296]}]}' > seg-wrap.json
echo '{"segments":[{"blocks":[0,14],"microbatches":4294967297}]}' > seg-mbwrap.json
echo '{"segments":[{"blocks":[0,14],"ranks":[0,2147483647]}]}' > seg-ovf.json
cd "$W"
echo "## 7 MoE"
probe "7 train tiny-moe" -- $M train --model tiny-moe --data $F/data.txt --seq-len 16 --micro-batch 2 --steps 2 --quiet
probe "7 train moe.json" -- $M train --model $F/moe.json --data $F/data.txt --seq-len 16 --micro-batch 2 --steps 2 --quiet
probe "7 simulate mixtral" -- $M simulate --model mixtral-8x7b --cluster dgx-h100 --gpus 64 --tp 4 --pp 2 --ep 8
probe "7 moe top_k>experts" -- $M info --model $F/moe-topk.json
probe "7 moe experts 0 top_k 2" -- $M info --model $F/moe-e0.json
probe "7 moe cf 1e300" -- $M simulate --model $F/moe-cf.json --cluster h200 --gpus 8
probe "7 moe 2^20 experts sim" -- $M simulate --model $F/moe-huge.json --cluster h200 --gpus 8
probe "7 moe 2^20 experts train" -- $M train --model $F/moe-huge.json --data $F/data.txt --seq-len 16 --micro-batch 2 --steps 1 --quiet
probe "7 routing short" -- $M simulate --model tiny-moe --cluster h200 --gpus 8 --ep 8 --moe-routing file:$F/routing-short.json
probe "7 routing nan" -- $M simulate --model tiny-moe --cluster h200 --gpus 8 --ep 8 --moe-routing file:$F/routing-nan.json
probe "7 routing neg" -- $M simulate --model tiny-moe --cluster h200 --gpus 8 --ep 8 --moe-routing file:$F/routing-neg.json
probe "7 routing huge" -- $M simulate --model tiny-moe --cluster h200 --gpus 8 --ep 8 --moe-routing file:$F/routing-huge.json
probe "7 routing zero" -- $M simulate --model tiny-moe --cluster h200 --gpus 8 --ep 8 --moe-routing file:$F/routing-zero.json
probe "7 routing fifo" -- $M simulate --model tiny-moe --cluster h200 --gpus 8 --ep 8 --moe-routing file:$F/fifo
probe "7 routing zipf:nan" -- $M simulate --model tiny-moe --cluster h200 --gpus 8 --ep 8 --moe-routing zipf:nan
probe "7 routing zipf:1e308" -- $M simulate --model tiny-moe --cluster h200 --gpus 8 --ep 8 --moe-routing zipf:1e308
probe "7 routing zipf:-5" -- $M simulate --model tiny-moe --cluster h200 --gpus 8 --ep 8 --moe-routing zipf:-5
probe "7 routing bogus" -- $M simulate --model tiny-moe --cluster h200 --gpus 8 --ep 8 --moe-routing foo
probe "7 ep 0" -- $M simulate --model tiny-moe --cluster h200 --gpus 8 --ep 0
probe "7 ep 3" -- $M simulate --model tiny-moe --cluster h200 --gpus 8 --ep 3
probe "7 etp 0" -- $M simulate --model tiny-moe --cluster h200 --gpus 8 --etp 0
echo "## 8 zero degrees, 10 numbers in segments"
for x in fpe wrap mbwrap ovf; do probe "seg $x" -- $M simulate --model swin-fmnist --plan $F/seg-$x.json; done
probe "8 sim tp 0" -- $M simulate --tp 0
probe "8 sim pp 0" -- $M simulate --pp 0
probe "8 sim cp 0" -- $M simulate --cp 0
probe "8 sim vpp 0" -- $M simulate --vpp 0
probe "8 plan-file tp 0" -- $M simulate --plan $F/zero-plan.json
probe "8 plan-file pp 0" -- $M simulate --plan $F/zero-pp.json
probe "8 seg tp 0" -- $M simulate --model swin-fmnist --plan $F/seg-zero.json --cluster h200 --gpus 4
probe "8 plan-file tp 0" -- $M simulate --model tiny --plan $F/zero-plan.json
probe "8 plan-file pp 0" -- $M simulate --model tiny --plan $F/zero-pp.json
echo "## 9 deep"
probe "9 deep model" -- $M info --model $F/deep-model.json
probe "9 deep plan" -- $M simulate --model tiny --plan $F/deep-plan.json
probe "9 deep cluster" -- $M simulate --model tiny --cluster $F/deep-cluster.json
probe "9 deep calibration" -- $M simulate --model tiny --cluster local-cpu --calibration $F/deep-cal.json
probe "9 deep segments" -- $M simulate --model swin-fmnist --plan $F/deep-seg.json

probe "9 deep routing" -- $M simulate --model tiny-moe --cluster h200 --gpus 8 --moe-routing file:$F/deep-plan.json
probe "9 deep job" -- $M simulate --cluster h200 --job $F/deep-plan.json
echo "## 10 numbers"
probe "10 1e400 model" -- $M info --model $F/big-model.json
probe "10 1e400 plan" -- $M simulate --model tiny --plan $F/big-plan.json
probe "10 tp 2^32+1 plan" -- $M simulate --model tiny --plan $F/wrap-plan.json
probe "10 layers 2^31" -- $M info --model $F/layers-2g.json
probe "10 cluster 1e-300" -- $M simulate --model tiny --cluster $F/tiny-cluster.json --gpus 8
probe "10 comm-timeout nan" -- $M train --model tiny --data $F/data.txt --seq-len 16 --micro-batch 2 --steps 1 --comm-timeout nan
probe "10 comm-timeout -1" -- $M train --model tiny --data $F/data.txt --seq-len 16 --micro-batch 2 --steps 1 --comm-timeout -1
probe "10 --tp 4294967297" -- $M simulate --model tiny --tp 4294967297
probe "10 --steps 1e9" -- $M train --model tiny --data $F/data.txt --seq-len 16 --micro-batch 2 --steps 1e9
probe "10 --steps 99999999999999" -- $M train --model tiny --data $F/data.txt --seq-len 16 --micro-batch 2 --steps 99999999999999
probe "10 --seq-len 2^31" -- $M simulate --model tiny --seq-len 2147483648
probe "10 --global-batch huge" -- $M simulate --model tiny --global-batch 9223372036854775807
echo "## 11 sizes"
probe "11 --gpus 1e8" -- $M simulate --model tiny --gpus 100000000
probe "11 --gpus 1048576 tiny" -- $M simulate --model tiny --cluster h200 --gpus 1048576
probe "11 grad-bucket 1e-9" -- $M simulate --model gpt3-175b --cluster h200 --gpus 64 --tp 8 --pp 8 --grad-bucket-mb 1e-9
probe "11 micro-batch 1e8" -- $M simulate --model tiny --micro-batch 100000000
probe "11 micro-batches 1e8" -- $M simulate --model tiny --micro-batches 100000000
probe "11 layers 1e9 info" -- $M info --model $F/layers-1g.json
probe "11 calibrate tiny:1e8:64" -- $M calibrate --backend cpu --out $W/cal.json --workload tiny:100000000:64
probe "11 hidden 1e6 cpu" -- $M train --model $F/hidden-1m.json --data $F/data.txt --seq-len 16 --micro-batch 2 --steps 1
probe "11 train micro-batch 65536 seq 64" -- $M train --model tiny --data $F/data.bin --seq-len 64 --micro-batch 65536 --steps 1
probe "11 plan --gpus 1048576" -- $M plan --model gpt3-175b --gpus 1048576 --cluster h200
probe "11 plan 1e8" -- $M plan --model tiny --gpus 100000000
echo "## 12 special files"
for kind in fifo adir /dev/zero /dev/null; do f=$F/$kind; [ "${kind:0:1}" = / ] && f=$kind
probe "12 model $kind" -- $M info --model $f
probe "12 plan $kind" -- $M simulate --model tiny --plan $f
probe "12 cluster $kind" -- $M simulate --model tiny --cluster $f
probe "12 calibration $kind" -- $M simulate --model tiny --cluster local-cpu --calibration $f
probe "12 job $kind" -- $M simulate --cluster h200 --job $f
probe "12 routing $kind" -- $M simulate --model tiny-moe --cluster h200 --gpus 8 --moe-routing file:$f
probe "12 data $kind" -- $M train --model tiny --data $f --seq-len 16 --micro-batch 2 --steps 1
probe "12 plan-cmd model $kind" -- $M plan --model $f --gpus 8
probe "12 validate_sim $kind" -- $V $f
done
probe "12 metrics to fifo" -- $M train --model tiny --data $F/data.txt --seq-len 16 --micro-batch 2 --steps 1 --metrics $F/fifo
probe "12 trace to fifo" -- $M simulate --model tiny --trace $F/fifo
probe "12 plan --out fifo" -- $M plan --model tiny --gpus 2 --out $F/fifo
probe "12 calibrate --out fifo" -- $M calibrate --backend cpu --quick --out $F/fifo
probe "12 checkpoint is fifo" -- $M train --model tiny --data $F/data.txt --seq-len 16 --micro-batch 2 --steps 1 --checkpoint $F/fifo
probe "12 data fashion-mnist dir fifo" -- $M train --model vit-fmnist --data $F/adir --steps 1
echo "## 13 dropout"
for d in 1.5 -0.5 nan 1 0.999999; do
probe "13 train dropout $d" -- $M train --model tiny --data $F/data.txt --seq-len 16 --micro-batch 2 --steps 1 --dropout $d
done
probe "13 simulate dropout 1.5" -- $M simulate --model tiny --dropout 1.5
probe "13 plan dropout nan" -- $M plan --model tiny --gpus 2 --dropout nan
T="$M train --model tiny --data $F/data.txt --seq-len 16 --micro-batch 2 --quiet"
C=$W/ck; rm -rf $C $W/ck2 $W/foreign
echo "## 1 checkpoint overwrite"
probe "1 first run" -- $T --steps 3 --checkpoint $C
probe "1 rerun without --resume" -- $T --steps 3 --checkpoint $C
probe "1 --overwrite-checkpoint" -- $T --steps 3 --checkpoint $C --overwrite-checkpoint
mkdir -p $W/foreign; echo keep > $W/foreign/payload-0.bin; echo '{}' > $W/foreign/manifest.json; echo x > $W/foreign/notes.txt
probe "1 foreign dir" -- $T --steps 3 --checkpoint $W/foreign
probe "1 foreign dir --overwrite" -- $T --steps 3 --checkpoint $W/foreign --overwrite-checkpoint
probe "1 foreign dir --resume" -- $T --steps 3 --checkpoint $W/foreign --resume
echo "foreign after: $(cat $W/foreign/payload-0.bin) $(ls $W/foreign | tr '\n' ' ')"
echo "## 2 lr"
probe "2 --lr inf" -- $T --steps 3 --lr inf
probe "2 --lr 1e30" -- $T --steps 3 --lr 1e30
probe "2 --lr 10 ckpt every step" -- $T --steps 30 --lr 10 --checkpoint $W/ck2 --checkpoint-every 1
probe "2 --lr 10 resume" -- $T --steps 31 --lr 1e-3 --checkpoint $W/ck2 --resume
echo "## 5 stale tmp"
touch $C/payload-0.bin.tmp
probe "5 resume with stale tmp" -- $T --steps 4 --checkpoint $C --resume
echo "5 after resume: $(ls $C | tr '\n' ' ')"
echo "## 6 resume checks"
head -c 20000 /dev/urandom > $F/data2.bin
probe "6 resume other data" -- $M train --model tiny --data $F/data2.bin --seq-len 16 --micro-batch 2 --quiet --steps 5 --checkpoint $C --resume
probe "6 resume other lr" -- $T --steps 5 --checkpoint $C --resume --lr 1e-3
probe "6 resume steps below" -- $T --steps 2 --checkpoint $C --resume
cp -r $C $W/ck3; rm $W/ck3/manifest.json
probe "6 resume missing manifest" -- $T --steps 8 --checkpoint $W/ck3 --resume
probe "6 resume empty new dir" -- $T --steps 2 --checkpoint $W/ck-new --resume
echo "## 16 warmup"
probe "16 steps 3 default warmup" -- $T --steps 3
probe "16 steps 3 explicit warmup 10" -- $T --steps 3 --warmup 10
echo "## 15"
probe "15 --gpus 0 simulate" -- $M simulate --model tiny --gpus 0
probe "15 --seed -1" -- $T --steps 1 --seed -1
probe "15 --seed 1e23" -- $T --steps 1 --seed 1e23
probe "15 --seed 2^64" -- $T --steps 1 --seed 18446744073709551616
probe "15 --stop-at no ckpt" -- $T --steps 3 --stop-at 2
probe "15 --checkpoint-every no ckpt" -- $T --steps 3 --checkpoint-every 2
probe "15 --grad-clip nan" -- $T --steps 1 --grad-clip nan
probe "15 --grad-clip -1" -- $T --steps 1 --grad-clip -1
probe "15 --comm mpi no calibration" -- $M simulate --model tiny --cluster local-cpu --comm mpi
probe "15 --comm-timeout 0" -- $T --steps 1 --comm-timeout 0
probe "15 mpirun -np 3 --tp 2" -- mpirun -np 3 --oversubscribe $M train --model tiny --data $F/data.txt --seq-len 16 --micro-batch 2 --steps 1 --tp 2
probe "15 calibrate --out unwritable" -- $M calibrate --backend cpu --quick --out /proc/nope/cal.json
probe "15 plan --out unwritable" -- $M plan --model tiny --gpus 2 --out /proc/nope/p.json
probe "15 simulate --trace unwritable" -- $M simulate --model tiny --trace /proc/nope/t.json
probe "15 train --trace unwritable" -- $T --steps 1 --trace /proc/nope/t.json
probe "15 train --metrics unwritable" -- $T --steps 1 --metrics /proc/nope/m.json
probe "15 plan --out dir" -- $M plan --model tiny --gpus 2 --out $F/adir
T="$M train --model tiny --data $F/data.txt --seq-len 16 --micro-batch 2 --quiet"
echo "## 3 signals"
if [ -z "${ONLY:-}" ]; then  # background runs, not probes: ONLY leaves them out
rm -rf $W/ck4
$T --steps 100000 --checkpoint $W/ck4 > $W/sig.out 2>&1 & pid=$!
sleep 8
# a second run on the same directory while the first holds it
probe "4 second run same dir" -- $T --steps 5 --checkpoint $W/ck4 --resume
kill -TERM $pid; wait $pid; echo "rc=$?" >> $W/sig.out
echo "3 SIGTERM: $(tail -2 $W/sig.out | tr '\n' ' ') ; dir: $(ls $W/ck4 | tr '\n' ' ')"
rm -rf $W/ck5
$M train --model tiny --data $F/data.txt --seq-len 16 --micro-batch 2 --quiet --dp 2 --steps 100000 --checkpoint $W/ck5 > $W/sig2.out 2>&1 & pid=$!
sleep 8; kill -INT $pid; wait $pid; echo "rc=$?" >> $W/sig2.out
echo "3 SIGINT dp2 threads: $(tail -2 $W/sig2.out | tr '\n' ' ') ; dir: $(ls $W/ck5 | tr '\n' ' ')"
fi
probe "3 resume after SIGINT" -- $M train --model tiny --data $F/data.txt --seq-len 16 --micro-batch 2 --quiet --dp 2 --steps 100000 --stop-at 1 --checkpoint $W/ck5 --resume
CAL=$R/experiments/calibration/cpu-local-cpu-2026-12-02.json
echo "## 14 calibration"
probe "14 cpu cal on dgx-a100" -- $M simulate --model gpt2-124m --cluster dgx-a100 --gpus 8 --calibration $CAL
probe "14 cpu cal on local-cpu" -- $M simulate --model tiny --cluster local-cpu --calibration $CAL --precision fp32
probe "14 sparse cal local-cpu" -- $M simulate --model tiny --cluster local-cpu --calibration $F/cal-sparse.json --precision fp32
probe "14 plan with cpu cal on h200" -- $M plan --model tiny --gpus 8 --cluster h200 --calibration $CAL
echo "## new: plan"
probe "plan --fix tp=0" -- $M plan --model tiny --gpus 8 --fix tp=0
probe "plan --fix tp=4294967297" -- $M plan --model tiny --gpus 8 --fix tp=4294967297
probe "plan --fix tp=1e400" -- $M plan --model tiny --gpus 8 --fix tp=1e400
probe "plan --fix bogus=1" -- $M plan --model tiny --gpus 8 --fix bogus=1
probe "plan --fix tp=" -- $M plan --model tiny --gpus 8 --fix tp=
probe "plan --fix =" -- $M plan --model tiny --gpus 8 --fix =
probe "plan --fix ,,," -- $M plan --model tiny --gpus 8 --fix ,,,
probe "plan --allow tp=0,-1" -- $M plan --model tiny --gpus 8 --allow tp=0,-1
probe "plan --allow micro_batch=1..1e9" -- $M plan --model tiny --gpus 8 --allow micro_batch=1,1000000000
probe "plan --allow tp=many" -- $M plan --model tiny --gpus 8 --allow tp=$(seq -s, 1 5000)
probe "plan --top 0" -- $M plan --model tiny --gpus 8 --top 0
probe "plan --top -1" -- $M plan --model tiny --gpus 8 --top -1
probe "plan --top 1e9" -- $M plan --model tiny --gpus 8 --top 1000000000
probe "plan --simulate 0" -- $M plan --model tiny --gpus 8 --simulate 0
probe "plan --simulate 1e9" -- $M plan --model tiny --gpus 8 --simulate 1000000000
probe "plan --global-batch 0" -- $M plan --model tiny --gpus 8 --global-batch 0
probe "plan --seq-len 0" -- $M plan --model tiny --gpus 8 --seq-len 0
probe "plan moe" -- $M plan --model tiny-moe --gpus 8 --cluster h200
probe "plan vision" -- $M plan --model swin-fmnist --gpus 4 --cluster h200
probe "plan gpt3 on 1 gpu (no fit)" -- $M plan --model gpt3-175b --gpus 1 --cluster h200
probe "plan layers 65536 model" -- $M plan --model $F/layers-max.json --gpus 8
echo "## new: segments"
probe "seg blocks huge" -- $M simulate --model swin-fmnist --plan $F/seg-blocks.json
probe "seg blocks reversed" -- $M simulate --model swin-fmnist --plan $F/seg-rev.json
probe "seg unknown module" -- $M simulate --model swin-fmnist --plan $F/seg-mod.json
probe "seg empty" -- $M simulate --model swin-fmnist --plan $F/seg-empty.json
probe "seg object" -- $M simulate --model swin-fmnist --plan $F/seg-obj.json
probe "seg ranks 2^20" -- $M simulate --model vqa-tiny --plan $F/seg-ranks.json
probe "seg ranks -1" -- $M simulate --model vqa-tiny --plan $F/seg-neg.json
probe "seg microbatches 0" -- $M simulate --model vqa-tiny --plan $F/seg-mb0.json
probe "seg microbatches 1e9" -- $M simulate --model vqa-tiny --plan $F/seg-mb1e9.json
probe "seg overlap" -- $M simulate --model vqa-tiny --plan $F/seg-overlap.json
probe "seg cp" -- $M simulate --model vqa-tiny --plan $F/seg-cp.json
probe "seg on gpt (tiny)" -- $M simulate --model tiny --plan $R/experiments/plans/vqa-hetero.json
probe "seg ok train tiny" -- $M train --model vqa-tiny --data fashion-mnist --plan $F/seg-ok.json --steps 1 --quiet
probe "seg with moe" -- $M simulate --model tiny-moe --plan $F/seg-moe.json
probe "seg hetero with --tp flag" -- $M simulate --model vqa-tiny --plan $R/experiments/plans/vqa-hetero.json --tp 2
probe "seg hetero with --gpus 3" -- $M simulate --model vqa-tiny --plan $R/experiments/plans/vqa-hetero.json --gpus 3
probe "seg hetero train" -- $M train --model vqa-tiny --data fashion-mnist --plan $R/experiments/plans/vqa-hetero.json --steps 1 --quiet
probe "seg hetero mpirun wrong np" -- mpirun -np 2 --oversubscribe $M train --model vqa-tiny --data fashion-mnist --plan $R/experiments/plans/vqa-hetero.json --steps 1 --quiet
echo "## new: vision data"
probe "fmnist with text model" -- $M train --model tiny --data fashion-mnist --steps 1
probe "text data with vit" -- $M train --model vit-fmnist --data $F/data.txt --steps 1
probe "fmnist with vit-b16 (224 rgb)" -- $M train --model vit-b16 --data fashion-mnist --steps 1
probe "fmnist eval-images 0" -- $M train --model vit-tiny --data fashion-mnist --steps 1 --eval-every 1 --eval-images 0
probe "fmnist eval-images 1e9" -- $M train --model vit-fmnist --data fashion-mnist --steps 1 --eval-every 1 --eval-images 1000000000
probe "fmnist micro-batch 1e6" -- $M train --model vit-fmnist --data fashion-mnist --steps 1 --micro-batch 1000000
O=$W/cal-out.json
probe "cal --sharing 0" -- $M calibrate --backend cpu --quick --out $O --sharing 0
probe "cal --sharing 1e9" -- $M calibrate --backend cpu --quick --out $O --sharing 1000000000
probe "cal --threads 0" -- $M calibrate --backend cpu --quick --out $O --threads 0
probe "cal --threads 1e6" -- $M calibrate --backend cpu --quick --out $O --threads 1000000
probe "cal --statistic foo" -- $M calibrate --backend cpu --quick --out $O --statistic foo
probe "cal --workload nosuch:1:1" -- $M calibrate --backend cpu --quick --out $O --workload nosuch:1:1
probe "cal --workload tiny:a:b" -- $M calibrate --backend cpu --quick --out $O --workload tiny:a:b
probe "cal --workload tiny:0:64" -- $M calibrate --backend cpu --quick --out $O --workload tiny:0:64
probe "cal --workload tiny::" -- $M calibrate --backend cpu --quick --out $O --workload "tiny::"
probe "cal --workload swin-fmnist:4:64 (vision w/ T)" -- $M calibrate --backend cpu --quick --out $O --workload swin-fmnist:4:64
probe "cal --workload FIFO-model" -- $M calibrate --backend cpu --quick --out $O --workload $F/fifo:1:8
probe "cal --profile tiny:1e8:64" -- $M calibrate --backend cpu --profile tiny:100000000:64 --calibration $R/experiments/calibration/cpu-local-cpu-2026-12-02.json
probe "cal --profile no cal" -- $M calibrate --backend cpu --profile tiny:2:16
probe "cal --backend cuda" -- $M calibrate --backend cuda --quick --out $O
probe "cal --backend foo" -- $M calibrate --backend foo --quick --out $O
probe "cal no --out" -- $M calibrate --backend cpu --quick
probe "goodput mtbf 0" -- $M goodput --model tiny --cluster h200 --gpus 8 --mtbf-hours 0
probe "goodput mtbf nan" -- $M goodput --model tiny --cluster h200 --gpus 8 --mtbf-hours nan
probe "goodput iteration-s 1e300" -- $M goodput --model tiny --cluster h200 --gpus 8 --mtbf-hours 1000 --iteration-s 1e300
probe "goodput storage 1e-300" -- $M goodput --model tiny --cluster h200 --gpus 8 --mtbf-hours 1000 --storage-GBps 1e-300
probe "info --rank 1e9" -- $M info --model tiny --rank 1000000000
probe "info --rank 7 of 1" -- $M info --model tiny --rank 7
probe "simulate --straggler 99:2" -- $M simulate --model tiny --cluster h200 --gpus 8 --straggler 99:2
probe "simulate --straggler 0:nan" -- $M simulate --model tiny --cluster h200 --gpus 8 --straggler 0:nan
probe "simulate --straggler random:2:2" -- $M simulate --model tiny --cluster h200 --gpus 8 --straggler random:2:2
probe "simulate --link-degrade x:0.5" -- $M simulate --model tiny --cluster h200 --gpus 8 --link-degrade node99.nic0:0.5
probe "simulate --link-degrade node0.nic0:0" -- $M simulate --model tiny --cluster h200 --gpus 16 --link-degrade node0.nic0:0
probe "simulate --link-fail all nics" -- $M simulate --model tiny --cluster h200 --gpus 16 --dp 16 $(for i in 0 1 2 3 4 5 6 7; do echo --link-fail node0.nic$i; done)
probe "train --fault-inject 9:exit:1" -- $M train --model tiny --data $F/data.txt --seq-len 16 --micro-batch 2 --steps 2 --fault-inject 9:exit:1
probe "train --fault-inject 0:slow:1:1e9" -- $M train --model tiny --data $F/data.txt --seq-len 16 --micro-batch 2 --steps 2 --dp 2 --fault-inject 0:slow:1:1e9
probe "train --threads 0" -- $M train --model tiny --data $F/data.txt --seq-len 16 --micro-batch 2 --steps 1 --threads 0
probe "train --threads 100000" -- $M train --model tiny --data $F/data.txt --seq-len 16 --micro-batch 2 --steps 1 --threads 100000
probe "train --eval-every 0" -- $M train --model tiny --data $F/data.txt --seq-len 16 --micro-batch 2 --steps 1 --eval-every 0
probe "train --backend cuda (no gpu)" -- $M train --model tiny --data $F/data.txt --seq-len 16 --micro-batch 2 --steps 1 --backend cuda
probe "train tp 3 on tiny" -- $M train --model tiny --data $F/data.txt --seq-len 16 --micro-batch 2 --steps 1 --tp 3
probe "train cp 2 vit" -- $M train --model vit-tiny --data fashion-mnist --steps 1 --cp 2
echo "## flags found unbounded, data files beyond memory"
for t in -5 2147483647; do probe "train --threads $t" -- $M train --model tiny --data $F/data.txt --seq-len 16 --micro-batch 2 --steps 1 --threads $t; done
truncate -s 40G $F/sparse.bin
probe "data 40G sparse file" -- $M train --model tiny --data $F/sparse.bin --seq-len 16 --micro-batch 2 --steps 1
rm -f $F/sparse.bin

# ---- issue 29, classes 2 to 5 (p29 prints each class's header; see experiments/RESULTS.md, "Reliability: issue 29") ----
cd $F
echo '{"version":1,"gemm":[{"m":4,"n":4,"k":4,"time_us":1,"bogus":1}]}' > cal-gemm-unknown.json
echo '{"version":1,"collectives":[{"kind":"all_reduce","members":2,"bytes":1024,"busbw_GBps":1,"bogus":1}]}' > cal-coll-unknown.json
echo '{"version":1,"attention":[{"batch_heads":1,"seq":16,"head_dim":16,"time_us":5,"causal":true,"extra":0}]}' > cal-att-unknown.json
echo '{"version":1,"links":[{"kind":"nic","GBps":1,"latency_us":-1}]}' > cal-neg-latency.json
echo '{"version":1,"memory":[{"bytes":1024,"time_us":-3}]}' > cal-neg-time.json
echo '{"version":1,"device":"NVIDIA A100-SXM4-80GB"}' > cal-a100.json
echo '{"version":1,"device":"A100-SXM4-80GB","machine":{"backend":"cpu"}}' > cal-a100-cpu.json
echo '{"version":1,"device":"AMD EPYC (2 cores, cpu backend)","machine":{"backend":"cuda"}}' > cal-cpu-cuda.json
echo '{"version":1,"machine":{"backend":"tpu"}}' > cal-backend-tpu.json
echo '{"hidden":64,"heads":4,"vocab":256,"seq_len":64}' > m-no-layers.json
echo '{"layers":2,"heads":4,"vocab":256,"seq_len":64}' > m-no-hidden.json
echo '{"layers":2,"hidden":64,"heads":4,"vocab":256,"seq_len":64,"extra":{"x":1}}' > m-extra.json
echo '{"family":"vit","layers":2,"hidden":64,"heads":4,"image_size":65536,"patch":1,"channels":1,"classes":10}' > m-vit-huge.json
echo '{"family":"vit","layers":2,"hidden":64,"heads":4,"image_size":46341,"patch":1,"channels":3,"classes":10}' > m-vit-wrap.json
echo '{"family":"vit","layers":2,"hidden":64,"heads":4,"image_size":28,"patch":56,"channels":1,"classes":10}' > m-vit-patch.json
echo '{"layers":2,"hidden":65536,"heads":4,"vocab":1048576,"seq_len":64,"ffn":4194304}' > m-huge-derived.json
echo '{"segments":[{"modules":["vision","projector"],"tp":2,"bogus":1},{"modules":["language"]}]}' > seg-unknown.json
echo '{"segments":[{"modules":[]},{"modules":["vision","projector","language"]}]}' > seg-no-modules.json
echo '{"base":"h200","device":{"name":"x","bogus":1}}' > cluster-deep-unknown.json
echo '{"base":"h200","nvlink_GBps":-5}' > cluster-neg.json
echo '{"model":"tiny","gpus":"0-3","plan":{"tp":2,"bogus":1}}' > job-plan-unknown.json
echo '{"model":"tiny","gpus":"0-3","plan":{"tp":1},"extra":1}' > job-unknown.json
echo '{"step":1,"loss":2.5,"lr":0.001,"step_time_s":-1,"tokens_per_s":5}' > metrics-neg.jsonl
echo '{"step":1,"loss":2.5,"lr":0.001,"step_time_s":1,"tokens_per_s":5,"bogus":1}' > metrics-unknown.jsonl
echo '{"loss":2.5,"lr":0.001,"step_time_s":1,"tokens_per_s":5}' > metrics-nostep.jsonl
echo '[0,0,0,0,0,0,0,1]' > routing-onehot.json
echo '{"name":"a","model":"tiny","gpus":"0-15","plan":{"dp":16}}' > job16.json
echo '{"layers":4,"hidden":1048576,"heads":4,"vocab":256,"seq_len":64}' > m-wide.json
echo '{"pp":2,"first_stage_layers":1}' > plan-pp2-first1.json
cd "$W"
T="$M train --model tiny --data $F/data.txt --seq-len 16 --micro-batch 2 --quiet"
declare -A C29=([2]="a run that lost a rank exits non-zero, naming the ranks and the step"
                [3]="every field of every input file, at every depth" [4]="what-ifs and statistics"
                [5]="messages name the real cause")
LAST29=
# p29 CLASS[:lost] NAME -- COMMAND: one issue-29 probe, under its class's header (printed once).
# CLASS:lost judges a rank lost: a rank SIGKILLed under mpirun is a real death (mpirun itself exits
# 137 and names it), and a hang under threads ends in the peers' timeout, so the verdict is ok when
# the run exits non-zero (not by the time limit) and some line names a rank and a step.
p29() {
  local class=${1%%:*} kind=${1#*:} name="29.${1%%:*} $2"; shift 2; [ "$1" = "--" ] && shift
  [ "$class" != "$LAST29" ] && echo "## 29.$class ${C29[$class]}" && LAST29=$class
  [ "$kind" != lost ] && { probe "$name" -- "$@"; return; }
  [[ "$name" == "${ONLY:-}"* ]] || return 0
  limited "$@"
  local verdict=BAD
  [ $RC -ne 0 ] && [ $RC -ne 124 ] && echo "$OUT" | grep -qiE "rank [0-9].*step [0-9]" && verdict=ok
  [ $RC -eq 0 ] && verdict=ran
  printf '%-5s rc=%-3s %5.1fs %-42s | %s\n' "$verdict" "$RC" "$DT" "$name" \
    "$(echo "$OUT" | grep -iE "error|rank [0-9].*step|refus" | head -2 | tr '\n' ' ' | cut -c1-300)"
}
p29 2 "one rank exits (threads)" -- $T --steps 6 --fault-inject 0:exit:2
p29 2 "every rank exits (threads dp2)" -- $T --steps 6 --dp 2 --fault-inject 0:exit:2 --fault-inject 1:exit:2
p29 2 "rank 1 of 2 exits (threads)" -- $T --steps 6 --dp 2 --fault-inject 1:exit:3
p29 2 "rank 3 of 4 exits (tp2 pp2)" -- $T --steps 4 --tp 2 --pp 2 --fault-inject 3:exit:2
p29 2 "hang on one rank (no peer)" -- $T --steps 4 --fault-inject 0:hang:2 --comm-timeout 1
p29 2:lost "hang rank 1 of 2 (threads)" -- $T --steps 4 --dp 2 --fault-inject 1:hang:2 --comm-timeout 1
p29 2:lost "hang rank 0 of 2 (threads pp2)" -- $T --steps 4 --pp 2 --fault-inject 0:hang:3 --comm-timeout 1
p29 2:lost "hang 1 + exit 3 of 4 (threads)" -- $T --steps 4 --dp 4 --fault-inject 1:hang:2 --fault-inject 3:exit:2 --comm-timeout 1
p29 2 "exit beyond --steps" -- $T --steps 3 --dp 2 --fault-inject 1:exit:9
p29 2 "hang beyond --stop-at" -- $T --steps 6 --dp 2 --stop-at 2 --checkpoint $W/ck29 --fault-inject 1:hang:4
p29 2 "exit and hang same rank+step" -- $T --steps 4 --dp 2 --fault-inject 1:exit:2 --fault-inject 1:hang:2
p29 2:lost "mpirun -np 1 exit" -- mpirun -np 1 $T --steps 6 --fault-inject 0:exit:2
p29 2:lost "mpirun -np 2 rank 1 exits" -- mpirun -np 2 --oversubscribe $T --steps 6 --dp 2 --fault-inject 1:exit:2
p29 2 "mpirun -np 1 hang (no peer)" -- mpirun -np 1 $T --steps 4 --fault-inject 0:hang:2 --comm-timeout 1
p29 2:lost "mpirun -np 2 hang rank 1" -- mpirun -np 2 --oversubscribe $T --steps 4 --dp 2 --fault-inject 1:hang:2 --comm-timeout 1
# Issue 31: a crash, an abort of the leader and an exception under mpirun name the rank, the signal and the step.
p29 2:lost "mpirun -np 2 rank 1 SIGSEGV" -- mpirun -np 2 --oversubscribe $T --steps 6 --dp 2 --fault-inject 1:signal:3:SEGV
p29 2:lost "mpirun -np 2 rank 0 SIGABRT" -- mpirun -np 2 --oversubscribe $T --steps 6 --dp 2 --fault-inject 0:signal:3:ABRT
p29 2:lost "mpirun -np 2 rank 1 throws" -- mpirun -np 2 --oversubscribe $T --steps 6 --dp 2 --fault-inject 1:throw:3
C1="$M simulate --model tiny --gpus 1 --cluster local-cpu --precision fp32 --calibration"
p29 3 "cal unknown key in gemm[0]" -- $C1 $F/cal-gemm-unknown.json
p29 3 "cal unknown key in collectives[0]" -- $C1 $F/cal-coll-unknown.json
p29 3 "cal unknown key in attention[0]" -- $C1 $F/cal-att-unknown.json
p29 3 "cal negative latency" -- $C1 $F/cal-neg-latency.json
p29 3 "cal negative time" -- $C1 $F/cal-neg-time.json
p29 3 "cal A100 on local-cpu" -- $C1 $F/cal-a100.json
p29 3 "cal A100 + backend cpu on local-cpu" -- $C1 $F/cal-a100-cpu.json
p29 3 "cal backend tpu" -- $C1 $F/cal-backend-tpu.json
p29 3 "model missing layers" -- $M info --model $F/m-no-layers.json
p29 3 "model missing hidden" -- $M info --model $F/m-no-hidden.json
p29 3 "model unknown nested" -- $M info --model $F/m-extra.json
p29 3 "vit 65536^2 patches" -- $M info --model $F/m-vit-huge.json
p29 3 "vit 46341^2x3 patches" -- $M info --model $F/m-vit-wrap.json
p29 3 "vit patch > image" -- $M info --model $F/m-vit-patch.json
p29 3 "model derived params huge" -- $M info --model $F/m-huge-derived.json
p29 3 "segment unknown key" -- $M simulate --model vqa-tiny --plan $F/seg-unknown.json
p29 3 "cluster device unknown key" -- $M simulate --model tiny --gpus 8 --cluster $F/cluster-deep-unknown.json
p29 3 "cluster negative latency" -- $M simulate --model tiny --gpus 8 --cluster $F/cluster-neg.json
p29 3 "job plan unknown key" -- $M simulate --cluster h200 --job $F/job-plan-unknown.json
p29 3 "job entry unknown key" -- $M simulate --cluster h200 --job $F/job-unknown.json
p29 3 "plot metrics negative time" -- $M plot $F/metrics-neg.jsonl --out $W/m1.svg
p29 3 "plot metrics unknown key" -- $M plot $F/metrics-unknown.jsonl --out $W/m2.svg
p29 3 "plot metrics no step" -- $M plot $F/metrics-nostep.jsonl --out $W/m3.svg
S8="$M simulate --model tiny --cluster h200 --gpus 16 --dp 16"
p29 4 "link failed and degraded" -- $S8 --link-fail node0.nic0 --link-degrade node0.nic0:0.5
p29 4 "link failed twice" -- $S8 --link-fail node0.nic0 --link-fail node0.nic0
p29 4 "link degraded twice" -- $S8 --link-degrade node0.nic0:0.5 --link-degrade node0.nic0:0.25
p29 4 "straggler twice" -- $S8 --straggler 3:2 --straggler 3:1.5
p29 4 "--moe-routing on dense" -- $M simulate --model tiny --cluster h200 --gpus 8 --moe-routing zipf:1.2
p29 4 "plan --moe-routing on dense" -- $M plan --model tiny --cluster h200 --gpus 8 --moe-routing zipf:1.2
p29 4 "zipf:3 top-2 load (<= 4)" -- $M simulate --model tiny-moe --cluster h200 --gpus 8 --ep 8 --moe-routing zipf:3
p29 4 "file one-hot top-2 load" -- $M simulate --model tiny-moe --cluster h200 --gpus 8 --ep 8 --moe-routing file:$F/routing-onehot.json
p29 4 "what-ifs listed" -- $S8 --straggler 3:2 --link-degrade node0.nic1:0.5 --link-fail node1.nic2
p29 4 "--job what-ifs listed" -- $M simulate --cluster h200 --job $F/job16.json --link-degrade node1.nic0:0.5 --link-fail node0.nic1
p29 5 "--straggler -1:2" -- $S8 --straggler -1:2
p29 5 "info --rank -1" -- $M info --model tiny --rank -1
p29 5 "--fault-inject -1:exit:1" -- $T --steps 2 --fault-inject -1:exit:1
p29 5 "workload 4 fields" -- $M calibrate --backend cpu --quick --out $W/c.json --workload tiny:2:16:5
p29 5 "workload 2 fields" -- $M calibrate --backend cpu --quick --out $W/c.json --workload tiny:2
p29 5 "segment no modules" -- $M simulate --model vqa-tiny --plan $F/seg-no-modules.json
p29 5 "cal A100+cpu on dgx-a100" -- $M simulate --model tiny --gpus 8 --cluster dgx-a100 --calibration $F/cal-a100-cpu.json
p29 5 "cal cpu device cuda backend" -- $M simulate --model tiny --gpus 8 --cluster dgx-a100 --calibration $F/cal-cpu-cuda.json
p29 5 "out of memory (simulate)" -- $M simulate --model gpt3-175b --cluster h200 --gpus 8 --tp 8
p29 5 "out of memory (default plan)" -- $M simulate --model llama3-70b --gpus 8
p29 5 "out of memory (planner)" -- $M plan --model gpt3-175b --gpus 8 --no-progress
p29 5 "out of memory (train, 1 rank)" -- $M train --model $F/m-wide.json --data $F/data.txt --seq-len 16 --steps 1 --grad-bucket-mb 1048576
p29 5 "out of memory (train, 2 rank threads)" -- $M train --model $F/m-wide.json --data $F/data.txt --seq-len 16 --steps 1 --grad-bucket-mb 1048576 --dp 2
p29 5 "out of memory (train, pp2, stage 1)" -- $M train --model $F/m-wide.json --data $F/data.txt --seq-len 16 --steps 1 --grad-bucket-mb 1048576 --plan $F/plan-pp2-first1.json
p29 5 "NaN stop --overlap-update" -- $T --steps 3 --dp 2 --zero 1 --overlap-update --grad-clip 0 --lr 1e30
rm -rf "$W"
