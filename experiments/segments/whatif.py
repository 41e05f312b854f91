#!/usr/bin/env python3
"""What-if study for per-segment plans (issue 13): the layouts the mission
names against uniform data, tensor and pipeline parallelism, simulated.

    experiments/segments/whatif.py --meshtrain build/engine/meshtrain [--study swin|vqa|all]

Prints a markdown table per study (iteration time, samples or tokens per
second, bytes all ranks send per iteration, peak memory), each row a
`meshtrain simulate --json` run; speed ratios are against pure data
parallelism on the same GPUs.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def simulate(meshtrain, model, cluster, args, segments=None, extra=None):
    cmd = [meshtrain, "simulate", "--model", model, "--cluster", cluster, "--json"] + args
    tmp = None
    if segments is not None:
        tmp = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
        json.dump({"segments": segments, **(extra or {})}, tmp)
        tmp.close()
        cmd += ["--plan", tmp.name]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if tmp:
        os.unlink(tmp.name)
    if r.returncode != 0:
        return {"error": (r.stderr or r.stdout).strip().splitlines()[-1][:160]}
    return json.loads(r.stdout)


def row(name, j, base=None):
    if "error" in j:
        return f"| {name} | - | - | - | - | {j['error']} |"
    t = j["iteration_time_s"]
    ratio = f"{base / t:.2f}x" if base else "-"
    rate = j.get("images_per_s", j["tokens_per_s"])
    return (f"| {name} | {t:.4f} | {rate:.1f} | {ratio} | {j['sent_bytes'] / 2**30:.2f} GiB | "
            f"{j['peak_memory_bytes'] / 2**30:.1f} GiB |")


HEADER = ("| plan | iteration s | per s | speed vs DP | bytes sent by all ranks | peak memory |\n"
          "|---|---|---|---|---|---|")


def swin(meshtrain, cluster):
    model = os.path.join(HERE, "swin-b-1024.json")
    print(f"\n### Swin-B at 1024² (window 16), global batch 64, {cluster}\n")
    print(HEADER)
    for gpus in (8, 16, 32, 64):
        common = ["--global-batch", "64"]
        runs = {
            f"{gpus} GPUs: DP {gpus}, ZeRO 1": simulate(meshtrain, model, cluster,
                                                     common + ["--dp", str(gpus), "--micro-batch", str(64 // gpus), "--zero", "1"]),
            f"{gpus} GPUs: TP 4 × DP {gpus // 4}, SP": simulate(meshtrain, model, cluster,
                                                       common + ["--tp", "4", "--dp", str(gpus // 4), "--micro-batch",
                                                                 str(max(1, 64 // (gpus // 4) // 4)), "--sequence-parallel"]),
            f"{gpus} GPUs: PP 2 × DP {gpus // 2}": simulate(meshtrain, model, cluster,
                                                     common + ["--pp", "2", "--dp", str(gpus // 2), "--micro-batch", "1",
                                                               "--first-stage-layers", "13"]),
        }
        hybrid = [
            {"name": "patch embedding", "modules": ["embed"], "dp": gpus},
            {"name": "stages 1-2", "modules": ["stage1", "stage2"], "tp": 2, "dp": gpus // 2, "sequence_parallel": True},
            {"name": "stages 3-4", "modules": ["stage3", "stage4", "head"], "pp": 2, "dp": gpus // 2,
             "microbatches": max(2, 64 // (gpus // 2))},
        ]
        runs[f"{gpus} GPUs: hybrid (embed DP {gpus}; stages 1-2 TP 2 × DP {gpus // 2}; 3-4 PP 2 × DP {gpus // 2})"] = \
            simulate(meshtrain, model, cluster, common + ["--micro-batch", "1"], hybrid)
        # The early stages hold few parameters and the most activations: data-parallel there, pipelined after.
        early_dp = [
            {"name": "embed + stages 1-2", "modules": ["embed", "stage1", "stage2"], "dp": gpus},
            {"name": "stages 3-4", "modules": ["stage3", "stage4", "head"], "pp": 2, "dp": gpus // 2,
             "microbatches": max(2, 64 // (gpus // 2))},
        ]
        runs[f"{gpus} GPUs: hybrid (embed + stages 1-2 DP {gpus}; 3-4 PP 2 × DP {gpus // 2})"] = \
            simulate(meshtrain, model, cluster, common + ["--micro-batch", "1"], early_dp)
        base = runs[f"{gpus} GPUs: DP {gpus}, ZeRO 1"].get("iteration_time_s")
        for name, j in runs.items():
            print(row(name, j, base))


def vqa(meshtrain, cluster):
    """LLaVA-1.5-13B (ViT-L/14 at 336², MLP projector, a 13B decoder): pure data
    parallelism with the ZeRO stage it needs against the vision encoder on a
    tensor-parallel group and the language model pipelined on the other ranks."""
    model = "llava-1.5-13b"
    G = 128
    print(f"\n### {model}, global batch {G}, {cluster}\n")
    print(HEADER)
    for gpus in (16, 32, 64):
        runs = {}
        for zero in (1, 2, 3):
            runs[f"{gpus} GPUs: DP {gpus}, ZeRO {zero}"] = simulate(
                meshtrain, model, cluster, ["--dp", str(gpus), "--micro-batch", str(G // gpus), "--global-batch", str(G),
                                            "--zero", str(zero), "--recompute", "selective"])
        # The mission's layout: the encoder (and projector) on a small tensor-parallel group, the language
        # model (41 layers: the joiner and 40 decoder layers) tensor-parallel within a node and pipelined
        # over the other ranks; micro-batches of 8 samples (8·(577 + 64) rows divide over tp 8).
        vision, lang_tp, lang_pp, first = {16: (4, 4, 3, 13), 32: (8, 8, 3, 13), 64: (8, 8, 7, 5)}[gpus]
        segments = [
            {"name": "vision encoder + projector", "modules": ["vision", "projector"], "tp": 2,
             "dp": vision // 2, "ranks": [0, vision - 1], "microbatches": G // (vision // 2) // 8},
            {"name": "language model", "modules": ["language"], "tp": lang_tp, "pp": lang_pp,
             "first_stage_layers": first, "sequence_parallel": True, "ranks": [vision, gpus - 1],
             "microbatches": G // 8, "recompute": "selective"},
        ]
        runs[f"{gpus} GPUs: vision tp 2 × dp {vision // 2} on {vision}; language tp {lang_tp} × pp {lang_pp} "
             f"on {gpus - vision}"] = simulate(meshtrain, model, cluster, ["--global-batch", str(G), "--micro-batch", "8"],
                                               segments)
        dp_times = [j["iteration_time_s"] for n, j in runs.items() if "DP" in n.split(":")[1][:4] and "error" not in j]
        base = min(dp_times) if dp_times else None
        for name, j in runs.items():
            print(row(name, j, base))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--meshtrain", default="build/engine/meshtrain")
    ap.add_argument("--cluster", default="dgx-a100")
    ap.add_argument("--study", default="all", choices=["swin", "vqa", "all"])
    a = ap.parse_args()
    if a.study in ("swin", "all"):
        swin(a.meshtrain, a.cluster)
    if a.study in ("vqa", "all"):
        vqa(a.meshtrain, "dgx-h100")


if __name__ == "__main__":
    sys.exit(main())
