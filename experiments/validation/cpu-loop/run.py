#!/usr/bin/env python3
"""Close the loop on this machine: calibrate the cpu backend, run real training
steps under several plans, simulate the same plans with the calibration on the
local-cpu cluster, and print plan, measured, predicted and error.

    experiments/validation/cpu-loop/run.py --meshtrain build/engine/meshtrain

Measured: the median `step_time_s` of `meshtrain train --metrics` over the
steps after --warmup. Predicted: `iteration_time_s` of `meshtrain simulate
--cluster local-cpu --calibration FILE --precision fp32 --json`. Error:
(predicted - measured) / measured. Exit status 1 when the worst absolute error
exceeds --max-worst or the median exceeds --max-median (see README.md).

Calibration: by default one calibration is measured first, for both
workloads at 1 and 2 ranks sharing the cores, and predicts every plan (what
the simulator is for: one description of the machine, many plans);
--calibration FILE uses a saved one, --save-calibration FILE keeps it. On a
machine loaded by other work, whose speed drifts within a minute, --per-plan
calibrates each plan just before it runs (its shapes only, at its rank count)
so that the calibration and the run see the same load.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

from idx_images import write_images

HERE = os.path.dirname(os.path.abspath(__file__))
SMALL = os.path.join(HERE, "small-gpt.json")

# (label, model, micro-batch, seq, plan flags). Global batch: 4 micro-batches
# per replica, so pipelines have work to overlap.
TINY = ("tiny", 8, 64)
SMALL_GPT = (SMALL, 4, 128)
# Vision models on 28×28 images (Fashion-MNIST, or a synthetic IDX set of that
# size where the package is missing); their images fix the tokens (seq None).
SWIN = ("swin-fmnist", 16, None)
VIT = ("vit-fmnist", 16, None)
PLANS = [
    ("tiny single", TINY, []),
    ("tiny tp2", TINY, ["--tp", "2"]),
    ("tiny pp2 gpipe", TINY, ["--pp", "2", "--schedule", "gpipe"]),
    ("tiny pp2 1f1b", TINY, ["--pp", "2", "--schedule", "1f1b"]),
    ("tiny dp2 zero0", TINY, ["--dp", "2", "--zero", "0"]),
    ("tiny dp2 zero1", TINY, ["--dp", "2", "--zero", "1"]),
    ("tiny dp2 zero3", TINY, ["--dp", "2", "--zero", "3"]),
    ("small single", SMALL_GPT, []),
    ("small tp2", SMALL_GPT, ["--tp", "2"]),
    ("small pp2 1f1b", SMALL_GPT, ["--pp", "2", "--schedule", "1f1b"]),
    ("small dp2 zero1", SMALL_GPT, ["--dp", "2", "--zero", "1"]),
    ("swin single", SWIN, []),
    ("swin tp2", SWIN, ["--tp", "2"]),
    ("swin pp2 1f1b", SWIN, ["--pp", "2", "--schedule", "1f1b", "--first-stage-layers", "7"]),
    ("swin dp2 zero1", SWIN, ["--dp", "2", "--zero", "1"]),
    ("vit single", VIT, []),
    ("vit tp2", VIT, ["--tp", "2"]),
    ("vit dp2 zero1", VIT, ["--dp", "2", "--zero", "1"]),
]
QUICK = ["tiny single", "tiny tp2", "tiny pp2 1f1b", "tiny dp2 zero1"]
# With --mpi: the same plans with ranks as processes under mpirun, predicted
# from a calibration made under mpirun (collectives over MPI, kernels inside
# one bound process) with `simulate --comm mpi`.
MPI_PLANS = ["tiny tp2", "tiny pp2 1f1b", "tiny dp2 zero1"]
MPIRUN = ["mpirun", "--oversubscribe", "-np"]


def world(flags):
    w = 1
    for key in ("--tp", "--pp", "--dp"):
        if key in flags:
            w *= int(flags[flags.index(key) + 1])
    return w


def common(workload, flags, microbatches):
    model, b, t = workload
    dp = int(flags[flags.index("--dp") + 1]) if "--dp" in flags else 1
    seq = ["--seq-len", str(t)] if t else []
    return ["--model", model, "--micro-batch", str(b)] + seq + [
            "--global-batch", str(b * dp * microbatches)] + flags


def data_for(workload, text, images):
    return images if workload[2] is None else text


def run(cmd):
    # Open MPI refuses to run as root without these (CI and these VMs run as root).
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    return p.returncode, p.stdout, p.stderr


def measure(mt, data, workload, flags, steps, warmup, microbatches, tmp, launcher=()):
    metrics = os.path.join(tmp, "metrics.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    rc, _, err = run(list(launcher) + [mt, "train", "--data", data, "--steps", str(steps), "--warmup", "1",
                      "--lr", "1e-3", "--quiet", "--metrics", metrics]
                     + common(workload, flags, microbatches))
    if rc != 0:
        return None, err.strip().splitlines()[-1] if err.strip() else f"exit {rc}"
    with open(metrics) as f:
        times = [json.loads(line)["step_time_s"] for line in f if line.strip()]
    return statistics.median(times[warmup:]), None


def predict(mt, cal, workload, flags, microbatches, comm="threads"):
    rc, out, err = run([mt, "simulate", "--cluster", "local-cpu", "--gpus", str(world(flags)),
                        "--calibration", cal, "--precision", "fp32", "--json", "--comm", comm]
                       + common(workload, flags, microbatches))
    if rc != 0:
        return None, err.strip().splitlines()[-1] if err.strip() else f"exit {rc}"
    return json.loads(out)["iteration_time_s"], None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--meshtrain", default="build/engine/meshtrain")
    ap.add_argument("--calibration", help="use this calibration instead of measuring one")
    ap.add_argument("--save-calibration", help="keep the calibration measured for the run here")
    ap.add_argument("--mpi", action="store_true",
                    help="also run " + ", ".join(MPI_PLANS) + " as MPI processes (mpirun)")
    ap.add_argument("--per-plan", action="store_true",
                    help="calibrate each plan just before it runs (a machine with drifting load)")
    ap.add_argument("--quick", action="store_true",
                    help="quick calibration and 4 tiny plans (the CI test)")
    ap.add_argument("--only", nargs="+", metavar="WORD",
                    help="run only the plans whose label starts with one of these words (e.g. swin vit)")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=3, help="steps left out of the median")
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--max-worst", type=float, default=0.20)
    ap.add_argument("--max-median", type=float, default=0.10)
    ap.add_argument("--csv", help="also write the table as CSV")
    ap.add_argument("--statistic", default="mean", choices=["mean", "median"],
                    help="per-plan calibration statistic (see meshtrain calibrate --help)")
    a = ap.parse_args()
    if a.warmup >= a.steps:
        sys.exit(f"--warmup {a.warmup} must be below --steps {a.steps}")
    mt = a.meshtrain
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "data.bin")
        with open(data, "wb") as f:  # any bytes are tokens; the content does not change timing
            f.write(bytes((i * 2654435761 >> 13) & 255 for i in range(200_000)))
        images = "/usr/share/datasets/fashion-mnist"
        if not os.path.isdir(images):
            images = os.path.join(tmp, "images")
            write_images(images)
        selected = [p for p in PLANS if (not a.quick or p[0] in QUICK)
                    and (not a.only or p[0].split()[0] in a.only)]

        def calibrate(workloads, sharing, quick, launcher=(), name="calibration.json"):
            """A calibration of the workloads' shapes at the sharing levels, measured now."""
            cal = os.path.join(tmp, name)
            cmd = list(launcher) + [mt, "calibrate", "--backend", "cpu", "--out", cal, "--no-grid",
                   "--max-ranks", "2", "--statistic", a.statistic] + (["--quick"] if quick else [])
            for model, b, t in workloads:
                cmd += ["--workload", f"{model}:{b}:{t}" if t else f"{model}:{b}"]
            for level in sharing:
                cmd += ["--sharing", str(level)]
            rc, _, err = run(cmd)
            if rc != 0:
                sys.exit(f"calibrate failed: {err.strip()}")
            return cal
        cal = a.calibration
        if not cal and not a.per_plan:
            print("calibrating (about a minute) ...", file=sys.stderr, flush=True)
            workloads = sorted({p[1] for p in selected}, key=str)
            cal = calibrate(workloads, sorted({min(world(p[2]), 2) for p in selected}), a.quick)
            if a.save_calibration:
                shutil.copyfile(cal, a.save_calibration)
        rows, errors = [], []

        def add_row(label, measured, predicted, why):
            if predicted is None:
                rows.append((label, measured, None, None, why))
                return
            e = (predicted - measured) / measured
            errors.append(abs(e))
            rows.append((label, measured, predicted, e, ""))
            print(f"  {label}: measured {measured * 1e3:.2f} ms, predicted {predicted * 1e3:.2f} ms",
                  file=sys.stderr, flush=True)
        for label, workload, flags in selected:
            if a.per_plan and not a.calibration:
                cal = calibrate([workload], [world(flags)], True)
            measured, why = measure(mt, data_for(workload, data, images), workload, flags, a.steps, a.warmup,
                                    a.microbatches, tmp)
            if measured is None:
                rows.append((label, None, None, None, why))
                continue
            add_row(label, measured, *predict(mt, cal, workload, flags, a.microbatches))
        if a.mpi:
            mpi_plans = [p for p in PLANS if p[0] in MPI_PLANS and p in selected]
            print("calibrating under mpirun ...", file=sys.stderr, flush=True)
            np_ = max(world(p[2]) for p in mpi_plans)
            mpi_cal = calibrate(sorted({p[1] for p in mpi_plans}), [1], a.quick,
                                MPIRUN + [str(np_)], "calibration-mpi.json")
            for label, workload, flags in mpi_plans:
                measured, why = measure(mt, data_for(workload, data, images), workload, flags, a.steps, a.warmup,
                                        a.microbatches, tmp, MPIRUN + [str(world(flags))])
                if measured is None:
                    rows.append((label + " mpi", None, None, None, why))
                    continue
                add_row(label + " mpi", measured,
                        *predict(mt, mpi_cal, workload, flags, a.microbatches, "mpi"))
    print(f"{'plan':<18} {'measured ms':>12} {'predicted ms':>13} {'error':>8}")
    for label, m, p, e, why in rows:
        if e is None:
            print(f"{label:<18} {'-' if m is None else f'{m * 1e3:.2f}':>12} {'-':>13} {'-':>8}  "
                  f"not run: {why}")
        else:
            print(f"{label:<18} {m * 1e3:>12.2f} {p * 1e3:>13.2f} {e * 100:>+7.1f}%")
    if a.csv:
        with open(a.csv, "w") as f:
            f.write("plan,measured_s,predicted_s,error,note\n")
            for label, m, p, e, why in rows:
                f.write(f"{label},{m if m is not None else ''},{p if p is not None else ''},"
                        f"{e if e is not None else ''},{why}\n")
    if not errors:
        sys.exit("no plan was both measured and simulated")
    med, worst = statistics.median(errors), max(errors)
    print(f"median |error| {med * 100:.1f}%, worst {worst * 100:.1f}% over {len(errors)} plans "
          f"(targets: median <= {a.max_median * 100:.0f}%, worst <= {a.max_worst * 100:.0f}%)")
    if worst > a.max_worst or med > a.max_median:
        sys.exit(1)


if __name__ == "__main__":
    main()
