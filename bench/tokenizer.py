#!/usr/bin/python3
"""tokenizer.py — the data benchmark of `make bench` (docs/benchmarks.md, "Data"):

1. `piper prepare` on the shipped corpus: tokens/s and bytes/token for the byte tokenizer and for
   SentencePiece BPE and unigram vocabularies of 4096 (training time apart), the median of 3 runs;
2. the held-out loss after `make run`'s training (config/default.yaml: 300 steps) on the byte and on
   the subword token file, in bits per byte so the two compare: the mean loss over the evaluated
   targets (nats per token) times their count, over ln 2 times the bytes those targets spell.

Usage: bench/tokenizer.py BUILD_DIR [--steps N] [--runs N]
"""
import argparse
import json
import math
import os
import re
import statistics
import struct
import subprocess
import sys
import tempfile

import sentencepiece
import yaml

from sim_accuracy import ROOT, run, wait_idle  # noqa: E402

VOCAB = 4096


def prepare(piper, corpus, out, extra):
    """One `piper prepare`: (tokens, seconds encoding and writing, seconds training)."""
    text = run([piper, "prepare", "--quiet", "-o", out, corpus] + extra)
    m = re.search(r"wrote (\d+) tokens .* in ([0-9.]+) s:", text)
    t = re.search(r"trained the tokenizer model .* in ([0-9.]+) s", text)
    return int(m.group(1)), float(m.group(2)), float(t.group(1)) if t else 0.0


def read_ids(path):
    with open(path, "rb") as f:
        head = f.read(40)
        _version, _vocab, width, _kind, count, _hash = struct.unpack("<IIIIQQ", head[8:40])
        data = f.read(count * width)
    return struct.unpack(f"<{count}{'H' if width == 2 else 'I'}", data)


def piece_bytes(model_path):
    """Bytes each id of a SentencePiece model spells (a byte piece <0xNN> one, '▁' a space)."""
    sp = sentencepiece.SentencePieceProcessor(model_file=model_path)
    out = []
    for i in range(sp.get_piece_size()):
        p = sp.id_to_piece(i)
        if sp.is_byte(i):
            out.append(1)
        elif sp.is_control(i) or sp.is_unknown(i):
            out.append(0)
        else:
            out.append(len(p.replace("\u2581", " ").encode("utf-8")))
    return out


def held_out_bytes(ids, cfg, nbytes):
    """Targets and the bytes they spell, of the sequences one evaluation reads (docs/data.md)."""
    t = cfg["train"]
    T, gb, f = t["seq_len"], t["global_batch"], cfg["data"]["eval_fraction"]
    S = (len(ids) - 1) // T
    first = (S - math.ceil(f * S)) * T
    targets = spelled = 0
    for k in range(t.get("eval_batches", 4) * gb):
        seq = ids[first + k * T + 1: first + k * T + T + 1]
        targets += len(seq)
        spelled += sum(nbytes(i) for i in seq)
    return targets, spelled


def last_eval(piper, cfg_path, sets, metrics):
    cmd = [piper, "train", cfg_path, "--quiet", "--metrics", metrics]
    for s in sets:
        cmd += ["--set", s]
    run(cmd)
    rows = [json.loads(line) for line in open(metrics) if line.strip()]
    return [r for r in rows if "eval_loss" in r][-1]["eval_loss"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--steps", type=int, default=0, help="training steps (default: config/default.yaml's)")
    ap.add_argument("--runs", type=int, default=3, help="prepare runs per tokenizer")
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    piper = os.path.join(build, "piper")
    corpus = os.path.join(build, "data", "corpus.txt")
    nbytes_corpus = os.path.getsize(corpus)
    work = tempfile.mkdtemp(prefix="piper-bench-tokenizer.")
    cores = os.cpu_count()

    print(f"\n### Data: `piper prepare` on the corpus ({nbytes_corpus / 1e6:.1f} MB), median of {a.runs} runs, "
          f"{cores} CPUs\n")
    print("| tokenizer | vocab | tokens | bytes/token | encode + write, s | tokens/s | MB/s | training, s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    kinds = [("byte", 256, []),
             ("SentencePiece BPE", VOCAB, ["--tokenizer-train", str(VOCAB), "--model-type", "bpe"]),
             ("SentencePiece unigram", VOCAB, ["--tokenizer-train", str(VOCAB), "--model-type", "unigram"])]
    for name, vocab, extra in kinds:
        results = []
        for r in range(a.runs):
            wait_idle(10)
            results.append(prepare(piper, corpus, os.path.join(work, f"p{r}.tok"), extra))
        n = results[0][0]
        enc = statistics.median(x[1] for x in results)
        train = statistics.median(x[2] for x in results)
        print(f"| {name} | {vocab} | {n} | {nbytes_corpus / n:.2f} | {enc:.2f} | {n / enc:,.0f} | "
              f"{nbytes_corpus / 1e6 / enc:.1f} | {train:.1f} |" if extra else
              f"| {name} | {vocab} | {n} | {nbytes_corpus / n:.2f} | {enc:.2f} | {n / enc:,.0f} | "
              f"{nbytes_corpus / 1e6 / enc:.1f} | — |", flush=True)

    cfg_path = os.path.join(ROOT, "config", "default.yaml")
    cfg = yaml.safe_load(open(cfg_path))
    steps = a.steps or cfg["train"]["steps"]
    cfg["train"]["steps"] = steps
    sub_tok = os.path.join(build, "data", "corpus-sp.tok")
    byte_tok = os.path.join(build, "data", "corpus.tok")
    sub_bytes = piece_bytes(os.path.join(build, "data", "corpus-sp.model"))
    runs = [("byte", byte_tok, 256, lambda i: 1),
            ("SentencePiece BPE", sub_tok, VOCAB, lambda i: sub_bytes[i])]
    print(f"\n### Data: held-out loss after `make run`'s training (config/default.yaml, {steps} steps, 1 rank)\n")
    print("| tokenizer | vocab | held-out targets | bytes they spell | loss, nats/token | bits/byte |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, tok, vocab, nbytes in runs:
        wait_idle(10)
        sets = [f"data.path={tok}", f"model.vocab_size={vocab}", f"train.steps={steps}", "train.sample_every=0"]
        loss = last_eval(piper, cfg_path, sets, os.path.join(work, "m.jsonl"))
        targets, spelled = held_out_bytes(read_ids(tok), cfg, nbytes)
        bpb = loss * targets / (math.log(2) * spelled)
        print(f"| {name} | {vocab} | {targets} | {spelled} | {loss:.4f} | {bpb:.3f} |", flush=True)
    print("\nMeasured by `bench/tokenizer.py` (part of `make bench`).")


if __name__ == "__main__":
    sys.exit(main())
