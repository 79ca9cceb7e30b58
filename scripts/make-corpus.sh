#!/usr/bin/env bash
# make-corpus.sh — unpacks the shipped corpus and tokenizes it: BUILD_DIR/data/corpus.{txt,tok}.
# Usage: scripts/make-corpus.sh BUILD_DIR   (needs BUILD_DIR/piper; idempotent, quiet when up to date)
set -euo pipefail

build=${1:?usage: scripts/make-corpus.sh BUILD_DIR}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
xz_file=$root/data/corpus.txt.xz
txt=$build/data/corpus.txt
tok=$build/data/corpus.tok

mkdir -p "$build/data"

# Text: redo when missing or older than the shipped archive. Write aside, then rename, so an
# interrupted run never leaves a partial corpus.txt that looks up to date.
if [[ ! -f $txt || $xz_file -nt $txt ]]; then
  echo "make-corpus: unpacking $xz_file -> $txt"
  xz -dc "$xz_file" >"$txt.partial"
  mv -f "$txt.partial" "$txt"
fi

# Tokens: redo when missing or older than the text (piper prepare writes atomically).
if [[ ! -f $tok || $txt -nt $tok ]]; then
  if [[ ! -x $build/piper ]]; then
    echo "make-corpus: $build/piper not found; build it first (make build)" >&2
    exit 1
  fi
  echo "make-corpus: tokenizing $txt -> $tok"
  "$build/piper" prepare -o "$tok" "$txt"
fi
