#!/usr/bin/env python3
"""What each communication and memory optimization of issue 14 is worth,
simulated (`meshtrain simulate --steady-state --json`), and the published
measurements it can be held against.

    experiments/whatif/comm_memory_whatif.py --meshtrain build-dev/engine/meshtrain \
        [--study workloads|offload|onebit|all] [--workload NAME ...] [--save results.json]

Prints markdown tables. Every row is one `simulate` run with the built-in
constants (simulator/constants.h: one calibration for all rows) and
--steady-state (the second of two iterations, so what --overlap-update
moves under the next step's forward shows). Columns:

  iteration s   iteration_time_s
  exposed comm  exposed_comm_s: per pipeline stage, the compute stream's busy
                time minus its full-speed compute (communication the compute
                stream issues and waits for, plus the slowdown of concurrent
                traffic), mean over stages
  idle s        bubble_fraction · iteration: the compute stream neither
                computing nor communicating (pipeline bubble and waits for the
                data-parallel stream), mean over stages
  peak GiB      peak_memory_bytes: device memory of the busiest rank
  host GiB      the largest stages[].host_peak_memory_bytes (offload only)
  sent GiB      sent_bytes: bytes all ranks put on the wire in the iteration

Δ columns are against the baseline of the same ZeRO stage.

The published comparisons use cluster files under clusters/ (no V100 preset
exists): dgx2-v100.json (one DGX-2: V100-SXM3-32GB at 125 TFLOP/s fp16,
15.7 fp32, 900 GB/s HBM2, NVLink 150 GB/s per direction, PCIe Gen3 16 GB/s,
8 x 100 Gb/s EDR for 16 GPUs = 50 Gb/s each: NVIDIA V100 datasheet, DGX-2
datasheet), v100-40gbe.json (4 V100 per node on 40 Gb Ethernet, split into
four 10 Gb/s rails, one switch; Tang et al. 2021 and DeepSpeed's 1-bit Adam
post) and v100-40gbe-iperf.json (the same at the 4.1 Gb/s per node that post
measured with iperf: 1.114 Gb/s per rail before the sim's 0.92 network share).
RESULTS.md ("What each optimization is worth") lists every assumption. An option that
the plan validation refuses for that stage is printed as n/a with the
reason (the engine's own message, shortened).
"""
import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import tempfile
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
CLUSTERS = os.path.join(HERE, "clusters")
GiB = 2.0**30

# The four workloads of the issue. Each plan is a published one; `zero` lists
# the ZeRO stages simulated (ZeRO 1 = Megatron's distributed optimizer, the
# plans' own; ZeRO 3 = FSDP-style, where the ZeRO-3-only options apply).
WORKLOADS = {
    "gpt3-175b": {
        "title": "gpt3-175b on 1024 A100 (dgx-a100): tp 8, pp 16 · vpp 2 interleaved, dp 8, mb 1, global batch 1536",
        "source": "Narayanan et al. 2021, Table 1 (175B row: tp 8, pp 16, 1024 GPUs, batch 1536); the plan of "
                  "the earlier issue-14 tables (overlap.sh), flash attention and bf16 as simulate's defaults",
        "args": ["--model", "gpt3-175b", "--cluster", "dgx-a100", "--gpus", "1024", "--tp", "8", "--pp", "16",
                 "--dp", "8", "--micro-batch", "1", "--global-batch", "1536", "--schedule", "interleaved",
                 "--vpp", "2", "--recompute", "full"],
    },
    "llama3-70b": {
        "title": "llama3-70b on 512 H100 (dgx-h100): tp 4, cp 2, pp 4 · vpp 5 interleaved, dp 16, SP, "
                 "seq 8192, mb 1, global batch 512",
        "source": "NVIDIA NeMo's Llama 3 70B pre-training recipe (nemo/collections/llm/recipes/llama3_70b.py, "
                  "pretrain_recipe: TP 4, PP 4, VP 5, CP 2, sequence parallel, seq 8192, GBS 512, MBS 1, "
                  "distributed fused Adam)",
        "args": ["--model", "llama3-70b", "--cluster", "dgx-h100", "--gpus", "512", "--tp", "4", "--cp", "2",
                 "--pp", "4", "--vpp", "5", "--schedule", "interleaved", "--sequence-parallel", "--seq-len",
                 "8192", "--micro-batch", "1", "--global-batch", "512"],
    },
    "swin-b-1024": {
        "title": "Swin-B at 1024² (window 16) on 64 A100 (dgx-a100): dp 64, mb 1, global batch 64",
        "source": "the Swin-B 1024² study of issue 13 (RESULTS.md, experiments/segments/swin-b-1024.json), its "
                  "64-GPU data-parallel row, where the gradient reduction over 8 nodes dominates",
        "args": ["--model", os.path.join(os.path.dirname(HERE), "segments", "swin-b-1024.json"), "--cluster",
                 "dgx-a100", "--gpus", "64", "--dp", "64", "--micro-batch", "1", "--global-batch", "64"],
    },
    "mixtral-8x7b": {
        "title": "mixtral-8x7b on 64 H100 (dgx-h100): tp 1, pp 4 · vpp 8 interleaved, dp 16, ep 8, SP, seq 4096, "
                 "mb 1, global batch 256",
        "source": "Megatron-Core MoE README (v0.9), 'Reference Best Parallel Mapping', Mixtral 8x7B row "
                  "(experiments/validation/megatron_core_moe_mixtral.json)",
        "args": ["--model", "mixtral-8x7b", "--cluster", "dgx-h100", "--gpus", "64", "--tp", "1", "--pp", "4",
                 "--vpp", "8", "--ep", "8", "--schedule", "interleaved", "--sequence-parallel", "--seq-len", "4096",
                 "--micro-batch", "1", "--global-batch", "256", "--grad-bucket-mb", "160"],
    },
}

def flag_row(*flags):
    """A (label, flags) row labelled with its own flags."""
    return (" ".join(flags), list(flags))


# The switches both ZeRO stages try: gradient compression and reduce-once, then
# the overlapped update and the offloads.
COMPRESSION_ROWS = [flag_row("--grad-compression", c) for c in ("bf16", "fp16", "1bit")] + [
    flag_row("--zero-reduce-once")
]
UPDATE_ROWS = [flag_row("--overlap-update"), flag_row("--offload", "optimizer"), flag_row("--offload", "params")]

# (label, flags) per ZeRO stage; the first row of each stage is its baseline.
ROWS = {
    1: [
        ("baseline", []),
        *COMPRESSION_ROWS,
        ("--no-prefetch-across-chunks", None),
        *UPDATE_ROWS,
        ("combined: 1bit + --overlap-update", ["--grad-compression", "1bit", "--overlap-update"]),
        ("combined: 1bit + --offload optimizer", ["--grad-compression", "1bit", "--offload", "optimizer"]),
    ],
    3: [
        ("baseline (prefetch across chunks: the default)", []),
        *COMPRESSION_ROWS,
        flag_row("--no-prefetch-across-chunks"),
        *UPDATE_ROWS,
        ("combined: bf16 + --zero-reduce-once + --overlap-update",
         ["--grad-compression", "bf16", "--zero-reduce-once", "--overlap-update"]),
        ("combined: bf16 + --zero-reduce-once + --offload params",
         ["--grad-compression", "bf16", "--zero-reduce-once", "--offload", "params"]),
    ],
}
NOT_AN_OPTION = "n/a: no such switch; ZeRO 1 gathers no parameters, so there is nothing to prefetch"


CACHE_FILE = None
CACHED_ONLY = False
CACHE_LOCK = threading.Lock()
CACHE = {}  # command line (JSON files named by their content, not their path) -> result; see --cache


def cache_key(args):
    key = []
    for a in args:
        if a.endswith(".json") and os.path.isfile(a):
            with open(a) as f:
                a = f.read().strip()
        key.append(a)
    return json.dumps(key)


def simulate(meshtrain, args):
    key = cache_key(args)
    if key in CACHE:
        return CACHE[key]
    if CACHED_ONLY:
        return {"error": "not simulated in this session (--cached-only)", "args": args}
    cmd = [meshtrain, "simulate", "--json"] + args
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        msg = (r.stderr or r.stdout).strip().splitlines()[-1]
        out = {"error": msg.replace("meshtrain simulate: error: ", "")}
    else:
        out = json.loads(r.stdout)
    out["args"] = args
    with CACHE_LOCK:
        CACHE[key] = out
        if CACHE_FILE:
            with open(CACHE_FILE, "w") as f:
                json.dump(CACHE, f)
    print(f"  {'error' if 'error' in out else round(out['iteration_time_s'], 3)}: {' '.join(args)}",
          file=sys.stderr, flush=True)
    return out


def run_all(meshtrain, jobs, runs):
    """runs: {key: args}; simulates them (jobs at a time) and returns {key: result}."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {key: pool.submit(simulate, meshtrain, args) for key, args in runs.items()}
        return {key: f.result() for key, f in futures.items()}


def host_peak(j):
    return max((s.get("host_peak_memory_bytes", 0) for s in j["stages"]), default=0)


def short_reason(msg):
    """The engine's refusal, cut to the clause naming what was refused (the full text is in --save)."""
    if msg.startswith("plan for model"):  # "plan for model 'm': <option> needs ..., got ...: <why>; <fix>"
        return msg.split(": ", 1)[1].split(": ")[0]
    if "out of memory" in msg and " peaks at " in msg:
        return "out of memory: peaks at " + msg.split(" peaks at ", 1)[1].split(". ")[0]
    return msg


def workload_table(name, results):
    w = WORKLOADS[name]
    lines = [f"#### {w['title']}", "", f"Plan: {w['source']}.", "",
             "| ZeRO | option | iteration s | Δ iteration | exposed comm s | idle s | peak GiB | Δ peak GiB | "
             "host GiB | sent GiB |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for zero, rows in ROWS.items():
        base = results.get((name, zero, 0))
        for i, (label, flags) in enumerate(rows):
            if flags is None:
                lines.append(f"| {zero} | {label} | {NOT_AN_OPTION} | | | | | | | |")
                continue
            j = results[(name, zero, i)]
            if "error" in j:
                lines.append(f"| {zero} | {label} | n/a: {short_reason(j['error'])} | | | | | | | |")
                continue
            t, peak = j["iteration_time_s"], j["peak_memory_bytes"] / GiB
            d_t = d_m = "-"
            if i > 0 and base and "error" not in base:
                bt, bm = base["iteration_time_s"], base["peak_memory_bytes"] / GiB
                d_t = f"{(t - bt):+.3f} s ({100 * (t / bt - 1):+.1f}%)"
                d_m = f"{peak - bm:+.2f}"
            hp = host_peak(j)
            host = f"{hp / GiB:.1f}" if hp else "-"
            lines.append(f"| {zero} | {label} | {t:.3f} | {d_t} | {j['exposed_comm_s']:.3f} | "
                         f"{j['bubble_fraction'] * t:.3f} | {peak:.2f} | {d_m} | {host} | {j['sent_bytes'] / GiB:.0f} |")
    return "\n".join(lines)


def workloads(meshtrain, jobs, names):
    runs = {}
    for name in names:
        for zero, rows in ROWS.items():
            for i, (_, flags) in enumerate(rows):
                if flags is not None:
                    runs[(name, zero, i)] = WORKLOADS[name]["args"] + ["--zero", str(zero), "--steady-state"] + flags
    results = run_all(meshtrain, jobs, runs)
    for name in names:
        print("\n" + workload_table(name, results) + "\n")
    return results


# ---- ZeRO-Offload (Ren et al., USENIX ATC 2021) -------------------------------------------------------------
# GPT-2-shaped models of hidden 4096 and 32 heads (the 10B model of DeepSpeed's ZeRO-Offload tutorial is 50 such
# layers), sequences of 1024, fp16, full recomputation, micro-batch 10 (the tutorial's batch), on one V100-32GB.
def gpt2_4096(layers, tmpdir):
    path = os.path.join(tmpdir, f"gpt2-4096x{layers}.json")
    with open(path, "w") as f:
        json.dump({"name": f"gpt2-4096x{layers}", "layers": layers, "hidden": 4096, "heads": 32, "vocab": 50257,
                   "seq_len": 1024}, f)
    return path


def params_of(meshtrain, model):
    r = subprocess.run([meshtrain, "info", "--model", model, "--json"], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"meshtrain info --model {model}: {(r.stderr or r.stdout).strip()}")
    return json.loads(r.stdout)["parameters"]


def offload(meshtrain, jobs):
    cluster = os.path.join(CLUSTERS, "dgx2-v100.json")
    common = ["--cluster", cluster, "--gpus", "1", "--precision", "fp16", "--recompute", "full",
              "--micro-batch", "10", "--global-batch", "10", "--zero", "0"]
    layer_counts = list(range(1, 61))
    with tempfile.TemporaryDirectory() as tmp:
        runs = {}
        for layers in layer_counts:
            model = gpt2_4096(layers, tmp)
            runs[("none", layers)] = ["--model", model] + common
            runs[("optimizer", layers)] = ["--model", model] + common + ["--offload", "optimizer"]
        # The tutorial's 10B model, timed as if it fitted.
        runs[("optimizer, --ignore-memory", 50)] = ["--model", gpt2_4096(50, tmp)] + common + [
            "--offload", "optimizer", "--ignore-memory"]
        results = run_all(meshtrain, jobs, runs)
        shown = []
        for mode in ("none", "optimizer"):
            fitting = [l for l in layer_counts if "error" not in results[(mode, l)]]
            if fitting:
                shown.append((mode, max(fitting)))
            if len(fitting) < len(layer_counts):
                shown.append((mode, min(l for l in layer_counts if l not in fitting)))
        shown.append(("optimizer, --ignore-memory", 50))
        params = {layers: params_of(meshtrain, gpt2_4096(layers, tmp)) for _, layers in shown}
    print("\n#### ZeRO-Offload: the largest GPT-2 (hidden 4096) on one V100-32GB, and its throughput\n")
    print("| offload | layers | parameters | device peak GiB | host GiB | iteration s | model TFLOP/s | fits |")
    print("|---|---|---|---|---|---|---|---|")
    for mode, layers in shown:
        j = results[(mode, layers)]
        p = f"{params[layers] / 1e9:.2f}B"
        if "error" in j:
            print(f"| {mode} | {layers} | {p} | - | - | - | - | no: {short_reason(j['error'])} |")
            continue
        fits = j["peak_memory_bytes"] <= j["device_memory_bytes"]
        print(f"| {mode} | {layers} | {p} | {j['peak_memory_bytes'] / GiB:.1f} | {host_peak(j) / GiB:.1f} | "
              f"{j['iteration_time_s']:.2f} | {j['tflops_per_gpu']:.1f} | {'yes' if fits else 'no'} |")
    return {f"{k[0]}:{k[1]}": v for k, v in results.items()}


# ---- 1-bit Adam (Tang et al., ICML 2021) ---------------------------------------------------------------------
# BERT-Large's dimensions (24 layers, hidden 1024, 16 heads, vocabulary 30522) as a decoder, sequences of 128
# (pre-training phase 1), 16 sequences per GPU (the blog's Figure 3), pure data parallelism, fp16.
BERT_LARGE = {"name": "bert-large-dims", "layers": 24, "hidden": 1024, "heads": 16, "ffn": 4096, "vocab": 30522,
              "seq_len": 128}


def onebit(meshtrain, jobs):
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "bert-large-dims.json")
        with open(model, "w") as f:
            json.dump(BERT_LARGE, f)
        runs = {}
        for cluster in ("v100-40gbe", "v100-40gbe-iperf"):
            for gpus in (16, 32, 64):
                for comp in ("none", "fp16", "1bit"):
                    runs[(cluster, gpus, comp)] = [
                        "--model", model, "--cluster", os.path.join(CLUSTERS, cluster + ".json"), "--gpus",
                        str(gpus), "--dp", str(gpus), "--micro-batch", "16", "--global-batch", str(16 * gpus),
                        "--precision", "fp16", "--zero", "0", "--grad-compression", comp, "--steady-state"]
        results = run_all(meshtrain, jobs, runs)
    print("\n#### 1-bit Adam: BERT-Large dimensions, 16 sequences of 128 per GPU, data parallel, 4 V100 per node\n")
    print("| cluster | GPUs | gradients on the wire | iteration s | exposed comm s | idle s | sent GiB | "
          "speed-up vs fp16 | end to end with 15% warm-up |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (cluster, gpus, comp), j in results.items():
        if "error" in j:
            print(f"| {cluster} | {gpus} | {comp} | n/a: {short_reason(j['error'])} | | | | | |")
            continue
        t = j["iteration_time_s"]
        ref = results[(cluster, gpus, "fp16")]
        s = ref["iteration_time_s"] / t if "error" not in ref else None
        e2e = 1 / (0.15 + 0.85 / s) if s else None
        print(f"| {cluster} | {gpus} | {comp} | {t:.3f} | {j['exposed_comm_s']:.3f} | "
              f"{j['bubble_fraction'] * t:.3f} | {j['sent_bytes'] / GiB:.2f} | "
              f"{f'{s:.2f}x' if s else '-'} | {f'{e2e:.2f}x' if comp == '1bit' and e2e else '-'} |")
    return {f"{k[0]}:{k[1]}:{k[2]}": v for k, v in results.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--meshtrain", default="build-dev/engine/meshtrain")
    ap.add_argument("--study", choices=["workloads", "offload", "onebit", "all"], default="all")
    ap.add_argument("--workload", action="append", choices=sorted(WORKLOADS), help="default: all four")
    ap.add_argument("--jobs", type=int, default=1, help="simulations at a time")
    ap.add_argument("--save", help="write every run's JSON (with its command) here")
    ap.add_argument("--cache", help="JSON file of earlier runs of the same commands, reused and extended "
                                    "(delete it after rebuilding meshtrain)")
    ap.add_argument("--cached-only", action="store_true", help="print the tables from --cache without simulating")
    a = ap.parse_args()
    if not os.access(a.meshtrain, os.X_OK):
        sys.exit(f"--meshtrain {a.meshtrain} is not an executable; build it (README) or pass its path")
    global CACHE_FILE, CACHED_ONLY
    CACHE_FILE, CACHED_ONLY = a.cache, a.cached_only
    if a.cache and os.path.exists(a.cache):
        with open(a.cache) as f:
            CACHE.update(json.load(f))
    saved = {}
    if a.study in ("workloads", "all"):
        res = workloads(a.meshtrain, a.jobs, a.workload or list(WORKLOADS))
        saved["workloads"] = {f"{k[0]}:zero{k[1]}:{k[2]}": v for k, v in res.items()}
    if a.study in ("offload", "all"):
        saved["offload"] = offload(a.meshtrain, a.jobs)
    if a.study in ("onebit", "all"):
        saved["onebit"] = onebit(a.meshtrain, a.jobs)
    if a.save:
        with open(a.save, "w") as f:
            json.dump(saved, f, indent=1)


if __name__ == "__main__":
    main()
