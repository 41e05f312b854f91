#!/usr/bin/env python3
"""Training throughput of a GPT in PyTorch on one GPU: the peer that
experiments/gpu/check.sh measures meshtrain's cuda backend against, in the
same run on the same GPU.

    torch_gpt.py --config NAME:MODEL_JSON:BATCH:SEQ:PRECISION [--config ...]
                 [--modes eager compile] [--steps 15 --warmup 5] --out FILE.jsonl

Each config runs in this one process (PyTorch is imported once), every mode
after the other, and appends one JSON line per (config, mode) to --out:
{"name", "mode", "precision", "tokens_per_s", "step_s", "steps", "peak_mem_gb"}
or {"name", "mode", "error"}. The model is meshtrain's GPT-2 layout, read
from the same model file meshtrain trains (layers, hidden, heads, vocab):
learned positions, pre-LayerNorm with biases, tanh GELU, tied head; AdamW
with meshtrain's defaults written out (betas 0.9/0.95, eps 1e-8, weight decay
0.1 on the linear weights only, fused), the gradient norm clipped to 1.0 as
meshtrain does by default. bf16: autocast over fp32 master parameters, as
meshtrain keeps fp32 masters. fp32: TF32 off for matmuls (PyTorch's default
since 1.12), which is meshtrain's fp32 too. Attention is SDPA (PyTorch picks
FlashAttention-2 or cuDNN's fused kernel on Hopper). Tokens are random ids:
throughput only, no loss is compared. A step's time is the median of the
steps after --warmup, each timed with CUDA events around the whole step.
"""
import argparse
import json
import statistics
import sys
import time


def build(torch, spec):
    nn = torch.nn
    F = torch.nn.functional
    C, H, L, V, T = spec["hidden"], spec["heads"], spec["layers"], spec["vocab"], spec["seq_len"]

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
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
            return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
            self.blocks = nn.ModuleList(Block() for _ in range(L))
            self.ln = nn.LayerNorm(C)
            self.head = nn.Linear(C, V, bias=False)
            self.head.weight = self.wte.weight

        def forward(self, idx, targets):
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
            for blk in self.blocks:
                x = blk(x)
            logits = self.head(self.ln(x))
            return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.view(-1))

    return GPT()


def run(torch, name, spec, batch, seq, precision, mode, steps, warmup):
    torch.manual_seed(0)
    model = build(torch, spec).cuda()
    decay = [p for n, p in model.named_parameters() if p.dim() == 2 and "wte" not in n and "wpe" not in n]
    rest = [p for n, p in model.named_parameters() if not (p.dim() == 2 and "wte" not in n and "wpe" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                            lr=3e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
    fwd = torch.compile(model) if mode == "compile" else model
    V = spec["vocab"]
    x = torch.randint(0, V, (batch, seq), device="cuda")
    y = torch.randint(0, V, (batch, seq), device="cuda")
    times = []
    for i in range(steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=(precision == "bf16")):
            loss = fwd(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    step = statistics.median(times[warmup:])
    return {"name": name, "mode": mode, "precision": precision, "tokens_per_s": batch * seq / step,
            "step_s": step, "steps": steps, "peak_mem_gb": torch.cuda.max_memory_allocated() / 1e9}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--config", action="append", required=True, help="NAME:MODEL_JSON:BATCH:SEQ:PRECISION")
    p.add_argument("--modes", nargs="+", default=["eager", "compile"])
    p.add_argument("--steps", type=int, default=15)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    for cfg in a.config:
        name, path, batch, seq, precision = cfg.split(":")
        spec = json.load(open(path))
        for mode in a.modes:
            t0 = time.time()
            try:
                row = run(torch, name, spec, int(batch), int(seq), precision, mode, a.steps, a.warmup)
            except Exception as e:  # one failing config must not lose the others' rows
                row = {"name": name, "mode": mode, "precision": precision, "error": repr(e)[:500]}
            row["wall_s"] = round(time.time() - t0, 1)
            print(json.dumps(row), flush=True)
            with open(a.out, "a") as f:
                f.write(json.dumps(row) + "\n")
            torch.cuda.empty_cache()
            torch._dynamo.reset()


if __name__ == "__main__":
    sys.exit(main())
