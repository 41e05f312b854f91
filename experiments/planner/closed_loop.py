#!/usr/bin/env python3
"""The planner against real runs on this machine (the issue's check 4).

For each model (a small GPT and a small Swin) on 4 ranks as threads of the
cpu backend: calibrate this machine (`meshtrain calibrate --backend cpu`,
4 rank threads sharing the cores), search with `meshtrain plan --cluster
local-cpu --calibration FILE --precision fp32`, then train the planner's
top 5 plans and 5 other valid plans (evenly spread over the rest of its
ranking) for real and compare: is the planner's first choice within 5% of
the fastest measured, and Kendall's tau of predicted against measured order.

    experiments/planner/closed_loop.py --meshtrain build/engine/meshtrain [--quick] [--calibration FILE]

Measured: the median `step_time_s` of `meshtrain train --metrics` after
--warmup steps. --quick (the CI test): the small GPT only, 2 + 2 plans, few
steps, a quick calibration of medians; it checks only that the loop runs and reports.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
CPU_LOOP = os.path.join(HERE, "..", "validation", "cpu-loop")
SMALL_GPT = os.path.join(CPU_LOOP, "small-gpt.json")
sys.path.insert(0, CPU_LOOP)
from idx_images import write_images  # noqa: E402  (the cpu loop's synthetic image set)
# (label, model, global batch, seq or None for images, calibration workloads)
MODELS = [
    ("small-gpt", SMALL_GPT, 16, 128, [f"{SMALL_GPT}:{b}:128" for b in (1, 4)]),
    ("swin-fmnist", "swin-fmnist", 64, None, ["swin-fmnist:4", "swin-fmnist:16"]),
]


def run(cmd):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {p.stderr.strip()[-400:]}")
    return p.stdout


def kendall(a, b):
    c = d = 0
    for i in range(len(a)):
        for j in range(i + 1, len(a)):
            s = (a[i] - a[j]) * (b[i] - b[j])
            c += s > 0
            d += s < 0
    return (c - d) / max(1, c + d)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--meshtrain", default="build/engine/meshtrain")
    ap.add_argument("--calibration", help="use this calibration (measured with --sharing 4) instead of measuring one")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", help="one model label")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    a = ap.parse_args()
    mt = a.meshtrain
    top, others = (2, 2) if a.quick else (5, 5)
    steps = 3 if a.quick else a.steps
    warmup = 1 if a.quick else a.warmup
    models = [m for m in MODELS if (not a.quick or m[0] == "small-gpt") and (not a.only or m[0] == a.only)]
    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        text = os.path.join(tmp, "data.bin")
        with open(text, "wb") as f:
            f.write(bytes((i * 2654435761 >> 13) & 255 for i in range(200_000)))
        images = "/usr/share/datasets/fashion-mnist"
        if not os.path.isdir(images):
            images = os.path.join(tmp, "images")
            write_images(images)
        for label, model, batch, seq, workloads in models:
            cal = a.calibration
            if not cal:
                cal = os.path.join(tmp, f"{label}-cal.json")
                # --quick judges nothing it measures: idle-machine medians of short samples suffice there,
                # where the full loop needs means of samples long enough to see the load.
                cmd = [mt, "calibrate", "--backend", "cpu", "--out", cal, "--sharing", "4", "--max-ranks", "4",
                       "--statistic", "median" if a.quick else "mean"] + (["--quick"] if a.quick else [])
                for w in workloads[-1:] if a.quick else workloads:
                    cmd += ["--workload", w]
                print(f"{label}: calibrating ...", file=sys.stderr, flush=True)
                run(cmd)
            seq_flags = ["--seq-len", str(seq)] if seq else []
            found = json.loads(run([mt, "plan", "--model", model, "--cluster", "local-cpu", "--calibration", cal,
                                    "--gpus", "4", "--global-batch", str(batch), "--precision", "fp32", "--json",
                                    "--no-progress", "--top", "100000", "--simulate", "100000"] + seq_flags))
            ranked = [r for r in found["ranked"] if "iteration_time_s" in r]
            rest = ranked[top:]
            # Evenly spread over the rest of the ranking, its middle to its end.
            picks = sorted({min(len(rest) - 1, (k + 1) * len(rest) // others - 1) for k in range(others)})
            chosen = ranked[:top] + [rest[i] for i in picks]
            print(f"{label}: {len(ranked)} plans simulated; running {len(chosen)} for real", file=sys.stderr, flush=True)
            rows = []
            for r in chosen:
                plan_file = os.path.join(tmp, "plan.json")
                with open(plan_file, "w") as f:
                    json.dump(r["plan"], f)
                metrics = os.path.join(tmp, "metrics.jsonl")
                if os.path.exists(metrics):
                    os.remove(metrics)
                run([mt, "train", "--model", model, "--plan", plan_file, "--data", images if seq is None else text,
                     "--steps", str(steps), "--warmup", "1", "--lr", "1e-3", "--quiet", "--metrics", metrics])
                with open(metrics) as f:
                    times = [json.loads(line)["step_time_s"] for line in f if line.strip()]
                measured = statistics.median(times[warmup:])
                rows.append((r["rank"], r["summary"], r["iteration_time_s"], measured))
                print(f"  #{r['rank']:<4} {r['summary']:<40} predicted {r['iteration_time_s'] * 1e3:8.1f} ms  "
                      f"measured {measured * 1e3:8.1f} ms", flush=True)
            fastest = min(m for _, _, _, m in rows)
            first = rows[0][3]
            tau = kendall([p for _, _, p, _ in rows], [m for _, _, _, m in rows])
            within = first <= fastest * 1.05
            print(f"{label}: first choice {first * 1e3:.1f} ms, fastest measured {fastest * 1e3:.1f} ms "
                  f"({(first / fastest - 1) * 100:+.1f}%, within 5%: {'yes' if within else 'no'}); "
                  f"Kendall tau (predicted vs measured, {len(rows)} plans) {tau:.3f}", flush=True)
            failed = failed or not (a.quick or within)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
