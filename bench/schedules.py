#!/usr/bin/python3
"""schedules.py — what pairs, the schedules and recomputation buy: measured on this machine with 2
ranks (tp 2 with and without pairs; pp 2 1F1B, interleaved 1F1B, DualPipeV without and with pairs,
the same microbatches), simulated at scale with the analytic H100 model on
config/examples/hybrid-7b.yaml (tp 2, pp 8 and 16); and activation recomputation (none, selective,
full) measured at 1 rank beside its simulation, and simulated for the 7B hybrid. Prints the tables
and writes them into docs/benchmarks.md, region `schedules`.

Measured: the cases run in turn, `--rounds` times; a case's step time is the median over the
rounds of each run's median step time (steps --skip.. --steps-1); its exposed communication and
waits are the medians of the per-rank shares the executor measures (the time its compute stream
waits for collectives, `comm_ms`, and for receives, `idle_ms`, which a trace draws as the gaps of
the compute lane).

Usage: bench/schedules.py BUILD_DIR [--config FILE] [--steps N] [--skip N] [--rounds N]
                          [--out FILE] [--no-doc] [--no-measure]
Standard library only. Environment: MPIRUN (default "mpirun --oversubscribe", plus
--allow-run-as-root as root).
"""
import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sim_accuracy import ROOT, mpirun, run, wait_idle  # noqa: E402

COMMON = ["model.n_groups=2", "train.threads=1"]
MEASURED = [
    # name, ranks, --set overrides, the row it is compared with
    ("tp 2, 1f1b, m 4", 2, ["parallel.tp=2", "parallel.microbatches=4"], None),
    ("tp 2, 1f1b, m 4, pairs", 2, ["parallel.tp=2", "parallel.microbatches=4", "parallel.pairs=true"],
     "tp 2, 1f1b, m 4"),
    ("pp 2, 1f1b, m 8", 2, ["parallel.pp=2", "parallel.microbatches=8"], None),
    ("pp 2, interleaved v 2, m 8", 2, ["parallel.pp=2", "parallel.schedule=interleaved", "parallel.virtual_stages=2",
                                       "parallel.microbatches=8"], "pp 2, 1f1b, m 8"),
    ("pp 2, dualpipev, m 8", 2, ["parallel.pp=2", "parallel.schedule=dualpipev", "parallel.microbatches=8"],
     "pp 2, 1f1b, m 8"),
    ("pp 2, dualpipev, m 8, pairs", 2, ["parallel.pp=2", "parallel.schedule=dualpipev", "parallel.microbatches=8",
                                        "parallel.pairs=true"], "pp 2, 1f1b, m 8"),
]
RECOMPUTE = ["none", "selective", "full"]
SIM_CONFIG = "config/examples/hybrid-7b.yaml"
SIMULATED = [
    ("1f1b", ["parallel.schedule=1f1b", "parallel.pairs=false"]),
    ("interleaved v 2", ["parallel.schedule=interleaved", "parallel.virtual_stages=2", "parallel.pairs=false"]),
    ("dualpipev", ["parallel.schedule=dualpipev", "parallel.pairs=false"]),
    ("dualpipev, pairs", ["parallel.schedule=dualpipev", "parallel.pairs=true"]),
]


def sets(items):
    out = []
    for s in items:
        out += ["--set", s]
    return out


def measure(piper, config, ranks, extra, steps, skip, data, work):
    """(median step ms, median exposed-collective share, median receive-wait share, peak activation
    bytes of the largest rank) of one run."""
    metrics = os.path.join(work, "metrics.jsonl")
    run(mpirun() + ["-np", str(ranks), piper, "train", config, "--quiet", "--metrics", metrics,
                    "--set", f"train.steps={steps}", "--set", f"data.path={data}"] + sets(COMMON + extra))
    rows = [json.loads(line) for line in open(metrics)][skip:]
    med = statistics.median

    def share(key):
        return med(sum(x[key] for x in r["ranks"]) / (len(r["ranks"]) * r["step_ms"]) for r in rows)

    acts = max(x["mem_bytes"]["activations"] for r in rows for x in r["ranks"])
    return med(r["step_ms"] for r in rows), share("comm_ms"), share("idle_ms"), acts


def simulate(piper, args):
    """(step ms, bubble, mean exposed-communication share, peak bytes, peak activation bytes)."""
    j = json.loads(run([piper, "simulate", "--json"] + args))
    ranks = j["ranks"]
    comm = statistics.mean(r["comm_ms"] for r in ranks) / j["step_ms"]
    return (j["step_ms"], j["bubble"], comm, max(r["peak_mem_bytes"] for r in ranks),
            max(r["mem_bytes"]["activations"] for r in ranks))


def simulate_hybrid(piper, pp, extra):
    return simulate(piper, [os.path.join(ROOT, SIM_CONFIG), "--hardware", "h100-sxm", "--set", f"parallel.pp={pp}"] +
                    sets(extra))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("build")
    ap.add_argument("--config", default=os.path.join(ROOT, "config/bench-parallel.yaml"))
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--skip", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(ROOT, "docs/benchmarks.md"))
    ap.add_argument("--no-doc", action="store_true")
    ap.add_argument("--no-measure", action="store_true")
    a = ap.parse_args()
    piper = os.path.join(os.path.abspath(a.build), "piper")
    data = os.path.join(os.path.abspath(a.build), "data/corpus.tok")
    med = statistics.median
    lines = ["<!-- bench:schedules:begin -->", "## Schedules and pairs", ""]
    if not a.no_measure:
        cases = MEASURED + [(f"1 rank, m 2, recompute {m}", 1, ["parallel.microbatches=2", f"parallel.recompute={m}"],
                             None) for m in RECOMPUTE]
        per = {name: [] for name, *_ in cases}
        with tempfile.TemporaryDirectory() as work:
            for rnd in range(a.rounds):
                for name, ranks, extra, _ in cases:
                    wait_idle(10)
                    per[name].append(measure(piper, a.config, ranks, extra, a.steps, a.skip, data, work))
                    print(f"schedules.py: round {rnd + 1}/{a.rounds}: {name}: {per[name][-1][0]:.1f} ms",
                          file=sys.stderr)
        lines += [
            f"Measured {datetime.date.today()} by `bench/schedules.py` (part of `make bench`) on {os.cpu_count()} CPUs:",
            f"`{os.path.relpath(a.config, ROOT)}` with {' '.join('`' + c + '`' for c in COMMON)}, 2 ranks, "
            f"{a.rounds} rounds of every case in turn. Step time: the median over the rounds of each run's median",
            f"(steps {a.skip}..{a.steps - 1}); the ratio is taken round by round against the row named, then the",
            "median. Exposed collectives and receive waits: the share of the step the compute stream waits (the",
            "executor's `comm_ms` and `idle_ms`, the gaps of a trace's compute lane), per rank, median.",
            "",
            "| case | step ms | against | ratio | exposed collectives | receive waits |",
            "|---|---:|---|---:|---:|---:|",
        ]
        for name, _, _, base in MEASURED:
            r = per[name]
            ratio = med(x[0] / y[0] for x, y in zip(r, per[base])) if base else 1.0
            lines.append(f"| {name} | {med(x[0] for x in r):.1f} | {base or '-'} | {ratio:.3f} | "
                         f"{100 * med(x[1] for x in r):.1f}% | {100 * med(x[2] for x in r):.1f}% |")
        lines.append("")
    lines += [
        f"Simulated with the analytic H100 model (`piper simulate {SIM_CONFIG} --hardware h100-sxm`): the",
        "~7B Nemotron-H-like hybrid, tp 2, 32 microbatches of 2 sequences of 4096 tokens. The same model,",
        "batch and microbatches for every schedule; peak is the largest rank's.",
        "",
        "| pp | schedule | step ms | vs 1f1b | bubble | exposed comm | peak GiB |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for pp in (8, 16):
        base = None
        for name, extra in SIMULATED:
            step, bubble, comm, peak, _ = simulate_hybrid(piper, pp, extra)
            base = base or step
            lines.append(f"| {pp} | {name} | {step:.1f} | {100 * (base / step - 1):+.1f}% | {100 * bubble:.1f}% | "
                         f"{100 * comm:.1f}% | {peak / 2**30:.1f} |")
    lines += ["", "Activation recomputation (`parallel.recompute`). Measured: the 1-rank runs above; simulated: the",
              "same config with the analytic model of this kind of CPU (`--hardware cpu-local`; its times are the",
              "analytic model's, not this machine's calibration), and the 7B hybrid at pp 8 (tp 2, DualPipeV with",
              "pairs) on H100s. Peak activations are the largest rank's.", "",
              "| recompute | measured ms | measured peak act. MiB | simulated ms | simulated peak act. MiB | "
              "7B pp 8 ms | 7B pp 8 peak act. GiB | 7B pp 8 peak GiB |",
              "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for m in RECOMPUTE:
        name = f"1 rank, m 2, recompute {m}"
        meas = (f"{med(x[0] for x in per[name]):.1f} | {max(x[3] for x in per[name]) / 2**20:.2f}"
                if not a.no_measure else "- | -")
        small = simulate(piper, [a.config, "--hardware", "cpu-local", "--world", "1"] +
                         sets(COMMON + ["parallel.microbatches=2", f"parallel.recompute={m}"]))
        big = simulate_hybrid(piper, 8, ["parallel.schedule=dualpipev", "parallel.pairs=true", f"parallel.recompute={m}"])
        lines.append(f"| {m} | {meas} | {small[0]:.1f} | {small[4] / 2**20:.2f} | {big[0]:.1f} | "
                     f"{big[4] / 2**30:.1f} | {big[3] / 2**30:.1f} |")
    lines.append("<!-- bench:schedules:end -->")
    block = "\n".join(lines)
    print(block)
    if a.no_doc:
        return
    text = open(a.out).read() if os.path.exists(a.out) else "# Benchmarks\n"
    begin, end = "<!-- bench:schedules:begin -->", "<!-- bench:schedules:end -->"
    if begin in text and end in text:
        text = text[:text.index(begin)] + block + text[text.index(end) + len(end):]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    open(a.out, "w").write(text)


if __name__ == "__main__":
    main()
