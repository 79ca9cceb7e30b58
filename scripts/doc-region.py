#!/usr/bin/python3
"""doc-region.py — replaces the marked region NAME of a markdown file with the
text on stdin (which carries its own markers), or appends it when the file has
none: `doc-region.py FILE NAME [PREFIX] < block`. Markers: <!-- PREFIXNAME:begin -->
and <!-- PREFIXNAME:end -->, PREFIX "bench:" unless given. Writes atomically."""
import os
import sys

path, name = sys.argv[1], sys.argv[2]
prefix = sys.argv[3] if len(sys.argv) > 3 else "bench:"
block = sys.stdin.read().rstrip("\n")
begin, end = f"<!-- {prefix}{name}:begin -->", f"<!-- {prefix}{name}:end -->"
text = open(path).read()
i, j = text.find(begin), text.find(end)
if i >= 0 and j > i:
    text = text[:i] + block + text[j + len(end):]
else:
    if text and not text.endswith("\n"):
        text += "\n"
    text += "\n" + block + "\n"
with open(path + ".tmp", "w") as f:
    f.write(text)
os.replace(path + ".tmp", path)
