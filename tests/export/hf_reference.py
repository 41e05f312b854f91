#!/usr/bin/env python3
"""meshtrain's export against a PyTorch reference model.

Usage: hf_reference.py MESHTRAIN_BIN EXPORT_LOGITS_BIN

For a GPT-2, two Llama and a Mixtral shaped model: trains a few steps with `meshtrain
train --checkpoint`, exports the checkpoint (`meshtrain export`), builds the
model that config.json describes from the Hugging Face architectures
(GPT2LMHeadModel, LlamaForCausalLM, MixtralForCausalLM; transformers itself
is not needed),
loads model.safetensors by the format's spec (8-byte header length, JSON
header, raw little-endian data), and compares its logits for one sequence
with meshtrain's (tests/export/export_logits) within fp32 tolerance; a bf16
export within bf16's. Exits 77 (CTest: Skipped) when torch is missing.
"""
import json
import math
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile

try:
    import torch
except ImportError:
    print("=" * 72)
    print(f"SKIPPED: python3-torch is not installed for {sys.executable}, so the")
    print("export is NOT compared with a PyTorch reference. Install it (Debian:")
    print("apt-get install python3-torch) and run this test again.")
    print("=" * 72)
    sys.exit(77)

FP32_TOLERANCE = 1e-4  # absolute, on logits of order 1: fp32 sums over widths of 64..256
BF16_TOLERANCE = 5e-2  # bf16 weights hold 8 significant bits


def load_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    dtypes = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        raw = bytearray(body[begin:end])
        t = torch.frombuffer(raw, dtype=dtypes[entry["dtype"]]) if raw else torch.empty(0, dtype=dtypes[entry["dtype"]])
        tensors[name] = t.reshape(entry["shape"]).to(torch.float64)
    return tensors


def causal_attention(q, k, v):
    """q (H, T, D), k and v (H, T, D): softmax(q kᵀ / √D + causal mask) v."""
    T, D = q.shape[1], q.shape[2]
    scores = q @ k.transpose(1, 2) / math.sqrt(D)
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    return torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1) @ v


def gpt2_logits(cfg, w, ids):
    """GPT2LMHeadModel.forward in eval mode (Conv1D weights are (in, out))."""
    C, H, eps = cfg["n_embd"], cfg["n_head"], cfg["layer_norm_epsilon"]
    assert cfg["activation_function"] == "gelu_new"
    T, D = len(ids), C // H
    p = "transformer."
    ln = lambda x, name: torch.nn.functional.layer_norm(x, (C,), w[name + ".weight"], w[name + ".bias"], eps)
    conv1d = lambda x, name: x @ w[name + ".weight"] + w[name + ".bias"]
    gelu_new = lambda x: 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    h = w[p + "wte.weight"][ids] + w[p + "wpe.weight"][torch.arange(T)]
    for layer in range(cfg["n_layer"]):
        b = f"{p}h.{layer}."
        q, k, v = conv1d(ln(h, b + "ln_1"), b + "attn.c_attn").split(C, dim=-1)
        heads = lambda x: x.view(T, H, D).transpose(0, 1)
        a = causal_attention(heads(q), heads(k), heads(v)).transpose(0, 1).reshape(T, C)
        h = h + conv1d(a, b + "attn.c_proj")
        h = h + conv1d(gelu_new(conv1d(ln(h, b + "ln_2"), b + "mlp.c_fc")), b + "mlp.c_proj")
    head = w[p + "wte.weight"] if cfg["tie_word_embeddings"] else w["lm_head.weight"]
    return ln(h, p + "ln_f") @ head.T


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def swiglu(x, w1, w3, w2):
    return (torch.nn.functional.silu(x @ w1.T) * (x @ w3.T)) @ w2.T


def mixtral_moe(x, w, b, cfg):
    """MixtralSparseMoeBlock: softmax over the experts, the top k renormalised, their SwiGLUs summed."""
    moe = b + "block_sparse_moe."
    probs = torch.softmax(x @ w[moe + "gate.weight"].T, dim=-1)
    weights, experts = torch.topk(probs, cfg["num_experts_per_tok"], dim=-1)
    weights = weights / weights.sum(dim=-1, keepdim=True)
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for k in range(experts.shape[1]):
            e = f"{moe}experts.{experts[t, k].item()}."
            out[t] += weights[t, k] * swiglu(x[t], w[e + "w1.weight"], w[e + "w3.weight"], w[e + "w2.weight"])
    return out


def llama_logits(cfg, w, ids):
    """LlamaForCausalLM / MixtralForCausalLM.forward in eval mode (nn.Linear weights are (out, in))."""
    C, H, G = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    D = cfg.get("head_dim", C // H)
    T, eps = len(ids), cfg["rms_norm_eps"]
    assert cfg["hidden_act"] == "silu" and cfg.get("rope_scaling") is None

    def rms(x, name):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w[name + ".weight"]

    def linear(x, name):
        y = x @ w[name + ".weight"].T
        return y + w[name + ".bias"] if name + ".bias" in w else y

    inv_freq = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    rope = lambda x: x * cos + rotate_half(x) * sin
    h = w["model.embed_tokens.weight"][ids]
    for layer in range(cfg["num_hidden_layers"]):
        b = f"model.layers.{layer}."
        x = rms(h, b + "input_layernorm")
        q = linear(x, b + "self_attn.q_proj").view(T, H, D).transpose(0, 1)
        k = linear(x, b + "self_attn.k_proj").view(T, G, D).transpose(0, 1)
        v = linear(x, b + "self_attn.v_proj").view(T, G, D).transpose(0, 1)
        q, k = rope(q), rope(k)
        k, v = k.repeat_interleave(H // G, dim=0), v.repeat_interleave(H // G, dim=0)
        a = causal_attention(q, k, v).transpose(0, 1).reshape(T, H * D)
        h = h + linear(a, b + "self_attn.o_proj")
        x = rms(h, b + "post_attention_layernorm")
        if cfg["model_type"] == "mixtral":
            h = h + mixtral_moe(x, w, b, cfg)
            continue
        gate = linear(x, b + "mlp.gate_proj")
        h = h + linear(torch.nn.functional.silu(gate) * linear(x, b + "mlp.up_proj"), b + "mlp.down_proj")
    head = w["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else w["lm_head.weight"]
    return rms(h, "model.norm") @ head.T


def reference_logits(export_dir, file_name, ids):
    with open(os.path.join(export_dir, "config.json")) as f:
        cfg = json.load(f)
    w = load_safetensors(os.path.join(export_dir, file_name))
    build = {"gpt2": gpt2_logits, "llama": llama_logits, "mixtral": llama_logits}[cfg["model_type"]]
    return build(cfg, w, torch.tensor(ids)), cfg


def run(*args):
    r = subprocess.run([str(a) for a in args], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"FAILED: {' '.join(map(str, args))}\n{r.stdout}{r.stderr}")
    return r.stdout


def check(name, model, meshtrain, export_logits, work, data, tokens):
    ckpt, out, out16 = (os.path.join(work, name + s) for s in ("-ckpt", "-hf", "-hf-bf16"))
    run(meshtrain, "train", "--model", model, "--data", data, "--steps", 3, "--micro-batch", 2, "--seq-len", 32,
        "--lr", 3e-3, "--seed", 5, "--checkpoint", ckpt, "--quiet")
    run(meshtrain, "export", "--checkpoint", ckpt, "--format", "safetensors", "--out", out)
    run(meshtrain, "export", "--checkpoint", ckpt, "--out", os.path.join(out16, "weights.safetensors"), "--dtype", "bf16")
    tokens_file, logits_file = os.path.join(work, "tokens.txt"), os.path.join(work, name + "-logits.bin")
    with open(tokens_file, "w") as f:
        f.write(" ".join(map(str, tokens)))
    loss = float(run(export_logits, ckpt, tokens_file, logits_file).split()[1])
    ids, targets = tokens[:-1], torch.tensor(tokens[1:])
    ours = torch.frombuffer(bytearray(open(logits_file, "rb").read()), dtype=torch.float32).to(torch.float64)
    ref, cfg = reference_logits(out, "model.safetensors", ids)
    ours = ours.reshape(ref.shape)
    diff = (ours - ref).abs().max().item()
    ref_loss = torch.nn.functional.cross_entropy(ref, targets).item()
    ref16, cfg16 = reference_logits(out16, "weights.safetensors", ids)
    diff16 = (ours - ref16).abs().max().item()
    print(f"{name}: {cfg['model_type']} logits {tuple(ref.shape)}, max |meshtrain - torch| {diff:.3g} "
          f"(fp32 export), {diff16:.3g} (bf16 export, torch_dtype {cfg16['torch_dtype']}); "
          f"loss meshtrain {loss:.6f}, torch {ref_loss:.6f}")
    problems = []
    if not diff <= FP32_TOLERANCE:
        problems.append(f"{name}: fp32 logits differ by {diff:.3g} > {FP32_TOLERANCE}")
    if not abs(loss - ref_loss) <= FP32_TOLERANCE:
        problems.append(f"{name}: loss {loss} vs torch {ref_loss}")
    if not 0 < diff16 <= BF16_TOLERANCE:
        problems.append(f"{name}: bf16 logits differ by {diff16:.3g}, expected within (0, {BF16_TOLERANCE}]")
    return problems


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    meshtrain, export_logits = sys.argv[1], sys.argv[2]
    work = tempfile.mkdtemp(prefix="meshtrain-export-")
    try:
        rng = random.Random(1)
        data = os.path.join(work, "data.txt")
        text = " ".join(rng.choice(["the", "cat", "sat", "on", "a", "mat", "and", "then", "slept"]) for _ in range(4000))
        with open(data, "w") as f:
            f.write(text)
        tokens = list(text.encode()[:33])
        llama = {"name": "ref-llama", "layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn": 96, "vocab": 256,
                 "seq_len": 64, "tied_embeddings": False, "bias": False, "norm": "rmsnorm", "activation": "swiglu",
                 "position": "rope", "rope_theta": 10000.0, "norm_eps": 1e-5}
        # Llama with biases (attention_bias, mlp_bias) and a tied head: the q/k bias permutation too.
        llama_bias = dict(llama, name="ref-llama-bias", bias=True, tied_embeddings=True, kv_heads=4)
        mixtral = dict(llama, name="ref-mixtral", ffn=32, experts=4, top_k=2)
        problems = []
        for spec in (llama, llama_bias, mixtral):
            with open(os.path.join(work, spec["name"] + ".json"), "w") as f:
                json.dump(spec, f)
        models = [("gpt2", "tiny")] + [(s["name"], os.path.join(work, s["name"] + ".json")) for s in (llama, llama_bias, mixtral)]
        for name, model in models:
            problems += check(name, model, meshtrain, export_logits, work, data, tokens)
        if problems:
            sys.exit("FAILED:\n" + "\n".join(problems))
        print("all exports match the PyTorch reference")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
