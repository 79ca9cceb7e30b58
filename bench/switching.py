#!/usr/bin/python3
"""switching.py — what changing the parallel strategy of a running job costs online (the state moved in
memory, docs/switching.md) against checkpoint and restart, for the same state: config/bench-checkpoint.yaml
(about 664 MiB of parameters and Adam moments) on 4 ranks, from strategy A (that of
scripts/bench-checkpoint.sh) to strategy B. Each of --rounds rounds measures, in turn:

1. online: `piper train` of the config with a `switch:` entry {at_step: 1, parallel: B} and
   train.steps 2; the switch event of --metrics gives the step loop's stall (build, plan, move), the
   bytes moved over the network and copied locally;
2. checkpoint and restart: the same A run saving a checkpoint after its one step (synchronous; the
   save's "step loop stalled X ms"), then a new `mpirun` of B with `--resume` of that checkpoint that
   runs no step (train.steps 1: "already completed"), timed from launch to exit. The restart costs the
   save's stall plus that wall time.

Then bench/p2p (BUILD_DIR/bench/p2p) measures the point-to-point bandwidth piper's communicator reaches
alone between pairs of the 4 ranks (0 <-> 2, 1 <-> 3), at the switch's chunk size (half of
train.switch_buffer_mb: one chunk out, one in) and at 64 MiB.

The table (medians over the rounds) is printed and written into docs/switching.md between
<!-- switch-bench:begin --> and <!-- switch-bench:end --> through scripts/doc-region.py. The target, marked
met or not met: the restart at least 20x the online switch.

Usage: bench/switching.py BUILD_DIR [--rounds N] [--out FILE] [--no-doc]
Standard library only. Environment: MPIRUN (default "mpirun --oversubscribe", plus --allow-run-as-root
as root).
"""
import argparse
import datetime
import glob
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sim_accuracy import ROOT, mpirun  # noqa: E402
from tuner import met, write_region  # noqa: E402

CONFIG = "config/bench-checkpoint.yaml"
NP = 4
# A: the strategy of scripts/bench-checkpoint.sh. B: no pipeline, parameters and moments sharded over 4
# data-parallel ranks (ZeRO-3): each rank's quarter lies mostly in the other stage or in another rank's
# moment shard under A, so about two thirds of the state cross the network (of the other 4-rank targets,
# tp 4 moves about as much, dp 4 ZeRO-1 a little less, pp 4 and tp 2 x pp 2 a third or less).
A = {"dp": 2, "pp": 2, "zero": 1}
B = {"dp": 4, "pp": 1, "zero": 3}
RATIO_TARGET = 20.0  # the restart's cost over the online switch's stall, at least
P2P_BYTES = 64 << 20  # the second size of the point-to-point bench
MIB = 1 << 20
med = statistics.median


def text(strategy):
    return ", ".join(f"{k} {v}" for k, v in strategy.items())


def sets(strategy, extra=()):
    out = []
    for k, v in strategy.items():
        out += ["--set", f"parallel.{k}={v}"]
    for s in extra:
        out += ["--set", s]
    return out


def run(cmd):
    """stdout and stderr of cmd together, and its wall time in ms; exits with both when it fails."""
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True)
    ms = (time.monotonic() - t0) * 1000
    if p.returncode != 0:
        sys.exit(f"switching.py: {' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-3000:]}{p.stderr[-3000:]}")
    return p.stdout + p.stderr, ms


def train(piper, config, strategy, build, extra=(), args=()):
    common = ["train.threads=1", f"data.path={os.path.join(build, 'data/corpus.tok')}"]
    return run(mpirun() + ["-np", str(NP), piper, "train", config, "--quiet"] + sets(strategy, common + list(extra))
               + list(args))


def online(piper, build, work):
    """The switch event of a run that switches from A to B at step 1."""
    config = os.path.join(work, "switch.yaml")
    with open(os.path.join(ROOT, CONFIG)) as f:
        base = f.read()
    with open(config, "w") as f:
        f.write(base.rstrip("\n") + "\nswitch:\n  - {at_step: 1, parallel: {"
                + ", ".join(f"{k}: {v}" for k, v in B.items()) + "}}\n")
    metrics = os.path.join(work, "switch.jsonl")
    train(piper, config, A, build, ["train.steps=2"], ["--metrics", metrics])
    with open(metrics) as f:
        events = [e for e in map(json.loads, f) if e.get("event") == "switch"]
    if len(events) != 1:
        sys.exit(f"switching.py: {metrics} holds {len(events)} switch events, expected 1 (at step 1)")
    return events[0]


def restart(piper, build, work):
    """(the save's step-loop stall, the resumed run's wall time from launch to exit), in ms."""
    ckpt = os.path.join(work, "ckpt")
    out, _ = train(piper, os.path.join(ROOT, CONFIG), A, build,
                   ["train.steps=1", f"checkpoint.dir={ckpt}", "checkpoint.every=1", "checkpoint.async=false"])
    m = re.search(r"piper: saved .* \(step loop stalled ([0-9.]+) ms\)", out)
    if not m:
        sys.exit(f"switching.py: the save run printed no 'saved ... (step loop stalled X ms)' line:\n{out[-3000:]}")
    files = glob.glob(os.path.join(ckpt, "step_*.h5"))
    if len(files) != 1:
        sys.exit(f"switching.py: {ckpt} holds {len(files)} checkpoints, expected the one of step 1")
    out, wall = train(piper, os.path.join(ROOT, CONFIG), B, build,
                      ["train.steps=1", f"checkpoint.dir={os.path.join(work, 'ckpt-b')}"], ["--resume", files[0]])
    if "already completed" not in out:
        sys.exit(f"switching.py: the resumed run under B did not stop at once ('already completed'):\n{out[-3000:]}")
    subprocess.run(["rm", "-rf", ckpt, os.path.join(work, "ckpt-b")], check=True)
    return float(m.group(1)), wall


def p2p(build, sizes):
    """{bytes: the bench's JSON line} of bench/p2p at each size."""
    exe = os.path.join(build, "bench/p2p")
    if not os.access(exe, os.X_OK):
        sys.exit(f"switching.py: no {exe}; build it (cmake --build BUILD_DIR --target p2p)")
    args = []
    for b in sizes:
        args += ["--bytes", str(b)]
    out, _ = run(mpirun() + ["-np", str(NP), exe] + args)
    return {j["bytes"]: j for j in (json.loads(line) for line in out.splitlines() if line.startswith("{"))}


def chunk_bytes(event):
    """The largest message of a switch: half its staging buffer in whole floats (one chunk out, one in;
    state::chunk_elems)."""
    return event["buffer_bytes"] // 2 // 4 * 4


def region(rounds, saves, walls, lines):
    """The markdown block between the markers, from each round's switch event, save stall and restart."""
    get = lambda key: [e[key] for e in rounds]  # noqa: E731
    stall, move = med(get("stall_ms")), med(get("move_ms"))
    moved, local = med(get("bytes_moved")), med(get("bytes_local"))
    cost = [s + w for s, w in zip(saves, walls)]
    ratio = med(c / s for c, s in zip(cost, get("stall_ms")))
    achieved = moved / MIB / (move / 1000)
    chunk = chunk_bytes(rounds[0])
    each = lambda xs: ", ".join(f"{x:.0f}" for x in xs)  # noqa: E731
    p = [(b, lines[b]) for b in sorted(lines)]
    out = [
        "<!-- switch-bench:begin -->",
        f"Measured {datetime.date.today()} by `bench/switching.py` (part of `make bench`) on a machine with "
        f"{os.cpu_count()} cores shared by the {NP} ranks: `{CONFIG}` ({(moved + local) / MIB:.0f} MiB of state moved "
        f"or copied), A = {text(A)} to B = {text(B)}, one thread per rank, train.switch_buffer_mb "
        f"{rounds[0]['buffer_bytes'] // MIB}; medians of {len(rounds)} rounds (each round's figure in brackets).",
        "",
        "| | median | rounds |",
        "|---|---:|---|",
        f"| online switch A -> B: step loop stalled | {stall:.0f} ms | {each(get('stall_ms'))} |",
        f"| of which build / plan / move | {med(get('build_ms')):.0f} / {med(get('plan_ms')):.0f} / {move:.0f} ms | |",
        f"| moved over the network / copied locally | {moved / MIB:.0f} / {local / MIB:.0f} MiB in {rounds[0]['rounds']} "
        "rounds | |",
        f"| achieved bandwidth (moved / move time, all ranks together) | {achieved:.0f} MiB/s | |",
        f"| checkpoint under A: step loop stalled (synchronous save) | {med(saves):.0f} ms | {each(saves)} |",
        f"| restart under B: `mpirun` to exit, `--resume` of that checkpoint | {med(walls):.0f} ms | {each(walls)} |",
        f"| checkpoint + restart | {med(cost):.0f} ms | {each(cost)} |",
        f"| **restart / online** | **{ratio:.1f}x** | |",
        "",
        f"Target: restart at least {RATIO_TARGET:.0f}x the online switch: {met(ratio >= RATIO_TARGET)}.",
        "",
        "The point-to-point bandwidth piper's communicator reaches alone (`bench/p2p`, the same 4 ranks in pairs "
        "0 <-> 2 and 1 <-> 3, every rank sending and receiving one message at a time as in a switch round; "
        "medians of the repetitions):",
        "",
        "| message | time | MiB/s per rank, each way | all ranks together |",
        "|---|---:|---:|---:|",
    ]
    for b, j in p:
        name = f"{b / MIB:.0f} MiB" + (" (the switch's chunk)" if b == chunk else "")
        out.append(f"| {name} | {j['ms']:.1f} ms | {j['mib_s']:.0f} | {j['mib_s'] * NP:.0f} MiB/s |")
    at_chunk = lines[chunk]["mib_s"] * NP
    per_round = moved / MIB / rounds[0]["rounds"]
    out += ["", f"The switch's move reaches {100 * achieved / at_chunk:.0f}% of the communicator's bandwidth at its "
            f"chunk size: its {rounds[0]['rounds']} rounds carry {per_round:.1f} MiB each on average over all ranks "
            f"(a round of full chunks would carry {NP * chunk / MIB:.0f} MiB), as the state moves block by block and "
            "tensor by tensor, and each round is a rendezvous of processes that share the cores; the rest of the "
            "move time is the packing into and out of the staging chunks, the local copies and the first touch of "
            "the new blocks.", "<!-- switch-bench:end -->"]
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("build")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(ROOT, "docs/switching.md"))
    ap.add_argument("--no-doc", action="store_true")
    a = ap.parse_args()
    if a.rounds < 1:
        ap.error(f"--rounds {a.rounds}: give at least 1")
    build = os.path.abspath(a.build)
    piper = os.path.join(build, "piper")
    if not os.access(piper, os.X_OK):
        sys.exit(f"switching.py: no piper binary at {piper}; build it first (make build)")
    rounds, saves, walls = [], [], []
    with tempfile.TemporaryDirectory() as work:
        for i in range(a.rounds):
            e = online(piper, build, work)
            save, wall = restart(piper, build, work)
            rounds.append(e), saves.append(save), walls.append(wall)
            print(f"switching.py: round {i + 1} of {a.rounds}: online stall {e['stall_ms']:.0f} ms (move "
                  f"{e['move_ms']:.0f} ms, {e['bytes_moved'] / MIB:.0f} MiB over the network, "
                  f"{e['bytes_local'] / MIB:.0f} MiB locally); save {save:.0f} ms + restart {wall:.0f} ms",
                  file=sys.stderr)
    lines = p2p(build, sorted({chunk_bytes(rounds[0]), P2P_BYTES}))
    block = region(rounds, saves, walls, lines)
    print(block)
    if not a.no_doc:
        write_region(a.out, "switch-bench", block, prefix="")


if __name__ == "__main__":
    main()
