#!/usr/bin/python3
# torch_peer_check.py — self-test of bench/torch_peer.py, in float64:
#   1. the chunked SSD against a naive per-timestep recurrence (max abs error < 1e-10);
#   2. the Mamba-2 and attention mixers against direct loop transcriptions of docs/model.md;
#   3. the whole model's autograd gradients against central finite differences (tiny model);
#   4. the PIPERPRM / PIPERTOK round trip, the data order, the LR schedule and a --parity run.
# Run: /usr/bin/python3 bench/torch_peer_check.py   (exits non-zero on any failure)
import contextlib
import io
import json
import math
import os
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_peer as tp  # noqa: E402


def tiny_args(extra=()):
    return tp.build_parser().parse_args([
        "--bench", "--vocab", "17", "--d-model", "16", "--pattern", "M*-M", "--n-heads", "4",
        "--n-kv-heads", "2", "--ffn-hidden", "24", "--d-state", "6", "--head-dim", "8",
        "--expand", "2", "--n-groups", "2", "--d-conv", "4", "--ssd-chunk", "8",
        "--seq-len", "20", "--global-batch", "2", *extra])


def check_ssd():
    g = torch.Generator().manual_seed(0)
    worst = 0.0
    for (b, T, H, G, P, N, chunk) in [(2, 100, 4, 2, 8, 6, 16), (1, 128, 16, 1, 32, 32, 64),
                                      (2, 37, 6, 3, 4, 5, 64), (1, 64, 2, 1, 3, 4, 1)]:
        X = torch.randn(b, T, H, P, generator=g, dtype=torch.float64)
        dt = F.softplus(torch.randn(b, T, H, generator=g, dtype=torch.float64))
        A = -torch.exp(torch.randn(H, generator=g, dtype=torch.float64))
        Bm = torch.randn(b, T, G, N, generator=g, dtype=torch.float64)
        Cm = torch.randn(b, T, G, N, generator=g, dtype=torch.float64)
        y1 = tp.ssd_chunked(X * dt[..., None], dt * A, Bm, Cm, chunk)
        y2 = tp.ssd_naive(X * dt[..., None], dt * A, Bm, Cm)
        err = (y1 - y2).abs().max().item()
        print(f"  ssd b={b} T={T} H={H} G={G} P={P} N={N} chunk={chunk}: "
              f"max abs err {err:.3e} (|y| max {y2.abs().max().item():.2f})")
        worst = max(worst, err)
    print(f"SSD chunked vs naive recurrence (float64): max abs error {worst:.3e}")
    assert worst < 1e-10, worst


def mamba_reference(m, u):
    """docs/model.md's Mamba-2 block written as loops (float64), independent of ssd_chunked."""
    b, T, _ = u.shape
    di, G, N, Hm, P, K = m.d_inner, m.G, m.N, m.Hm, m.P, m.K
    zxbcdt = u @ m.in_proj.weight.T
    z, xBC, dt = zxbcdt[..., :di], zxbcdt[..., di:di + m.C], zxbcdt[..., di + m.C:]
    conv = torch.zeros_like(xBC)
    for t in range(T):
        acc = m.conv1d.bias.expand(b, m.C).clone()
        for k in range(K):
            src = t - (K - 1) + k
            if src >= 0:
                acc = acc + m.conv1d.weight[:, k] * xBC[:, src]
        conv[:, t] = acc
    xBC = conv * torch.sigmoid(conv)
    x = xBC[..., :di].reshape(b, T, Hm, P)
    Bm = xBC[..., di:di + G * N].reshape(b, T, G, N)
    Cm = xBC[..., di + G * N:].reshape(b, T, G, N)
    dt = torch.log1p(torch.exp(dt + m.dt_bias))
    A = -torch.exp(m.A_log)
    y = torch.zeros(b, T, Hm, P, dtype=u.dtype)
    for h in range(Hm):
        gidx = h // (Hm // G)
        S = torch.zeros(b, P, N, dtype=u.dtype)
        for t in range(T):
            S = torch.exp(dt[:, t, h] * A[h])[:, None, None] * S + \
                dt[:, t, h][:, None, None] * x[:, t, h, :, None] * Bm[:, t, gidx, None, :]
            y[:, t, h] = torch.einsum("bpn,bn->bp", S, Cm[:, t, gidx]) + m.D[h] * x[:, t, h]
    y = y.reshape(b, T, di) * (z * torch.sigmoid(z))
    parts = []
    for gi in range(G):
        yg = y[..., gi * di // G:(gi + 1) * di // G]
        parts.append(yg / torch.sqrt((yg * yg).mean(-1, keepdim=True) + 1e-5))
    y = torch.cat(parts, -1) * m.norm.weight
    return y @ m.out_proj.weight.T


def attention_reference(a, x):
    """docs/model.md's attention block as loops over heads and positions (float64)."""
    b, T, _ = x.shape
    H, KV, hd = a.H, a.KV, a.hd
    q = (x @ a.q_proj.weight.T).reshape(b, T, H, hd)
    k = (x @ a.k_proj.weight.T).reshape(b, T, KV, hd)
    v = (x @ a.v_proj.weight.T).reshape(b, T, KV, hd)

    def rope(u):
        out = torch.empty_like(u)
        for t in range(T):
            for j in range(hd // 2):
                f = a.theta ** (-2.0 * j / hd)
                c, s = math.cos(t * f), math.sin(t * f)
                u1, u2 = u[:, t, :, j], u[:, t, :, j + hd // 2]
                out[:, t, :, j] = u1 * c - u2 * s
                out[:, t, :, j + hd // 2] = u2 * c + u1 * s
        return out
    q, k = rope(q), rope(k)
    out = torch.zeros(b, T, H, hd, dtype=x.dtype)
    for h in range(H):
        kvh = h // (H // KV)
        for t in range(T):
            sc = torch.einsum("bd,bsd->bs", q[:, t, h], k[:, :t + 1, kvh]) / math.sqrt(hd)
            out[:, t, h] = torch.einsum("bs,bsd->bd", torch.softmax(sc, -1), v[:, :t + 1, kvh])
    return out.reshape(b, T, H * hd) @ a.o_proj.weight.T


def check_mixers():
    torch.set_default_dtype(torch.float64)
    try:
        args = tiny_args()
        model = tp.Model(args)
        model.init_weights(3)
        with torch.no_grad():  # make every parameter matter (non-trivial norms, D, biases)
            for name, p in model.named_parameters():
                if p.dim() == 1 and "A_log" not in name and "dt_bias" not in name:
                    p.add_(0.3 * torch.randn(p.shape))
                elif p.dim() >= 2:
                    p.mul_(5.0)
        x = torch.randn(2, 20, 16)
        m_err = (model.layers[0].mixer(x) - mamba_reference(model.layers[0].mixer, x)).abs().max()
        a_err = (model.layers[1].mixer(x) - attention_reference(model.layers[1].mixer, x)).abs().max()
        print(f"Mamba-2 mixer vs loop transcription of docs/model.md: max abs error {m_err:.3e}")
        print(f"attention mixer vs loop transcription of docs/model.md: max abs error {a_err:.3e}")
        assert m_err < 1e-10 and a_err < 1e-10
    finally:
        torch.set_default_dtype(torch.float32)


def check_gradients():
    torch.set_default_dtype(torch.float64)
    try:
        args = tiny_args()
        model = tp.Model(args)
        model.init_weights(7)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if p.dim() == 1:
                    p.add_(0.2 * torch.randn(p.shape))
                else:
                    p.mul_(4.0)
        g = torch.Generator().manual_seed(11)
        tokens = torch.randint(0, args.vocab_size, (2, 21), generator=g)
        inp, tgt = tokens[:, :-1], tokens[:, 1:]
        model.zero_grad()
        model(inp, tgt).backward()
        # Central differences: truncation ~h^2, round-off ~1e-16 * |loss| / h ~ 1e-11 at h=1e-5,
        # so the test is |fd - autograd| <= 1e-9 + 1e-6 * |autograd|.
        h = 1e-5
        worst_rel, worst_abs, checked, bad = 0.0, 0.0, 0, 0
        rng = np.random.default_rng(5)
        for name, p in model.named_parameters():
            flat = p.data.view(-1)
            for idx in rng.choice(flat.numel(), size=min(3, flat.numel()), replace=False):
                old = flat[idx].item()
                with torch.no_grad():
                    flat[idx] = old + h
                    lp = model(inp, tgt).item()
                    flat[idx] = old - h
                    lm = model(inp, tgt).item()
                    flat[idx] = old
                fd = (lp - lm) / (2 * h)
                ad = p.grad.view(-1)[idx].item()
                err = abs(fd - ad)
                worst_abs = max(worst_abs, err)
                if abs(ad) > 1e-4:
                    worst_rel = max(worst_rel, err / abs(ad))
                checked += 1
                if err > 1e-9 + 1e-6 * abs(ad):
                    bad += 1
                    print(f"  MISMATCH {name}[{idx}]: autograd {ad:.10e} fd {fd:.10e}")
        print(f"whole-model autograd vs central differences (float64, {checked} elements over "
              f"{len(list(model.parameters()))} tensors): worst abs error {worst_abs:.3e}, "
              f"worst relative error (|grad| > 1e-4) {worst_rel:.3e}")
        assert bad == 0, bad
    finally:
        torch.set_default_dtype(torch.float32)


def check_files_and_parity():
    with tempfile.TemporaryDirectory() as d:
        # formats round-trip
        ids = np.random.default_rng(1).integers(0, 17, size=333)
        tp.write_tokens(f"{d}/t.tok", ids, 17)
        back, vocab = tp.read_tokens(f"{d}/t.tok")
        assert vocab == 17 and np.array_equal(back, ids)
        args = tiny_args()
        model = tp.Model(args)
        model.init_weights(2)
        tp.write_params(f"{d}/p.prm", model.named_parameters())
        params = tp.read_params(f"{d}/p.prm")
        assert list(params) == [n for n, _ in model.named_parameters()]
        for n, p in model.named_parameters():
            assert torch.equal(params[n], p.detach()), n
        # parameter names of docs/model.md
        names = set(params)
        for want in ["embed.weight", "final_norm.weight", "lm_head.weight",
                     "layers.0.norm.weight", "layers.0.mixer.in_proj.weight",
                     "layers.0.mixer.conv1d.weight", "layers.0.mixer.conv1d.bias",
                     "layers.0.mixer.dt_bias", "layers.0.mixer.A_log", "layers.0.mixer.D",
                     "layers.0.mixer.norm.weight", "layers.0.mixer.out_proj.weight",
                     "layers.1.mixer.q_proj.weight", "layers.1.mixer.k_proj.weight",
                     "layers.1.mixer.v_proj.weight", "layers.1.mixer.o_proj.weight",
                     "layers.2.mixer.gate_proj.weight", "layers.2.mixer.up_proj.weight",
                     "layers.2.mixer.down_proj.weight"]:
            assert want in names, want
        assert tuple(params["layers.0.mixer.in_proj.weight"].shape) == (2 * 32 + 2 * 2 * 6 + 4, 16)
        assert tuple(params["layers.0.mixer.conv1d.weight"].shape) == (32 + 2 * 2 * 6, 4)
        # data order: sample g = s*B + j is ids[(g*T + i) mod n]
        inp, tgt = tp.batch_at(ids, 3, args)
        for j in range(2):
            gidx = 3 * 2 + j
            want = [ids[(gidx * 20 + i) % ids.size] for i in range(21)]
            assert inp[j].tolist() == want[:-1] and tgt[j].tolist() == want[1:]
        # LR schedule
        a = tp.build_parser().parse_args(["--bench", "--lr", "1", "--warmup", "4", "--steps",
                                          "14", "--min-lr-ratio", "0.1"])
        assert abs(tp.lr_at(a, 0) - 0.25) < 1e-15 and abs(tp.lr_at(a, 3) - 1.0) < 1e-15
        # cosine over steps 4..13, reaching the floor on the last step (13), as piper
        mid = 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 5 / 9))
        assert abs(tp.lr_at(a, 4) - 1.0) < 1e-15 and abs(tp.lr_at(a, 9) - mid) < 1e-12
        assert abs(tp.lr_at(a, 13) - 0.1) < 1e-12 and abs(tp.lr_at(a, 20) - 0.1) < 1e-12
        # a piper YAML config feeds the flags; explicit flags win; 1e-3 (a YAML string) converts
        with open(f"{d}/c.yaml", "w") as f:
            f.write("model:\n  pattern: \"M*-\"\n  d_model: 32\ntrain:\n  steps: 40\n"
                    "  lr: 1e-3\n  warmup_steps: 4\ndata:\n  path: x.tok\n")
        a = tp.parse_args(["--bench", "--config", f"{d}/c.yaml", "--steps", "5"])
        assert (a.pattern, a.d_model, a.steps, a.schedule_steps, a.lr, a.warmup) == \
            ("M*-", 32, 5, 40, 1e-3, 4), vars(a)
        # --parity run from the written parameters: step-0 loss equals the model's loss
        argv = ["--parity", f"{d}/p.prm", "--tokens", f"{d}/t.tok", "--steps", "6",
                "--vocab", "17", "--d-model", "16", "--pattern", "M*-M", "--n-heads", "4",
                "--n-kv-heads", "2", "--ffn-hidden", "24", "--d-state", "6", "--head-dim", "8",
                "--n-groups", "2", "--ssd-chunk", "8", "--seq-len", "20", "--global-batch", "2",
                "--warmup", "2", "--lr", "1e-2"]
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            tp.main(argv)
        rows = [json.loads(x) for x in buf.getvalue().splitlines()]
        assert [r["step"] for r in rows] == list(range(6))
        with torch.no_grad():
            l0 = model(*tp.batch_at(ids, 0, args)).item()
        assert abs(rows[0]["loss"] - l0) < 1e-6, (rows[0]["loss"], l0)
        assert abs(rows[0]["lr"] - 5e-3) < 1e-15
        assert all(math.isfinite(r["loss"]) and r["grad_norm"] > 0 for r in rows)
        print(f"files, data order, LR schedule, --parity: ok (losses "
              f"{', '.join('%.4f' % r['loss'] for r in rows)})")


if __name__ == "__main__":
    torch.manual_seed(0)
    check_ssd()
    check_mixers()
    check_gradients()
    check_files_and_parity()
    print("torch_peer_check: all passed")
