#!/usr/bin/env python3
# assemble.py — rebuilds data/corpus.txt.xz (the shipped training corpus) from the
# English texts of a Debian 12 system; see data/README.md. Run from the repo root.
"""Writes data/corpus/{licenses,gnu-manuals}.txt, then data/corpus.txt.xz.

Only needed to change the corpus: the build reads data/corpus.txt.xz.
The text is folded to 7-bit ASCII so every byte the byte-level model sees
is a printable character, a newline or a tab.
"""
import gzip
import lzma
import pathlib
import re
import unicodedata

LICENSES = ["GPL-3", "GPL-2", "LGPL-3", "LGPL-2.1", "GFDL-1.3", "Apache-2.0",
            "MPL-2.0", "MPL-1.1", "Artistic", "CC0-1.0", "BSD"]
# GNU manuals (Info files, GFDL 1.2/1.3). Their own copies of the licences, their
# indices and code tables are dropped: the licences are in licenses.txt once,
# and indices and tables are not prose.
MANUALS = ["coreutils", "grep", "sed", "gzip", "diffutils", "find", "m4", "wget", "time", "ed",
           "gettext", "automake-1.16", "rluserman"]
SKIP_NODE = re.compile(r"^GNU (Free Documentation License|FDL|LGPL|GPL)$|[Ii]ndex$"
                       r"|^Available Packages$|Language Codes$|^Country Codes$")

ASCII_MAP = {"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"', "\u2014": "--",
             "\u2013": "-", "\u2026": "...", "\u00a9": "(C)", "\u2022": "*", "\u00a0": " ",
             "\u2192": "->", "\u21d2": "=>", "\u2264": "<=", "\u2265": ">=", "\u00d7": "x",
             "\u2212": "-", "\u00ab": "<<", "\u00bb": ">>", "\u22a3": "-|", "\u21a6": "|->"}


def to_ascii(text):
    text = "".join(ASCII_MAP.get(c, c) for c in text)
    text = unicodedata.normalize("NFKD", text)
    return "".join(c for c in text if c in "\n\t" or " " <= c <= "~")


def info_text(name):
    parts = sorted(pathlib.Path("/usr/share/info").glob(name + ".info*.gz"),
                   key=lambda p: (len(p.name), p.name))
    raw = "".join(gzip.open(p, "rt", encoding="utf-8").read() for p in parts)
    out = []
    for node in raw.split("\x1f")[1:]:
        lines = node.strip("\n").split("\n")
        head = re.match(r"File: [^,]+,\s+Node: ([^,]+),", lines[0])
        if not head or SKIP_NODE.search(head.group(1)):
            continue  # tag tables, indirect tables, skipped nodes
        body = []
        for line in lines[1:]:
            if line.startswith("* Menu:"):
                break  # a menu ends its node
            body.append(line.rstrip())
        text = "\n".join(body).strip("\n")
        if text:
            out.append(text)
    return "\n\n".join(out)


def main():
    root = pathlib.Path("data")
    lic = [to_ascii(pathlib.Path("/usr/share/common-licenses", n).read_text()).strip("\n")
           for n in LICENSES]
    man = [to_ascii(info_text(n)) for n in MANUALS]
    files = {"licenses.txt": lic, "gnu-manuals.txt": man}
    whole = []
    for fname, docs in files.items():
        text = "\n\n".join(docs) + "\n"
        (root / "corpus" / fname).write_text(text)
        whole.append(text)
    corpus = "\n".join(whole)  # a blank line between the files, as `piper prepare` does
    with lzma.open(root / "corpus.txt.xz", "wt", preset=9 | lzma.PRESET_EXTREME,
                   check=lzma.CHECK_CRC64) as f:
        f.write(corpus)
    print(f"corpus: {len(corpus)} bytes raw, {(root / 'corpus.txt.xz').stat().st_size} xz")


if __name__ == "__main__":
    main()
