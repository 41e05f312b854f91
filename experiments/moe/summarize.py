#!/usr/bin/env python3
"""Summarises the runs of train_tiny_moe.sh: losses, expert load and drops."""
import json
import statistics
import sys

out = sys.argv[1] if len(sys.argv) > 1 else "/tmp/moe_train"
for run in ["dense", "moe", "moe_ep2", "moe_noaux", "moe_capped"]:
    d = [json.loads(line) for line in open(f"{out}/{run}.jsonl")]
    train = " ".join(f"{d[s - 1]['loss']:.3f}" for s in (1, 50, 100, 200, 300, 400))
    val = " ".join(f"{x['val_loss']:.3f}" for x in d if "val_loss" in x)
    line = f"{run:11s} train@1,50,100,200,300,400 {train} | val@100..400 {val}"
    if "aux_loss" in d[0]:
        worst = [x["expert_load_max_mean"] for x in d]
        mean = [x["expert_load_mean_max_mean"] for x in d]
        drop = [x["dropped_fraction"] for x in d]
        avg = lambda a, lo, hi: statistics.mean(a[lo:hi])
        line += (f" | max/mean (worst layer) steps 1-10 {avg(worst, 0, 10):.2f}, 100-200 {avg(worst, 99, 200):.2f},"
                 f" 301-400 {avg(worst, 300, 400):.2f}; mean over layers 301-400 {avg(mean, 300, 400):.2f}"
                 f" | dropped 1-10 {avg(drop, 0, 10):.3f}, 301-400 {avg(drop, 300, 400):.3f}")
    print(line)
