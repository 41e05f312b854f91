#!/usr/bin/env python3
"""The segment layouts' fast tier against the full simulation (RESULTS.md,
"Segment layouts: the fast tier"): for each job, `meshtrain plan --layouts
segments` with the DES timing the fast tier's best N layouts (all of them when
N is at least the family), and the agreement `plan` reports over them."""
import argparse
import json
import subprocess
import time

JOBS = [
    # name, flags, layouts the DES times
    ("swin-micro/4", "--model swin-micro --cluster local-cpu --precision fp32 --gpus 4 --global-batch 8", 100000),
    ("swin-fmnist/4", "--model swin-fmnist --cluster local-cpu --precision fp32 --gpus 4 --global-batch 64", 100000),
    ("vqa-tiny/4", "--model vqa-tiny --cluster local-cpu --precision fp32 --gpus 4 --global-batch 16", 100000),
    ("swin-b/64 dgx-a100", "--model swin-b --cluster dgx-a100 --gpus 64 --global-batch 256", 200),
    ("llava-1.5-13b/32 dgx-h100", "--model llava-1.5-13b --cluster dgx-h100 --gpus 32 --global-batch 128", 200),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--meshtrain", default="build-dev/meshtrain")
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--simulate", type=int, help="override the layouts the DES times")
    args = ap.parse_args()
    print("| job | formed | valid | pruned | estimated | DES-timed | Spearman | Kendall | worst err | fast winner's DES place | DES winner's fast place | best of fast top 16 vs DES best | wall s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, flags, n in JOBS:
        if args.only and not any(o in name for o in args.only):
            continue
        n = args.simulate or n
        cmd = f"{args.meshtrain} plan {flags} --layouts segments --segments {n} --json --no-progress --top 1000000"
        t = time.time()
        r = subprocess.run(cmd.split(), capture_output=True, text=True)
        wall = time.time() - t
        if r.returncode != 0:
            print(f"| {name} | failed: {r.stdout.strip()[:200]} {r.stderr.strip()[:200]} |")
            continue
        j = json.loads(r.stdout)
        fam, a = j["search"]["segment_layouts"], j["segment_agreement"]
        timed = [row for row in j["ranked"] if "iteration_time_s" in row]
        fast_best = min(timed, key=lambda row: row["fast_iteration_time_s"])
        des_place = timed.index(fast_best) + 1
        top16 = sorted(timed, key=lambda row: row["fast_iteration_time_s"])[:16]
        gap = min(row["iteration_time_s"] for row in top16) / timed[0]["iteration_time_s"] - 1
        print(f"| {name} | {fam['formed']} | {fam['valid']} | {fam['pruned_by_memory']} | {fam['estimated']} | "
              f"{fam['simulated']} | {a['spearman']:.3f} | {a['kendall_tau']:.3f} | "
              f"{100 * a['worst_relative_error']:.1f}% | {des_place} | {a['winner_fast_rank']} | +{100 * gap:.2f}% | "
              f"{wall:.1f} |",
              flush=True)
        print(f"  DES winner: {timed[0]['summary']} {timed[0]['iteration_time_s']*1e3:.3f} ms "
              f"(fast {timed[0]['fast_iteration_time_s']*1e3:.3f} ms)", flush=True)


if __name__ == "__main__":
    main()
