#!/usr/bin/python3
"""tuner.py — what `piper tune` finds on the simulator against its baselines, for the four models of
config/examples/ the tuner is measured on (nemotron-h-8b, jamba-moe, mamba-attn-tail: hybrids whose
blocks differ in cost; llama-8b: the homogeneous Transformer control), on 64 H100s (the analytic
`--hardware h100-sxm` model, its 80 GB the memory limit). Each table is printed and written into
docs/tuner.md through scripts/doc-region.py:

- region `tuner-tight`: train.global_batch 64 (the configs' own; few microbatches per replica, so the
  bubble and the partition matter): per model the chosen strategy, its step and bubble, and its
  speedup over each baseline (the baseline's step / the chosen step): Megatron-style uniform
  interleaved 1F1B, uniform 1F1B and uniform DualPipeV, each at its best degrees under the same
  limit, and the best strategy without a pipeline (pp 1); the mean speedup over interleaved on the
  heterogeneous models;
- region `tuner-ample`: train.global_batch 1024: per model the chosen step against its lower bound
  (the step's compute at the chosen degrees spread evenly over the ranks: no bubble, no exposed
  communication), and the speedups over the baselines;
- region `tuner-time`: the search's wall time for nemotron-h-8b at each of --worlds ranks
  (train.global_batch 1024).

The targets (the mean tight speedup over interleaved on the heterogeneous models at least 1.25x; no
speedup below 1.0x in either regime; every ample step within 10% of its lower bound; the search at
512 ranks within 60 s) are marked met or not met from the figures of the run; the 1.0x floor holds
over all four baselines.

Usage: bench/tuner.py BUILD_DIR [--no-doc] [--out FILE] [--models a,b] [--worlds 64,512,1024]
Standard library only.
"""
import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sim_accuracy import ROOT  # noqa: E402

# name: heterogeneous (a hybrid whose blocks differ in cost), in table order
# The regime tables measure what the search finds, not how fast: jamba-moe at global_batch 1024 needs
# more than the default 60 s on 2 shared cores before anything fits. The search-time table keeps the default.
REGIME_BUDGET_S = 900
MODELS = {"nemotron-h-8b": True, "jamba-moe": True, "mamba-attn-tail": True, "llama-8b": False}
BASELINES = ("interleaved", "1f1b", "dualpipev", "no_pipeline")  # the order of `piper tune --json`'s "baselines"
HARDWARE = "h100-sxm"
WORLD = 64
TIGHT_BATCH, AMPLE_BATCH = 64, 1024  # train.global_batch of the two regimes
TIME_MODEL, TIME_BATCH = "nemotron-h-8b", AMPLE_BATCH
MEAN_TARGET = 1.25    # the mean tight speedup over interleaved on the heterogeneous models, at least
FLOOR = 1.0           # no speedup over a baseline below this, in either regime
BOUND_TARGET = 1.10   # the ample step over its lower bound, at most
TIME_WORLD, TIME_TARGET_S = 512, 60.0  # the search at this many ranks within this many seconds


def config_of(name):
    return f"config/examples/{name}.yaml"


def check_tune(piper):
    """Exits with a message unless `piper` is a binary with the `tune` command."""
    if not os.access(piper, os.X_OK):
        sys.exit(f"tuner.py: no piper binary at {piper}; build it first (make build, or cmake --build BUILD_DIR)")
    p = subprocess.run([piper, "--help"], capture_output=True, text=True)
    if not re.search(r"^\s+tune\s", p.stdout, re.MULTILINE):
        sys.exit(f"tuner.py: {piper} has no `tune` command (`piper --help` lists no `tune`); build piper from a "
                 "tree that has `piper tune` (src/cli/tune.cpp, docs/tuner.md)")


def tune(piper, name, world, batch, work, budget_s=None):
    """The JSON object `piper tune --json` prints for model `name` at `world` ranks and `batch`; `budget_s`
    replaces the default time budget."""
    out = os.path.join(work, f"{name}-{world}-{batch}.yaml")
    cmd = [piper, "tune", os.path.join(ROOT, config_of(name)), "--world", str(world), "--hardware", HARDWARE,
           "--set", f"train.global_batch={batch}", "-o", out, "--json"]
    if budget_s is not None:
        cmd += ["--time-budget-s", str(budget_s)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"tuner.py: {' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
    try:
        j = json.loads(p.stdout)
    except json.JSONDecodeError as e:
        sys.exit(f"tuner.py: {' '.join(cmd)} printed no JSON object on stdout ({e}):\n{p.stdout[-2000:]}")
    print(f"tuner.py: {name} at {world} ranks, global_batch {batch}: {j['chosen']['step_ms']:.2f} ms "
          f"({j['chosen']['label']}), search {j['search_s']:.1f} s", file=sys.stderr)
    return j


def speedups(j):
    """{baseline: its step / the chosen step, or None where nothing of that kind fits}."""
    chosen = j["chosen"]["step_ms"]
    return {b: (j["baselines"][b]["step_ms"] / chosen if j["baselines"][b] else None) for b in BASELINES}


def ratio(x):
    return f"{x:.3f}x" if x is not None else "nothing fits"


def met(ok):
    return "met" if ok else "**not met**"


def extremes(values, higher_is_better):
    """'worst 1.020x (model, baseline), best ...' over {(model, ...): ratio}, the Nones left out."""
    known = {k: v for k, v in values.items() if v is not None}
    if not known:
        return "no figure"
    lo, hi = min(known, key=known.get), max(known, key=known.get)
    worst, best = (lo, hi) if higher_is_better else (hi, lo)
    return f"worst {known[worst]:.3f}x ({', '.join(worst)}), best {known[best]:.3f}x ({', '.join(best)})"


def all_speedups(per_model):
    return {(m, b): v for m, s in per_model.items() for b, v in s.items()}


def strategy_note(runs):
    j = next(iter(runs.values()))
    return (f"cost model `{j['cost_source']}`, memory limit {j['mem_limit_bytes'] / 1e9:.1f} GB "
            f"({j['mem_limit_bytes'] / 2**30:.1f} GiB) per rank, {j['world']} ranks")


def floor_line(per_model):
    """The FLOOR target over {model: {baseline: speedup}}."""
    known = [v for s in per_model.values() for v in s.values() if v is not None]
    below = [(m, b, v) for m, s in per_model.items() for b, v in s.items() if v is not None and v < FLOOR]
    text = "; ".join(f"{m} against {b}: {v:.3f}x" for m, b, v in below)
    return (f"No speedup below {FLOOR:.2f}x over any of the {len(BASELINES)} baselines: "
            f"{met(bool(known) and not below)}"
            + (f" (below: {text})" if below else "") + ".")


def mean_line(hetero):
    """The MEAN_TARGET line over {heterogeneous model: speedup over interleaved or None}: the mean of
    the figures, naming the models where interleaved fits nothing (no figure to count)."""
    figures = {m: v for m, v in hetero.items() if v is not None}
    unfit = [m for m, v in hetero.items() if v is None]
    head = "Mean speedup over interleaved on the heterogeneous models"
    target = f"target at least {MEAN_TARGET:.2f}x"
    if not figures:
        why = "none among --models" if not hetero else f"interleaved fits nothing for {', '.join(unfit)}"
        return f"{head}: no figure ({why}); {target}: not measured."
    mean = statistics.mean(figures.values())
    left = f"; left out, interleaved fitting nothing: {', '.join(unfit)}" if unfit else ""
    return f"{head} ({', '.join(figures)}{left}): {mean:.3f}x; {target}: {met(mean >= MEAN_TARGET)}."


def tight_region(runs):
    per = {m: speedups(j) for m, j in runs.items()}
    lines = [
        "<!-- bench:tuner-tight:begin -->",
        f"Simulated {datetime.date.today()} by `bench/tuner.py` (part of `make bench`):",
        f"`piper tune config/examples/MODEL.yaml --world {WORLD} --hardware {HARDWARE} --set "
        f"train.global_batch={TIGHT_BATCH}`",
        f"({strategy_note(runs)}). Speedup: the baseline's simulated step over the chosen strategy's; each",
        "baseline at its best degrees under the same limit (interleaved: Megatron-style uniform interleaved 1F1B",
        "at its best virtual-stage count; no pipeline: the best strategy with pp 1).", "",
        "| model | chosen | step ms | bubble | vs interleaved | vs 1f1b | vs dualpipev | vs no pipeline |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for m, j in runs.items():
        c = j["chosen"]
        lines.append(f"| {m} | {c['label']} | {c['step_ms']:.2f} | {100 * c['bubble']:.1f}% | "
                     + " | ".join(ratio(per[m][b]) for b in BASELINES) + " |")
    lines += ["", mean_line({m: per[m]["interleaved"] for m in runs if MODELS[m]}), "",
              "Speedup " + extremes(all_speedups(per), True) + ".", floor_line(per), "<!-- bench:tuner-tight:end -->"]
    return "\n".join(lines)


def ample_region(runs):
    per = {m: speedups(j) for m, j in runs.items()}
    bound = {(m,): j["chosen"]["step_ms"] / j["chosen"]["lower_bound_ms"] for m, j in runs.items()}
    lines = [
        "<!-- bench:tuner-ample:begin -->",
        f"Simulated {datetime.date.today()} by `bench/tuner.py` (part of `make bench`): as the tight table with",
        f"`--set train.global_batch={AMPLE_BATCH}` ({strategy_note(runs)}). Lower bound: the step's",
        "compute at the chosen degrees spread evenly over the ranks, no bubble and no exposed communication.", "",
        "| model | chosen | step ms | lower bound ms | step / bound | vs interleaved | vs 1f1b | vs dualpipev | "
        "vs no pipeline |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for m, j in runs.items():
        c = j["chosen"]
        lines.append(f"| {m} | {c['label']} | {c['step_ms']:.2f} | {c['lower_bound_ms']:.2f} | {bound[(m,)]:.3f}x | "
                     + " | ".join(ratio(per[m][b]) for b in BASELINES) + " |")
    over = [f"{m} {v:.3f}x" for (m,), v in bound.items() if v > BOUND_TARGET]
    lines += ["", "Step / lower bound " + extremes(bound, False) + f"; target at most {BOUND_TARGET:.2f}x on every "
              f"model: {met(not over)}" + (f" (over: {', '.join(over)})" if over else "") + ".",
              "Speedup " + extremes(all_speedups(per), True) + ".",
              floor_line(per), "<!-- bench:tuner-ample:end -->"]
    return "\n".join(lines)


def time_region(runs):
    lines = [
        "<!-- bench:tuner-time:begin -->",
        f"Measured {datetime.date.today()} by `bench/tuner.py` (part of `make bench`) on {os.cpu_count()} CPUs: the "
        "wall time of the search (its own `search_s`) of",
        f"`piper tune {config_of(TIME_MODEL)} --world N --hardware {HARDWARE} --set train.global_batch={TIME_BATCH}`.",
        "Budget hit: the search's time budget ended it before every bound was reached.", "",
        "| ranks | search s | degree sets | simulations | budget hit | chosen | step ms |",
        "|---:|---:|---:|---:|---|---|---:|",
    ]
    for world, j in runs.items():
        lines.append(f"| {world} | {j['search_s']:.1f} | {j['candidates']} | {j['simulations']} | "
                     f"{'yes' if j['budget_hit'] else 'no'} | {j['chosen']['label']} | {j['chosen']['step_ms']:.2f} |")
    lines.append("")
    if TIME_WORLD in runs:
        s = runs[TIME_WORLD]["search_s"]
        lines.append(f"Search at {TIME_WORLD} ranks {s:.1f} s; target at most {TIME_TARGET_S:.0f} s: "
                     f"{met(s <= TIME_TARGET_S)}.")
    else:
        lines.append(f"Search at {TIME_WORLD} ranks: not run (--worlds {','.join(map(str, runs))}); target at most "
                     f"{TIME_TARGET_S:.0f} s: not measured.")
    lines.append("<!-- bench:tuner-time:end -->")
    return "\n".join(lines)


def write_region(out, name, block, prefix="bench:"):
    """The block into `out` between <!-- PREFIXNAME:begin --> and <!-- PREFIXNAME:end --> (scripts/doc-region.py)."""
    subprocess.run([sys.executable, os.path.join(ROOT, "scripts/doc-region.py"), out, name, prefix], input=block,
                   text=True, check=True)


def int_list(text):
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated rank counts such as 64,512,1024, found '{text}'")
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"rank counts must be at least 1, found '{text}'")
    return values


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("build")
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated subset of " + ",".join(MODELS))
    ap.add_argument("--worlds", type=int_list, default=[64, 512, 1024],
                    help=f"rank counts of the search-time table ({TIME_MODEL}; needs it among --models)")
    ap.add_argument("--out", default=os.path.join(ROOT, "docs/tuner.md"))
    ap.add_argument("--no-doc", action="store_true")
    a = ap.parse_args()
    models = a.models.split(",")
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        ap.error(f"--models: unknown model(s) {', '.join(unknown)}; expected a comma-separated subset of "
                 + ",".join(MODELS))
    models = [m for m in MODELS if m in models]
    piper = os.path.join(os.path.abspath(a.build), "piper")
    check_tune(piper)
    regions = []
    with tempfile.TemporaryDirectory() as work:
        tight = {m: tune(piper, m, WORLD, TIGHT_BATCH, work, REGIME_BUDGET_S) for m in models}
        regions.append(("tuner-tight", tight_region(tight)))
        ample = {m: tune(piper, m, WORLD, AMPLE_BATCH, work, REGIME_BUDGET_S) for m in models}
        regions.append(("tuner-ample", ample_region(ample)))
        if TIME_MODEL in models:
            timed = {w: (ample[TIME_MODEL] if w == WORLD and TIME_BATCH == AMPLE_BATCH
                         else tune(piper, TIME_MODEL, w, TIME_BATCH, work)) for w in a.worlds}
            regions.append(("tuner-time", time_region(timed)))
        else:
            print(f"tuner.py: no search-time table: it is of {TIME_MODEL}, not among --models", file=sys.stderr)
    for name, block in regions:
        print(block)
        if not a.no_doc:
            write_region(a.out, name, block)


if __name__ == "__main__":
    main()
