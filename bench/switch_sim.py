#!/usr/bin/python3
"""switch_sim.py — online strategy switches of a 70B model simulated at scale: `piper plan-switch` on
config/examples/llama-70b.yaml (Llama-3-70B sizes) on h100-sxm (8 ranks to a host), between
strategies at 512 and 1024 ranks and a shrink from 1024 to 512. The table (bytes moved over the
network and copied locally, the planned peak above each rank's own, rounds and messages, the
predicted switch time and its parts, the planning time) is printed and written into
docs/switching.md (region `switch-sim`, scripts/doc-region.py), beside DynaTrain's reported switch of
a 70B model in under 2 s.

The predicted times do not depend on the machine; the planning time does (the wall time of
plan_switch in the command, on this machine's cores).

Usage: bench/switch_sim.py BUILD_DIR [--no-doc] [--out FILE]
Standard library only.
"""
import argparse
import datetime
import json
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sim_accuracy import ROOT  # noqa: E402

CONFIG = "config/examples/llama-70b.yaml"
HARDWARE = "h100-sxm"
RANKS_PER_HOST = 8
DYNATRAIN_S = 2.0  # DynaTrain: a 70B model's switch in under this
GIB = 1024 ** 3
# name: (world_from, sets of FROM, world_to, sets of TO); the config's parallel section is tp8 pp8 dp8 zero1.
CASES = {
    "more stages, 512": (512, [], 512, ["parallel.pp=16", "parallel.dp=4"]),
    "more stages, 1024": (1024, ["parallel.dp=16"], 1024, ["parallel.pp=16", "parallel.dp=8"]),
    "shrink 1024 -> 512": (1024, ["parallel.dp=16"], 512, []),
}


def check_plan_switch(piper):
    """Exits with a message unless `piper` is a binary with the `plan-switch` command."""
    if not os.access(piper, os.X_OK):
        sys.exit(f"switch_sim.py: no piper binary at {piper}; build it first (make build, or cmake --build BUILD_DIR)")
    p = subprocess.run([piper, "--help"], capture_output=True, text=True)
    if not re.search(r"^\s+plan-switch\s", p.stdout, re.MULTILINE):
        sys.exit(f"switch_sim.py: {piper} has no `plan-switch` command; build piper from a tree that has it "
                 "(src/cli/plan_switch.cpp, docs/switching.md)")


def plan_switch(piper, world_from, sets_from, world_to, sets_to):
    """The JSON object `piper plan-switch --json` prints for one case."""
    config = os.path.join(ROOT, CONFIG)
    cmd = [piper, "plan-switch", config, config, "--world-from", str(world_from), "--world-to", str(world_to),
           "--hardware", HARDWARE, "--ranks-per-host", str(RANKS_PER_HOST), "--json"]
    for s in sets_from:
        cmd += ["--set-from", s]
    for s in sets_to:
        cmd += ["--set-to", s]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"switch_sim.py: {' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
    try:
        return json.loads(p.stdout)
    except json.JSONDecodeError as e:
        sys.exit(f"switch_sim.py: {' '.join(cmd)} printed no JSON object on stdout ({e}):\n{p.stdout[-2000:]}")


def command_of(world_from, sets_from, world_to, sets_to):
    sets = [f"--set-from {s}" for s in sets_from] + [f"--set-to {s}" for s in sets_to]
    return (f"--world-from {world_from} --world-to {world_to}" + (" " if sets else "") + " ".join(sets))


def region(runs):
    lines = [
        "<!-- bench:switch-sim:begin -->",
        f"Simulated {datetime.date.today()} by `bench/switch_sim.py` (part of `make bench`):",
        f"`piper plan-switch {CONFIG} {CONFIG} --hardware {HARDWARE} --ranks-per-host {RANKS_PER_HOST}` with the",
        "worlds and `--set-from` / `--set-to` of each row, 64 MiB staging (32 MiB messages). Moved: over the network; local: copied",
        "within a process. Peak above: the most any process holds during the switch beyond the larger of what it",
        f"holds before and after. Planning: the wall time of `plan_switch` on this machine ({os.cpu_count()} CPUs,",
        "shared with other work while it ran), the two plans' compilation not included.", "",
        "| switch | from | to | moved GiB | local GiB | peak above GiB | blocks | rounds | messages | "
        "predicted s | network s | local s | planning s |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, j in runs.items():
        lines.append(f"| {name} | {j['from']['world']}: {j['from']['strategy']} | {j['to']['world']}: "
                     f"{j['to']['strategy']} | {j['bytes_moved'] / GIB:.1f} | {j['bytes_local'] / GIB:.1f} | "
                     f"{j['peak_above_bytes_max'] / GIB:.3f} | {j['blocks']} | {j['rounds']} | {j['messages']} | "
                     f"{j['predicted_s']:.3f} | {j['network_s']:.3f} | {j['local_s']:.3f} | {j['planning_s']:.2f} |")
    slowest = max(j["predicted_s"] for j in runs.values())
    lines += ["", f"Slowest predicted switch {slowest:.3f} s; DynaTrain reports under {DYNATRAIN_S:.0f} s for a 70B "
              f"model: {'within' if slowest < DYNATRAIN_S else 'not within'} it.",
              "Commands: " + "; ".join(f"{n}: `{command_of(*CASES[n])}`" for n in runs) + ".",
              "<!-- bench:switch-sim:end -->"]
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("build")
    ap.add_argument("--out", default=os.path.join(ROOT, "docs/switching.md"))
    ap.add_argument("--no-doc", action="store_true")
    a = ap.parse_args()
    piper = os.path.join(os.path.abspath(a.build), "piper")
    check_plan_switch(piper)
    runs = {}
    for name, case in CASES.items():
        runs[name] = plan_switch(piper, *case)
        print(f"switch_sim.py: {name}: {runs[name]['bytes_moved'] / GIB:.1f} GiB moved, "
              f"{runs[name]['predicted_s']:.3f} s predicted, planned in {runs[name]['planning_s']:.2f} s",
              file=sys.stderr)
    block = region(runs)
    print(block)
    if not a.no_doc:
        subprocess.run([sys.executable, os.path.join(ROOT, "scripts/doc-region.py"), a.out, "switch-sim"],
                       input=block, text=True, check=True)


if __name__ == "__main__":
    main()
