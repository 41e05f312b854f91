#!/usr/bin/env python3
"""One training step of the same model, meshtrain's cpu backend against PyTorch, on the same cores.

    experiments/bench/torch_side_by_side.py --meshtrain build/engine/meshtrain \\
        [--batch 4 --seq 64] [--cores 1 all] [--rounds 3] [--steps 6 --warmup 2] \\
        [--blas-kernels env|auto|NAME] [--json FILE]

The model is GPT-2 124M's shape with a vocabulary of 256 (gpt2-124m-v256.json
beside this script: 12 layers, width 768, 12 heads, learned positions, tied
head, tanh GELU), fp32, no dropout, AdamW (betas 0.9/0.95, eps 1e-8, weight
decay 0.1 on the linear weights only, as meshtrain's default) after clipping
the gradient norm to 1.0: meshtrain's defaults, written out for PyTorch.

For each core set (`--cores 1 all`: the first core, then every core this
process may use), each round runs meshtrain once and then each PyTorch
configuration once, every run a fresh process pinned to those cores with
taskset, timing --steps steps; a run's time is the median of its steps after
--warmup. PyTorch's configurations (torch_configs): intra-op threads
(torch.set_num_threads, OMP_NUM_THREADS) and OpenBLAS threads
(OPENBLAS_NUM_THREADS) both the cores, the same with OMP_WAIT_POLICY=passive
(on a loaded machine spinning OpenMP threads cost PyTorch up to 4x), and
intra-op threads 1 with OpenBLAS threads the cores; AdamW with foreach=True,
and the last also with the default per-parameter loop. The ratio of a round
is the fastest configuration's time over meshtrain's, measured minutes
apart at most. meshtrain's time to first step (launch to the end of step 1) and its
start-up (that, less step 1) are reported too.

Both use OpenBLAS, which picks its kernels for the CPU when it loads unless
OPENBLAS_CORETYPE names them. --blas-kernels env (the default) keeps the
environment as it is, auto removes OPENBLAS_CORETYPE (OpenBLAS's own
choice), NAME sets it (e.g. Haswell, SkylakeX); either way for both sides.

Needs PyTorch; it installs nothing. Debian: `apt-get install python3-torch`
(1.13, with OpenBLAS as its BLAS, as meshtrain's); a pip wheel works as well.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL = os.path.join(HERE, "gpt2-124m-v256.json")


# ---- the PyTorch side (run in a child process: --torch-worker) ----------------------------

def torch_worker(a):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.set_num_threads(a.threads)
    spec = json.load(open(MODEL))
    C, H, L, V, TMAX = spec["hidden"], spec["heads"], spec["layers"], spec["vocab"], spec["seq_len"]

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
            self.qkv, self.proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
            self.fc, self.out = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
            q, k, v = (z.view(b, t, H, c // H).transpose(1, 2) for z in (q, k, v))
            att = (q @ k.transpose(-2, -1)) * (1.0 / (c // H) ** 0.5)  # torch 1.13: no fused attention
            mask = torch.ones(t, t, dtype=torch.bool).tril()
            att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
            y = (att @ v).transpose(1, 2).reshape(b, t, c)
            x = x + self.proj(y)
            return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(TMAX, C)
            self.blocks = nn.ModuleList(Block() for _ in range(L))
            self.ln = nn.LayerNorm(C)
            self.head = nn.Linear(C, V, bias=False)
            self.head.weight = self.wte.weight

        def forward(self, idx, targets):
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
            for blk in self.blocks:
                x = blk(x)
            logits = self.head(self.ln(x))
            return F.cross_entropy(logits.view(-1, V), targets.view(-1))

    torch.manual_seed(0)
    model = GPT()
    decay = [p for n, p in model.named_parameters() if p.dim() == 2 and not n.startswith("w")]
    other = [p for n, p in model.named_parameters() if not (p.dim() == 2 and not n.startswith("w"))]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                            lr=1e-4, betas=(0.9, 0.95), eps=1e-8, foreach=a.foreach)
    x = torch.randint(0, V, (a.batch, a.seq))
    y = torch.randint(0, V, (a.batch, a.seq))
    times = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    print(json.dumps({"step_times": times, "loss": float(loss)}))


# ---- the driver ------------------------------------------------------------------------------

def blas_env(a, env=None):
    """The environment of both sides' runs: OPENBLAS_CORETYPE as --blas-kernels says."""
    env = dict(env or os.environ)
    if a.blas_kernels == "auto":
        env.pop("OPENBLAS_CORETYPE", None)
    elif a.blas_kernels != "env":
        env["OPENBLAS_CORETYPE"] = a.blas_kernels
    return env


def pinned(cores, cmd, env=None):
    return subprocess.run(["taskset", "-c", cores] + cmd, capture_output=True, text=True, env=env)


def run_meshtrain(a, cores, data, tmp):
    metrics = os.path.join(tmp, "metrics.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    cmd = ["taskset", "-c", cores, a.meshtrain, "train", "--model", MODEL, "--data", data, "--steps", str(a.steps),
           "--warmup", "0", "--micro-batch", str(a.batch), "--seq-len", str(a.seq), "--metrics", metrics]
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=blas_env(a))
    first = None
    for line in p.stdout:
        if first is None and line.startswith("step 1/"):
            first = time.perf_counter() - t0
    err = p.stderr.read()
    if p.wait() != 0:
        sys.exit(f"meshtrain failed: {err}")
    steps = [json.loads(line)["step_time_s"] for line in open(metrics)]
    return {"time": statistics.median(steps[a.warmup:]), "steps": steps, "first_step_done_s": first,
            "startup_s": first - steps[0]}


def torch_configs(n):
    """(name, intra-op threads, OpenBLAS threads, foreach, extra environment) for n cores."""
    configs = [("omp%d-blas%d" % (n, n), n, n, True, {}),
               ("omp%d-blas%d-passive" % (n, n), n, n, True, {"OMP_WAIT_POLICY": "passive"}),
               ("omp1-blas%d" % n, 1, n, True, {}),
               ("omp1-blas%d-loop" % n, 1, n, False, {})]
    return [c for i, c in enumerate(configs) if n > 1 or i in (0, 3)]


def run_torch(a, cores, config):
    _, threads, blas, foreach, extra = config
    env = dict(blas_env(a), OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(blas),
               MKL_NUM_THREADS=str(blas), **extra)
    p = pinned(cores, [a.python, os.path.abspath(__file__), "--torch-worker", "--threads", str(threads),
                       "--batch", str(a.batch), "--seq", str(a.seq), "--steps", str(a.steps)]
               + (["--foreach"] if foreach else []), env)
    if p.returncode != 0:
        sys.exit(f"the PyTorch run failed:\n{p.stderr}")
    steps = json.loads(p.stdout.strip().splitlines()[-1])["step_times"]
    return {"time": statistics.median(steps[a.warmup:]), "steps": steps}


def write_data(path):
    # Any bytes are tokens: the project's own text, repeated past 2 MB.
    text = b""
    for name in ("README.md", "experiments/RESULTS.md"):
        try:
            text += open(os.path.join(HERE, "..", "..", name), "rb").read()
        except OSError:
            pass
    text = text or bytes(range(256))
    with open(path, "wb") as f:
        f.write(text * (2_000_000 // len(text) + 1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--meshtrain", help="the meshtrain binary")
    ap.add_argument("--python", help="the Python that has torch (default: this one, else Debian's /usr/bin/python3)")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--cores", nargs="+", default=["1", "all"], help="core counts to pin to (all: every core)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2, help="steps left out of each run's median")
    ap.add_argument("--blas-kernels", default="env",
                    help="OPENBLAS_CORETYPE of both sides: env (as it is), auto (unset), or a name")
    ap.add_argument("--json", help="write every measurement here")
    ap.add_argument("--torch-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--foreach", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.torch_worker:
        return torch_worker(a)
    if not a.meshtrain:
        ap.error("--meshtrain is required")
    # Debian's python3-torch is in /usr/bin/python3's packages, which a virtual environment or pyenv hides.
    for a.python in [a.python] if a.python else [sys.executable, "/usr/bin/python3"]:
        probe = subprocess.run([a.python, "-c", "import torch; print(torch.__version__)"], capture_output=True,
                               text=True)
        if probe.returncode == 0:
            break
    else:
        sys.exit(f"{a.python} cannot import torch; install it (Debian: apt-get install python3-torch) "
                 "or pass --python")
    allowed = sorted(os.sched_getaffinity(0))
    load = os.getloadavg()
    kernels = blas_env(a).get("OPENBLAS_CORETYPE", "OpenBLAS's choice")
    print(f"PyTorch {probe.stdout.strip()}, {len(allowed)} cores, load average {load[0]:.2f} {load[1]:.2f} "
          f"{load[2]:.2f}, B={a.batch} T={a.seq}, {a.steps} steps per run (median after {a.warmup}), "
          f"OpenBLAS kernels: {kernels}")
    results = {"batch": a.batch, "seq": a.seq, "torch": probe.stdout.strip(), "load_before": load,
               "blas_kernels": kernels, "cores": {}}
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "data.txt")
        write_data(data)
        for c in a.cores:
            n = len(allowed) if c == "all" else int(c)
            cores = ",".join(str(x) for x in allowed[:n])
            rows = []
            for r in range(a.rounds):
                m = run_meshtrain(a, cores, data, tmp)
                t = {c[0]: run_torch(a, cores, c) for c in torch_configs(n)}
                best = min(t, key=lambda k: t[k]["time"])
                ratio = t[best]["time"] / m["time"]
                rows.append({"meshtrain": m, "torch": t, "best_torch": best, "ratio": ratio})
                print(f"{n} core(s) round {r + 1}: meshtrain {m['time']:.3f} s/step (first step done at "
                      f"{m['first_step_done_s']:.2f} s, start-up {m['startup_s']:.2f} s), PyTorch "
                      + ", ".join(f"{k} {v['time']:.3f}" for k, v in t.items())
                      + f" s/step: ratio {ratio:.2f}", flush=True)
            ratios = [row["ratio"] for row in rows]
            print(f"{n} core(s): PyTorch's best / meshtrain = {statistics.median(ratios):.2f} "
                  f"(median of {len(ratios)} rounds; {min(ratios):.2f}-{max(ratios):.2f})")
            results["cores"][str(n)] = rows
    results["load_after"] = os.getloadavg()
    print(f"load average after: {results['load_after'][0]:.2f}")
    if a.json:
        json.dump(results, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
