#!/usr/bin/python3
# model_flops.py — analytic training FLOPs per token of a piper model (docs/model.md), the
# numerator of "achieved GFLOP/s" in scripts/bench.sh / docs/benchmarks.md.
#
# Usage: /usr/bin/python3 bench/model_flops.py [CONFIG.yaml] [--json] [--ops OPS_JSON [--peak TFLOPS]]
#   reads the `model:` and `train:` sections (seq_len, ssd_chunk); missing keys take piper's
#   defaults (src/config/config.hpp), which are the benchmark model. Prints FLOPs per token, or
#   with --ops each op of bench/op_bench's output with its TFLOP/s (op_flops: the same terms).
#
# Formula (training step = forward + backward, backward = 2 x forward, so everything x 3;
# a multiply-add is 2 FLOPs; only matrix products are counted — norms, activations, the
# convolution, softmax, RoPE, the optimiser and the embedding lookup are left out, as in the
# usual model-FLOPs-utilisation convention):
#
#   flops/token = 6 * N_matmul                                   (dense projections)
#               + 3 * n_attn  * 2 * 2 * H * hd * (T + 1) / 2     (causal QK^T and PV)
#               + 3 * n_mamba * ssd                              (chunked SSD products)
#
#   N_matmul = weights of every matrix product: in_proj + out_proj per 'M', q/k/v/o per '*',
#              gate/up/down per '-', top_k experts' gate/up/down + router per 'E', lm_head.
#   Attention: a query at position t attends to t + 1 keys, (T + 1) / 2 on average, for the
#              scores (2 * hd FLOPs per key and head) and again for the values.
#   SSD (chunk length L = ssd_chunk, heads Hm, head dim P, state N, groups G), per token:
#     2 * G * N * (L + 1) / 2      C B^T inside the chunk (causal half)
#     2 * Hm * P * (L + 1) / 2     the masked (C B^T * decay) matrix times X
#     2 * Hm * P * N               the chunk's final state from its inputs
#     2 * Hm * P * N / L           passing the state on to the next chunk (once per chunk)
#     2 * Hm * P * N               the carried state's contribution, C . S
import argparse
import json
import sys

DEFAULTS = {  # src/config/config.hpp (ModelConfig, TrainConfig) = the benchmark model
    "pattern": "M-M*M-M-", "vocab_size": 256, "d_model": 256, "n_heads": 8, "n_kv_heads": 4,
    "ffn_hidden": 768, "d_state": 32, "head_dim": 32, "expand": 2, "n_groups": 1, "d_conv": 4,
    "ssd_chunk": 32, "n_experts": 8, "top_k": 2, "moe_ffn_hidden": None, "seq_len": 256,
}


def plain_sections(text):
    """The `section:` blocks of indented `key: value` scalars of a piper config, for a machine without
    python3-yaml (scripts/gpu-check.sh runs on one): numbers as numbers, quoted strings unquoted."""
    doc, section = {}, None
    for raw in text.splitlines():
        line = raw.split(" #")[0].rstrip() if not raw.lstrip().startswith("#") else ""
        if not line.strip():
            continue
        key, _, value = line.strip().partition(":")
        value = value.strip()
        if not raw.startswith((" ", "\t")):
            section = key if not value else None
            doc.setdefault(key, {})
            continue
        if section is None or not value:
            continue
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            doc[section][key] = value[1:-1]
            continue
        try:
            doc[section][key] = int(value)
        except ValueError:
            try:
                doc[section][key] = float(value)
            except ValueError:
                doc[section][key] = value
    return doc


def load_config(path):
    cfg = dict(DEFAULTS)
    if path:
        with open(path) as f:
            text = f.read()
        try:
            import yaml  # python3-yaml
            doc = yaml.safe_load(text) or {}
        except ImportError:
            doc = plain_sections(text)
        for section in ("model", "train"):
            for k, v in (doc.get(section) or {}).items():
                if k in cfg:
                    cfg[k] = v
    return cfg


def attention_forward_per_token(c):
    """Causal QK^T and PV of one attention block's forward, per token."""
    H, T = c["n_heads"], c["seq_len"]
    hd = c["d_model"] // H
    return 2 * 2 * H * hd * (T + 1) / 2


def ssd_forward_per_token(c):
    """The chunked SSD products of one Mamba-2 block's forward, per token."""
    di = c["expand"] * c["d_model"]
    P, N, G, L = c["head_dim"], c["d_state"], c["n_groups"], c["ssd_chunk"]
    Hm = di // P
    Lc = min(L, c["seq_len"])
    return (2 * G * N * (Lc + 1) / 2 + 2 * Hm * P * (Lc + 1) / 2
            + 2 * Hm * P * N + 2 * Hm * P * N / Lc + 2 * Hm * P * N)


def op_flops(c, op, shape):
    """Model FLOPs of one op of bench/op_bench (its JSON line's op and shape), or None for the ops the
    convention leaves out; a backward counts twice its forward, as in flops_per_token."""
    kind = op.split(":")[0]
    if kind.startswith("linear_"):
        m, n, k = shape
        return 2 * m * n * k
    tokens = shape[0] * shape[1]
    forward = {"attention": attention_forward_per_token, "ssd": ssd_forward_per_token}.get(kind.rsplit("_", 1)[0])
    if forward is None:
        return None
    return tokens * forward(c) * (2 if kind.endswith("_bwd") else 1)


def flops_per_token(c):
    D, V = c["d_model"], c["vocab_size"]
    H, KV = c["n_heads"], c["n_kv_heads"]
    hd = D // H
    di = c["expand"] * D
    P, N, G = c["head_dim"], c["d_state"], c["n_groups"]
    Hm = di // P
    Fh = c["ffn_hidden"]
    Fe = c["moe_ffn_hidden"] or Fh
    per_block = {
        "M": (2 * di + 2 * G * N + Hm) * D + D * di,
        "*": H * hd * D + 2 * KV * hd * D + D * H * hd,
        "-": 3 * Fh * D,
        "E": c["top_k"] * 3 * Fe * D + c["n_experts"] * D,
    }
    pattern = c["pattern"]
    n_matmul = sum(per_block[s] for s in pattern) + V * D
    parts = {
        "dense": 6 * n_matmul,
        "attention": 3 * pattern.count("*") * attention_forward_per_token(c),
        "ssd": 3 * pattern.count("M") * ssd_forward_per_token(c),
    }
    return {"flops_per_token": sum(parts.values()), "matmul_params": n_matmul, **parts}


def main():
    ap = argparse.ArgumentParser(description="training FLOPs per token of a piper model")
    ap.add_argument("config", nargs="?", help="piper YAML config (default: the benchmark model)")
    ap.add_argument("--json", action="store_true", help="print the breakdown as JSON")
    ap.add_argument("--ops", metavar="OPS_JSON", help="bench/op_bench's lines for the config: print each op's "
                    "time and TFLOP/s (model FLOPs) against --peak")
    ap.add_argument("--peak", type=float, default=989.4, help="TFLOP/s the --ops percentages are of")
    a = ap.parse_args()
    c = load_config(a.config)
    if a.ops:
        for line in open(a.ops):
            if not line.startswith("{"):
                continue
            r = json.loads(line)
            f = op_flops(c, r["op"], r["shape"])
            rate = "" if f is None else f", {f / r['median_ms'] / 1e9:.1f} TFLOP/s = {f / r['median_ms'] / 1e7 / a.peak:.1f}%"
            print(f"op {r['op']} ({r['storage']}, {'x'.join(map(str, r['shape']))}): {r['median_ms']:.3f} ms{rate}")
        return
    r = flops_per_token(c)
    if a.json:
        print(json.dumps(r))
    else:
        print(f"{r['flops_per_token']:.0f}")


if __name__ == "__main__":
    sys.exit(main())
