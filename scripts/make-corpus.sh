#!/usr/bin/env bash
# make-corpus.sh — unpacks the shipped corpus and tokenizes it: BUILD_DIR/data/corpus.{txt,tok} (bytes) and
# BUILD_DIR/data/corpus-sp.{tok,model} (a SentencePiece BPE vocabulary of 4096 trained on it, make run's default).
# Usage: scripts/make-corpus.sh BUILD_DIR   (needs BUILD_DIR/piper; idempotent, quiet when up to date)
set -euo pipefail

build=${1:?usage: scripts/make-corpus.sh BUILD_DIR}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
xz_file=$root/data/corpus.txt.xz
txt=$build/data/corpus.txt
tok=$build/data/corpus.tok
sp_tok=$build/data/corpus-sp.tok
sp_vocab=4096

mkdir -p "$build/data"

# Text: redo when missing or older than the shipped archive. Write aside, then rename, so an
# interrupted run never leaves a partial corpus.txt that looks up to date.
if [[ ! -f $txt || $xz_file -nt $txt ]]; then
  echo "make-corpus: unpacking $xz_file -> $txt"
  xz -dc "$xz_file" >"$txt.partial"
  mv -f "$txt.partial" "$txt"
fi

# Tokens: redo when missing or older than the text (piper prepare writes atomically).
need_piper() {
  if [[ ! -x $build/piper ]]; then
    echo "make-corpus: $build/piper not found; build it first (make build)" >&2
    exit 1
  fi
}
if [[ ! -f $tok || $txt -nt $tok ]]; then
  need_piper
  echo "make-corpus: tokenizing $txt -> $tok"
  "$build/piper" prepare --quiet -o "$tok" "$txt"
fi
if [[ ! -f $sp_tok || $txt -nt $sp_tok || ! -f ${sp_tok%.tok}.model ]]; then
  need_piper
  echo "make-corpus: training a SentencePiece vocabulary of $sp_vocab and tokenizing $txt -> $sp_tok"
  "$build/piper" prepare --quiet --tokenizer-train "$sp_vocab" --model-type bpe -o "$sp_tok" "$txt"
fi
