#!/usr/bin/python3
# torch_peer.py — the PyTorch eager peer of piper: exactly the model of docs/model.md
# in plain torch, float32, trained with torch.optim.AdamW. Two jobs:
#   --bench   throughput at a given thread count (scripts/bench.sh compares piper against it)
#   --parity  loss / grad-norm / lr trajectory from parameters written by piper (PIPERPRM),
#             on a piper token file (PIPERTOK), in the spec's data order
# LR: lr * (s+1)/warmup for s < warmup, then min_lr + (lr - min_lr) * 0.5 * (1 + cos(pi * p)),
# p = min(1, (s - warmup) / max(1, steps - warmup - 1)): the floor lands on the last step.
# Run with Debian's interpreter: /usr/bin/python3 bench/torch_peer.py --help
# Sizes and training settings come from flags (defaults: the benchmark model and piper's
# TrainConfig defaults) or from a piper YAML config (--config; flags given explicitly win), e.g.
#   /usr/bin/python3 bench/torch_peer.py --parity init.prm --tokens corpus.tok \
#       --config config/tiny.yaml --steps 20 > torch.jsonl
# File formats (little-endian):
#   PIPERTOK: b"PIPERTOK", u32 version 2, u32 vocab, u32 id width (2|4), u32 tokenizer kind, u64 count,
#             u64 tokenizer model hash,
#             then count ids.
#   PIPERPRM: b"PIPERPRM", u32 version 1, u32 tensor count; per tensor: u32 name length, name
#             (utf-8), u32 ndim, ndim x i64 dims, float32 data row-major.
import argparse
import json
import math
import os
import statistics
import struct
import sys
import time


def _pin_blas_threads():
    """torch.set_num_threads() does not reach the BLAS torch calls for matmul when Debian's
    torch is built against the generic libblas.so.3 (OpenBLAS by default): OpenBLAS reads its
    thread count from the environment once, when it loads. So --threads goes into the
    environment before torch is imported."""
    argv = sys.argv[1:]
    for i, a in enumerate(argv):
        val = a.split("=", 1)[1] if a.startswith("--threads=") else (
            argv[i + 1] if a == "--threads" and i + 1 < len(argv) else None)
        if val is not None:
            for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "BLIS_NUM_THREADS",
                        "MKL_NUM_THREADS"):
                os.environ[var] = val


OPENMP_BLAS_DIR = "/usr/lib/x86_64-linux-gnu/openblas-openmp"


def _use_openmp_blas():
    """Re-run this script with Debian's OpenMP build of OpenBLAS in front of the loader path,
    so torch's libblas.so.3 / liblapack.so.3 come from it, not from whatever the alternatives
    system points at (the pthread build by default). Then torch's intra-op threads and the BLAS
    threads are one libgomp pool; with the pthread build the two pools oversubscribe the cores
    (measured on the benchmark model at 2 threads: 1.17-1.22 s per step against 0.56-0.67 s).
    --system-blas keeps the default."""
    if "--system-blas" in sys.argv or os.environ.get("PIPER_PEER_REEXEC") == "1":
        return
    if not os.path.exists(os.path.join(OPENMP_BLAS_DIR, "libblas.so.3")):
        return
    env = dict(os.environ)
    old = env.get("LD_LIBRARY_PATH")
    env["LD_LIBRARY_PATH"] = OPENMP_BLAS_DIR + (":" + old if old else "")
    env["PIPER_PEER_REEXEC"] = "1"
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable] + sys.argv, env)


if __name__ == "__main__":
    _pin_blas_threads()
    _use_openmp_blas()

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

RMS_EPS = 1e-5


# ----------------------------------------------------------------------------- file formats
def read_tokens(path):
    """Token ids of a PIPERTOK file as an int64 numpy array, plus the header's vocab size."""
    with open(path, "rb") as f:
        head = f.read(40)
        if len(head) != 40 or head[:8] != b"PIPERTOK":
            raise ValueError(f"{path}: not a PIPERTOK token file")
        version, vocab, width, _kind, count, _hash = struct.unpack("<IIIIQQ", head[8:40])
        if version != 2 or width not in (2, 4):
            raise ValueError(f"{path}: unsupported version {version} or id width {width}")
        ids = np.frombuffer(f.read(count * width), dtype="<u2" if width == 2 else "<u4")
        if ids.size != count:
            raise ValueError(f"{path}: header says {count} ids, file holds {ids.size}")
    return ids.astype(np.int64), vocab


def write_tokens(path, ids, vocab):
    ids = np.asarray(ids)
    width = 2 if vocab <= 65536 else 4
    with open(path, "wb") as f:
        f.write(b"PIPERTOK" + struct.pack("<IIIIQQ", 2, vocab, width, 0, ids.size, 0))
        f.write(ids.astype("<u2" if width == 2 else "<u4").tobytes())


def read_params(path):
    """{name: float32 tensor} from a PIPERPRM file, in file order."""
    out = {}
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"PIPERPRM":
        raise ValueError(f"{path}: not a PIPERPRM parameter file")
    version, count = struct.unpack_from("<II", data, 8)
    if version != 1:
        raise ValueError(f"{path}: unsupported PIPERPRM version {version}")
    off = 16
    for _ in range(count):
        (nlen,) = struct.unpack_from("<I", data, off)
        off += 4
        name = data[off:off + nlen].decode("utf-8")
        off += nlen
        (ndim,) = struct.unpack_from("<I", data, off)
        off += 4
        dims = struct.unpack_from(f"<{ndim}q", data, off)
        off += 8 * ndim
        n = int(np.prod(dims)) if ndim else 1
        arr = np.frombuffer(data, dtype="<f4", count=n, offset=off).reshape(dims)
        off += 4 * n
        out[name] = torch.from_numpy(arr.astype(np.float32))
    if off != len(data):
        raise ValueError(f"{path}: {len(data) - off} trailing bytes after {count} tensors")
    return out


def write_params(path, named):
    """Write {name: tensor} (or a list of pairs) as PIPERPRM, float32 little-endian."""
    items = list(named.items()) if isinstance(named, dict) else list(named)
    with open(path, "wb") as f:
        f.write(b"PIPERPRM" + struct.pack("<II", 1, len(items)))
        for name, t in items:
            b = name.encode("utf-8")
            a = t.detach().to(torch.float32).cpu().contiguous().numpy()
            f.write(struct.pack("<I", len(b)) + b + struct.pack("<I", a.ndim))
            f.write(struct.pack(f"<{a.ndim}q", *a.shape))
            f.write(a.astype("<f4").tobytes())


# ----------------------------------------------------------------------------- model pieces
def rmsnorm(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + RMS_EPS) * w


def segsum(x):
    """Stable segment sum: out[..., i, j] = sum_{j < k <= i} x[..., k] for j <= i, -inf above
    the diagonal (so exp() of it is the lower-triangular decay matrix)."""
    T = x.size(-1)
    x = x.unsqueeze(-1).expand(*x.shape, T)                      # [..., T(k), T(j)]
    lower = torch.tril(torch.ones(T, T, dtype=torch.bool, device=x.device), diagonal=-1)
    x = x.masked_fill(~lower, 0)
    out = torch.cumsum(x, dim=-2)
    keep = torch.tril(torch.ones(T, T, dtype=torch.bool, device=x.device), diagonal=0)
    return out.masked_fill(~keep, -math.inf)


def ssd_chunked(X, A, B, C, chunk):
    """The state-space recurrence S(t) = exp(A(t)) S(t-1) + outer(X(t), B(t)),
    Y(t) = S(t) C(t), S(0) = 0, in the chunked SSD form (ssd_minimal_discrete of the Mamba-2
    paper, with B and C kept per group instead of repeated per head).
      X: [b, T, H, P]  (already multiplied by dt)
      A: [b, T, H]     (already dt * A, <= 0)
      B, C: [b, T, G, N], head h reads group h // (H // G)
    Returns Y: [b, T, H, P]."""
    b, T, H, P = X.shape
    G, N = B.shape[2], B.shape[3]
    hg = H // G
    pad = (-T) % chunk
    if pad:  # zero-padding the end leaves earlier (causal) outputs untouched
        X = F.pad(X, (0, 0, 0, 0, 0, pad))
        A = F.pad(A, (0, 0, 0, pad))
        B = F.pad(B, (0, 0, 0, 0, 0, pad))
        C = F.pad(C, (0, 0, 0, 0, 0, pad))
    nc = X.shape[1] // chunk
    X = X.reshape(b, nc, chunk, G, hg, P)
    B = B.reshape(b, nc, chunk, G, N)
    C = C.reshape(b, nc, chunk, G, N)
    A = A.reshape(b, nc, chunk, G, hg).permute(0, 3, 4, 1, 2)   # [b, G, hg, c, l]
    A_cum = torch.cumsum(A, dim=-1)

    # 1. within-chunk (diagonal blocks): Y[l] = sum_{s<=l} (C[l].B[s]) exp(segsum) X[s]
    L = torch.exp(segsum(A))                                     # [b, G, hg, c, l, s]
    CB = torch.einsum("bclgn,bcsgn->bgcls", C, B)                # [b, G, c, l, s]
    W = L * CB.unsqueeze(2)                                      # [b, G, hg, c, l, s]
    Y_diag = torch.einsum("bgjcls,bcsgjp->bclgjp", W, X)

    # 2. state at the end of each chunk from that chunk's inputs
    decay_states = torch.exp(A_cum[..., -1:] - A_cum)            # [b, G, hg, c, l]
    states = torch.einsum("bclgn,bgjcl,bclgjp->bcgjpn", B, decay_states, X)

    # 3. carry states across chunks
    init = torch.zeros_like(states[:, :1])
    states = torch.cat([init, states], dim=1)                    # [b, c+1, G, hg, P, N]
    decay_chunk = torch.exp(segsum(F.pad(A_cum[..., -1], (1, 0))))  # [b, G, hg, c+1, c+1]
    new_states = torch.einsum("bgjzc,bcgjpn->bzgjpn", decay_chunk, states)
    states = new_states[:, :-1]                                  # state entering each chunk

    # 4. contribution of the carried state to each position
    state_decay_out = torch.exp(A_cum)                           # [b, G, hg, c, l]
    Y_off = torch.einsum("bclgn,bcgjpn,bgjcl->bclgjp", C, states, state_decay_out)

    Y = (Y_diag + Y_off).reshape(b, nc * chunk, H, P)
    return Y[:, :T]


def ssd_naive(X, A, B, C):
    """Per-timestep reference of ssd_chunked (same arguments); used by the self-test."""
    b, T, H, P = X.shape
    G, N = B.shape[2], B.shape[3]
    hg = H // G
    S = X.new_zeros(b, H, P, N)
    ys = []
    for t in range(T):
        Bh = B[:, t].repeat_interleave(hg, dim=1)                # [b, H, N]
        Ch = C[:, t].repeat_interleave(hg, dim=1)
        S = torch.exp(A[:, t])[..., None, None] * S + X[:, t][..., None] * Bh[:, :, None, :]
        ys.append(torch.einsum("bhpn,bhn->bhp", S, Ch))
    return torch.stack(ys, dim=1)


def rope_tables(T, hd, theta, dtype):
    inv_freq = theta ** (-torch.arange(0, hd // 2, dtype=torch.float64) * 2.0 / hd)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq[None, :]   # [T, hd/2]
    ang = torch.cat([ang, ang], dim=-1)                                       # [T, hd]
    return ang.cos().to(dtype), ang.sin().to(dtype)


def rotate_half(u):
    a, b = u.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        D, H, KV = cfg.d_model, cfg.n_heads, cfg.n_kv_heads
        assert D % H == 0 and H % KV == 0
        self.H, self.KV, self.hd, self.theta = H, KV, D // H, cfg.rope_theta
        self.q_proj = nn.Linear(D, H * self.hd, bias=False)
        self.k_proj = nn.Linear(D, KV * self.hd, bias=False)
        self.v_proj = nn.Linear(D, KV * self.hd, bias=False)
        self.o_proj = nn.Linear(H * self.hd, D, bias=False)
        self._rope = None

    def forward(self, x):
        b, T, _ = x.shape
        H, KV, hd = self.H, self.KV, self.hd
        if self._rope is None or self._rope[0].shape[0] != T or self._rope[0].dtype != x.dtype:
            self._rope = rope_tables(T, hd, self.theta, x.dtype)
        cos, sin = self._rope
        q = self.q_proj(x).view(b, T, H, hd).transpose(1, 2)     # [b, H, T, hd]
        k = self.k_proj(x).view(b, T, KV, hd).transpose(1, 2)
        v = self.v_proj(x).view(b, T, KV, hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if KV != H:  # q head h reads kv head h // (H / KV)
            k = k.repeat_interleave(H // KV, dim=1)
            v = v.repeat_interleave(H // KV, dim=1)
        if hasattr(F, "scaled_dot_product_attention"):
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # torch < 2.0
            s = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(hd))
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
            s = s.masked_fill(mask, -math.inf)
            o = torch.matmul(torch.softmax(s, dim=-1), v)
        return self.o_proj(o.transpose(1, 2).reshape(b, T, H * hd))


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        D, Fh = cfg.d_model, cfg.ffn_hidden
        self.gate_proj = nn.Linear(D, Fh, bias=False)
        self.up_proj = nn.Linear(D, Fh, bias=False)
        self.down_proj = nn.Linear(Fh, D, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def top_k_lower_first(probs, K):
    """The K largest of each row of probs in descending order, ties to the lower index (a
    stable descending sort; torch.topk promises no order among equal values)."""
    vals, idx = torch.sort(probs, dim=-1, descending=True, stable=True)
    return vals[..., :K], idx[..., :K]


class MoE(nn.Module):
    """Top-k routed SwiGLU experts, dropless. forward() leaves the block's sequence-wise balance
    loss, the mean over the batch's sequences of aux(s), in self.aux."""

    def __init__(self, cfg):
        super().__init__()
        D, E, Fh = cfg.d_model, cfg.n_experts, cfg.moe_ffn_hidden
        self.E, self.K = E, cfg.top_k
        self.router = nn.Linear(D, E, bias=False)
        self.experts = nn.Module()
        self.experts.gate_proj = nn.Parameter(torch.empty(E, Fh, D))
        self.experts.up_proj = nn.Parameter(torch.empty(E, Fh, D))
        self.experts.down_proj = nn.Parameter(torch.empty(E, D, Fh))
        self.aux = None

    def forward(self, x):
        b, T, D = x.shape
        E, K = self.E, self.K
        xf = x.reshape(b * T, D)
        probs = torch.softmax(self.router(xf), dim=-1)           # [M, E]
        picked, idx = top_k_lower_first(probs, K)                # [M, K]
        weights = picked / picked.sum(-1, keepdim=True)
        ex = self.experts
        out = torch.zeros_like(xf)
        for e in range(E):
            rows, slot = (idx == e).nonzero(as_tuple=True)
            if rows.numel() == 0:
                continue
            xe = xf[rows]
            y = (F.silu(xe @ ex.gate_proj[e].t()) * (xe @ ex.up_proj[e].t())) @ ex.down_proj[e].t()
            out = out.index_add(0, rows, y * weights[rows, slot].unsqueeze(-1))
        # balance loss: f_e(s) counts (token, slot) assignments, no gradient; P_e(s) does carry one
        f = F.one_hot(idx, E).reshape(b, T * K, E).sum(1).to(x.dtype) / (T * K)   # [b, E]
        P = probs.reshape(b, T, E).mean(1)                                      # [b, E]
        self.aux = (E * (f.detach() * P).sum(-1)).mean()
        return out.reshape(b, T, D)


class Mamba2(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        D = cfg.d_model
        self.d_inner = cfg.expand * D
        self.P, self.N, self.G, self.K = cfg.head_dim, cfg.d_state, cfg.n_groups, cfg.d_conv
        assert self.d_inner % self.P == 0
        self.Hm = self.d_inner // self.P
        assert self.Hm % self.G == 0
        self.C = self.d_inner + 2 * self.G * self.N
        self.chunk = cfg.ssd_chunk
        self.in_proj = nn.Linear(D, 2 * self.d_inner + 2 * self.G * self.N + self.Hm, bias=False)
        self.conv1d = nn.Module()
        self.conv1d.weight = nn.Parameter(torch.empty(self.C, self.K))
        self.conv1d.bias = nn.Parameter(torch.empty(self.C))
        self.dt_bias = nn.Parameter(torch.empty(self.Hm))
        self.A_log = nn.Parameter(torch.empty(self.Hm))
        self.D = nn.Parameter(torch.empty(self.Hm))
        self.norm = nn.Module()
        self.norm.weight = nn.Parameter(torch.empty(self.d_inner))
        self.out_proj = nn.Linear(self.d_inner, D, bias=False)

    def forward(self, u):
        b, T, _ = u.shape
        di, G, N, Hm, P = self.d_inner, self.G, self.N, self.Hm, self.P
        z, xBC, dt = torch.split(self.in_proj(u), [di, self.C, Hm], dim=-1)
        # causal depthwise conv: out[t, c] = bias[c] + sum_k w[c, k] * in[t - (K-1) + k, c]
        xBC = F.conv1d(F.pad(xBC.transpose(1, 2), (self.K - 1, 0)),
                       self.conv1d.weight.unsqueeze(1), self.conv1d.bias, groups=self.C)
        xBC = F.silu(xBC.transpose(1, 2))
        x, Bm, Cm = torch.split(xBC, [di, G * N, G * N], dim=-1)
        x = x.reshape(b, T, Hm, P)
        Bm = Bm.reshape(b, T, G, N)
        Cm = Cm.reshape(b, T, G, N)
        dt = F.softplus(dt + self.dt_bias)                       # [b, T, Hm]
        A = -torch.exp(self.A_log)                               # [Hm]
        y = ssd_chunked(x * dt.unsqueeze(-1), dt * A, Bm, Cm, self.chunk)
        y = y + self.D[:, None] * x
        y = y.reshape(b, T, di) * F.silu(z)
        yg = y.reshape(b, T, G, di // G)                         # grouped rmsnorm
        yg = yg * torch.rsqrt(yg.pow(2).mean(-1, keepdim=True) + RMS_EPS)
        y = yg.reshape(b, T, di) * self.norm.weight
        return self.out_proj(y)


class Block(nn.Module):
    def __init__(self, sym, cfg):
        super().__init__()
        self.norm = nn.Module()
        self.norm.weight = nn.Parameter(torch.ones(cfg.d_model))
        if sym == "M":
            self.mixer = Mamba2(cfg)
        elif sym == "*":
            self.mixer = Attention(cfg)
        elif sym == "-":
            self.mixer = MLP(cfg)
        elif sym == "E":
            self.mixer = MoE(cfg)
        else:
            raise ValueError(f"pattern symbol {sym!r} is not a block; use M, *, - or E")

    def forward(self, h):
        return h + self.mixer(rmsnorm(h, self.norm.weight))


class Model(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList([Block(s, cfg) for s in cfg.pattern])
        self.final_norm = nn.Module()
        self.final_norm.weight = nn.Parameter(torch.ones(cfg.d_model))
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)

    def forward(self, tokens, targets):
        h = self.embed(tokens)
        for layer in self.layers:
            h = layer(h)
        logits = self.lm_head(rmsnorm(h, self.final_norm.weight))
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        moe = [layer.mixer.aux for layer in self.layers if isinstance(layer.mixer, MoE)]
        return loss + self.cfg.moe_aux_coef * sum(moe) if moe else loss

    @torch.no_grad()
    def init_weights(self, seed):
        """A sensible init as docs/model.md allows (the peer's own; parity runs load piper's)."""
        g = torch.Generator().manual_seed(seed)
        n_blocks = len(self.cfg.pattern)
        for name, p in self.named_parameters():
            leaf = name.split(".")[-2] if name.endswith(".weight") else name.split(".")[-1]
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif leaf == "A_log":
                p.copy_(torch.log(torch.empty(p.shape).uniform_(1, 16, generator=g)))
            elif leaf == "dt_bias":
                dt = torch.exp(torch.empty(p.shape).uniform_(math.log(1e-3), math.log(1e-1),
                                                             generator=g))
                p.copy_(dt + torch.log(-torch.expm1(-dt)))     # inverse softplus
            elif leaf == "D":
                p.fill_(1.0)
            elif name.endswith("conv1d.bias"):
                p.zero_()
            elif name.endswith("conv1d.weight"):
                p.normal_(0.0, 1.0 / math.sqrt(p.shape[1]), generator=g)
            else:
                std = 0.02
                if leaf in ("out_proj", "down_proj", "o_proj"):
                    std /= math.sqrt(2 * n_blocks)
                p.normal_(0.0, std, generator=g)


# ----------------------------------------------------------------------------- training
def lr_at(args, s):
    """Linear warmup, then cosine to lr * min_lr_ratio, reached exactly at the last step
    (steps - 1), as piper's optim::lr_at (docs/model.md)."""
    if s < args.warmup:
        return args.lr * (s + 1) / args.warmup
    min_lr = args.lr * args.min_lr_ratio
    total = args.schedule_steps if args.schedule_steps is not None else args.steps
    progress = min(1.0, (s - args.warmup) / max(1, total - args.warmup - 1))
    return min_lr + (args.lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))


def make_optimizer(model, args):
    decay = [p for p in model.parameters() if p.dim() >= 2]    # 2-D / 3-D weights
    no_decay = [p for p in model.parameters() if p.dim() < 2]  # norms, biases, dt_bias, A_log, D
    groups = [{"params": decay, "weight_decay": args.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=args.lr, betas=(args.beta1, args.beta2), eps=args.eps)


def batch_at(ids, s, args):
    """Spec data order: sample g = s*global_batch + j is ids[(g*T + i) mod n], i = 0..T."""
    T, n = args.seq_len, ids.size
    g = s * args.global_batch + np.arange(args.global_batch)[:, None]
    idx = (g * T + np.arange(T + 1)[None, :]) % n
    seq = torch.from_numpy(ids[idx])
    return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()


def train_step(model, opt, args, s, inputs, targets):
    lr = lr_at(args, s)
    for grp in opt.param_groups:
        grp["lr"] = lr
    opt.zero_grad(set_to_none=True)
    loss = model(inputs, targets)
    loss.backward()
    max_norm = args.grad_clip if args.grad_clip > 0 else float("inf")
    gn = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    opt.step()
    return loss.item(), float(gn), lr


def load_into(model, params):
    own = dict(model.named_parameters())
    missing = sorted(set(own) - set(params))
    extra = sorted(set(params) - set(own))
    if missing or extra:
        raise ValueError(f"parameter names differ from the model: missing {missing}, "
                         f"unexpected {extra}")
    with torch.no_grad():
        for name, p in own.items():
            t = params[name]
            if tuple(t.shape) != tuple(p.shape):
                raise ValueError(f"{name}: shape {tuple(t.shape)}, model wants {tuple(p.shape)}")
            p.copy_(t)


# piper YAML key -> argparse destination (the `model:` and `train:` sections of config.hpp).
CONFIG_KEYS = {
    "model": {k: k for k in ("pattern", "vocab_size", "d_model", "n_heads", "n_kv_heads",
                             "ffn_hidden", "d_state", "head_dim", "expand", "n_groups",
                             "d_conv", "rope_theta", "ssd_chunk", "n_experts", "top_k",
                             "moe_ffn_hidden", "moe_aux_coef")},
    "train": {"steps": "steps", "global_batch": "global_batch", "seq_len": "seq_len",
              "lr": "lr", "min_lr_ratio": "min_lr_ratio", "weight_decay": "weight_decay",
              "beta1": "beta1", "beta2": "beta2", "eps": "eps", "grad_clip": "grad_clip",
              "warmup_steps": "warmup", "seed": "seed"},
}


def config_defaults(path):
    """argparse defaults from a piper YAML config. train.steps also fixes the LR schedule's
    length (as in piper), even when --steps runs fewer steps."""
    import yaml  # python3-yaml
    with open(path) as f:
        doc = yaml.safe_load(f) or {}
    out = {}
    for section, keys in CONFIG_KEYS.items():
        for k, v in (doc.get(section) or {}).items():
            if k in keys:
                out[keys[k]] = v
            elif section == "model":
                raise ValueError(f"{path}: model.{k} is not supported by the torch peer")
    if "steps" in out:
        out["schedule_steps"] = out["steps"]
    return out


def parse_args(argv=None):
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.config:
        types = {a.dest: a.type for a in ap._actions}
        # YAML reads 1e-3 (no dot) as a string; the flag's own type converts it.
        ap.set_defaults(**{k: (types[k](v) if types.get(k) else v)
                           for k, v in config_defaults(args.config).items()})
        args = ap.parse_args(argv)
    check_moe_args(ap, args)
    return args


def check_moe_args(ap, args):
    """A pattern with 'E' blocks needs the MoE sizes, with 1 <= top_k <= n_experts."""
    if "E" not in args.pattern:
        return
    why = f"pattern {args.pattern!r} has MoE blocks (block {args.pattern.index('E')} is E)"
    for flag, v in (("--n-experts", args.n_experts), ("--top-k", args.top_k),
                    ("--moe-ffn-hidden", args.moe_ffn_hidden)):
        if v <= 0:
            ap.error(f"{flag} (model.{flag[2:].replace('-', '_')}) is {v}; {why}, which need "
                     "it >= 1")
    if args.top_k > args.n_experts:
        ap.error(f"--top-k {args.top_k} exceeds --n-experts {args.n_experts}; use top_k <= "
                 "n_experts")


def build_parser():
    ap = argparse.ArgumentParser(description=__doc__ or "PyTorch peer of piper")
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--bench", action="store_true", help="throughput benchmark")
    mode.add_argument("--parity", metavar="PARAMS_FILE",
                      help="train from these initial parameters (PIPERPRM), print per-step JSON")
    ap.add_argument("--config", help="piper YAML config: model sizes and training settings "
                    "(explicit flags override it)")
    ap.add_argument("--tokens", help="PIPERTOK token file (required for --parity; "
                    "--bench uses random tokens without it)")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup-steps-excluded", type=int, default=3,
                    help="--bench: leading steps left out of the timing median")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch.set_num_threads and, when run as a script, the BLAS's threads")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--system-blas", action="store_true",
                    help="keep the libblas.so.3 the system picks (default: re-run with Debian's "
                    "OpenMP OpenBLAS, one thread pool with torch's)")
    ap.add_argument("--write-init", metavar="PATH",
                    help="write the initial parameters as PIPERPRM (before any step)")
    m = ap.add_argument_group("model (defaults: the benchmark model)")
    m.add_argument("--vocab", dest="vocab_size", type=int, default=256)
    m.add_argument("--d-model", type=int, default=256)
    m.add_argument("--pattern", default="M-M*M-M-")
    m.add_argument("--n-heads", type=int, default=8)
    m.add_argument("--n-kv-heads", type=int, default=4)
    m.add_argument("--ffn-hidden", type=int, default=768)
    m.add_argument("--d-state", type=int, default=32)
    m.add_argument("--head-dim", type=int, default=32, help="Mamba-2 head dim P")
    m.add_argument("--expand", type=int, default=2)
    m.add_argument("--n-groups", type=int, default=1)
    m.add_argument("--d-conv", type=int, default=4)
    m.add_argument("--rope-theta", type=float, default=10000.0)
    m.add_argument("--ssd-chunk", type=int, default=32,
                   help="SSD chunk length (speed only; 32 measured faster than 64 here, as in piper)")
    m.add_argument("--n-experts", type=int, default=0, help="MoE experts E per 'E' block")
    m.add_argument("--top-k", type=int, default=0, help="MoE experts per token K")
    m.add_argument("--moe-ffn-hidden", type=int, default=0, help="hidden size F of each expert")
    m.add_argument("--moe-aux-coef", type=float, default=0.01,
                   help="weight of the MoE sequence-wise balance loss")
    t = ap.add_argument_group("training (defaults: piper's TrainConfig)")
    t.add_argument("--seq-len", type=int, default=256)
    t.add_argument("--global-batch", type=int, default=8)
    t.add_argument("--lr", type=float, default=3e-3)
    t.add_argument("--min-lr-ratio", type=float, default=0.1)
    t.add_argument("--warmup", type=int, default=10, help="LR warmup steps")
    t.add_argument("--schedule-steps", type=int, default=None,
                   help="length of the LR schedule (default: --steps)")
    t.add_argument("--weight-decay", type=float, default=0.1)
    t.add_argument("--beta1", type=float, default=0.9)
    t.add_argument("--beta2", type=float, default=0.95)
    t.add_argument("--eps", type=float, default=1e-8)
    t.add_argument("--grad-clip", type=float, default=1.0, help="0 = off")
    return ap


def blas_libraries():
    """Shared BLAS-like libraries mapped into this process (which BLAS torch's matmul uses)."""
    try:
        with open("/proc/self/maps") as f:
            libs = {line.split()[-1] for line in f if ".so" in line}
    except OSError:
        return []
    keys = ("blas", "blis", "dnnl", "mkl")
    return sorted(x for x in libs if any(k in os.path.basename(x) for k in keys))


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    torch.set_default_dtype(torch.float32)
    model = Model(args)
    model.init_weights(args.seed)
    if args.parity:
        if not args.tokens:
            sys.exit("torch_peer: --parity needs --tokens")
        load_into(model, read_params(args.parity))
    if args.write_init:
        write_params(args.write_init, model.named_parameters())
    if args.tokens:
        ids, vocab = read_tokens(args.tokens)
        if vocab > args.vocab_size or (ids.size and ids.max() >= args.vocab_size):
            sys.exit(f"torch_peer: token file vocab {vocab} exceeds model vocab {args.vocab_size}")
    else:
        rng = np.random.default_rng(args.seed)
        ids = rng.integers(0, args.vocab_size,
                           size=args.steps * args.global_batch * args.seq_len + 1)
    opt = make_optimizer(model, args)
    model.train()

    if args.parity:
        for s in range(args.steps):
            inputs, targets = batch_at(ids, s, args)
            loss, gn, lr = train_step(model, opt, args, s, inputs, targets)
            print(json.dumps({"step": s, "loss": loss, "grad_norm": gn, "lr": lr}), flush=True)
        return

    times, losses = [], []
    for s in range(args.steps):
        inputs, targets = batch_at(ids, s, args)
        t0 = time.perf_counter()
        loss, _, _ = train_step(model, opt, args, s, inputs, targets)
        times.append(time.perf_counter() - t0)
        losses.append(loss)
    timed = times[args.warmup_steps_excluded:] or times
    med = statistics.median(timed)
    tokens = args.global_batch * args.seq_len
    print(json.dumps({
        "impl": "torch-eager", "torch": torch.__version__, "threads": args.threads,
        "steps": args.steps, "timed_steps": len(timed), "tokens_per_step": tokens,
        "median_step_ms": med * 1e3, "tokens_per_s": tokens / med,
        "min_step_ms": min(timed) * 1e3,
        "params": sum(p.numel() for p in model.parameters()),
        "blas": blas_libraries(),
        "first_loss": losses[0], "last_loss": losses[-1]}), flush=True)


if __name__ == "__main__":
    main()
