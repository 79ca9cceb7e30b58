#!/usr/bin/python3
# model_flops.py — analytic training FLOPs per token of a piper model (docs/model.md), the
# numerator of "achieved GFLOP/s" in scripts/bench.sh / docs/benchmarks.md.
#
# Usage: /usr/bin/python3 bench/model_flops.py [CONFIG.yaml] [--json]
#   reads the `model:` and `train:` sections (seq_len, ssd_chunk); missing keys take piper's
#   defaults (src/config/config.hpp), which are the benchmark model. Prints FLOPs per token.
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


def load_config(path):
    cfg = dict(DEFAULTS)
    if path:
        import yaml  # python3-yaml
        with open(path) as f:
            doc = yaml.safe_load(f) or {}
        for section in ("model", "train"):
            for k, v in (doc.get(section) or {}).items():
                if k in cfg:
                    cfg[k] = v
    return cfg


def flops_per_token(c):
    D, V, T = c["d_model"], c["vocab_size"], c["seq_len"]
    H, KV = c["n_heads"], c["n_kv_heads"]
    hd = D // H
    di = c["expand"] * D
    P, N, G, L = c["head_dim"], c["d_state"], c["n_groups"], c["ssd_chunk"]
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
    attn = 2 * 2 * H * hd * (T + 1) / 2
    Lc = min(L, T)
    ssd = (2 * G * N * (Lc + 1) / 2 + 2 * Hm * P * (Lc + 1) / 2
           + 2 * Hm * P * N + 2 * Hm * P * N / Lc + 2 * Hm * P * N)
    parts = {
        "dense": 6 * n_matmul,
        "attention": 3 * pattern.count("*") * attn,
        "ssd": 3 * pattern.count("M") * ssd,
    }
    return {"flops_per_token": sum(parts.values()), "matmul_params": n_matmul, **parts}


def main():
    ap = argparse.ArgumentParser(description="training FLOPs per token of a piper model")
    ap.add_argument("config", nargs="?", help="piper YAML config (default: the benchmark model)")
    ap.add_argument("--json", action="store_true", help="print the breakdown as JSON")
    a = ap.parse_args()
    r = flops_per_token(load_config(a.config))
    if a.json:
        print(json.dumps(r))
    else:
        print(f"{r['flops_per_token']:.0f}")


if __name__ == "__main__":
    sys.exit(main())
