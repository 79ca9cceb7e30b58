#!/usr/bin/python3
"""moe.py — the MoE benchmarks of `make bench`, each table printed and written into
docs/benchmarks.md through scripts/doc-region.py:

- region `moe-block`: an MoE block's forward + backward throughput against a dense SwiGLU MLP
  block of the same active parameters (MLP hidden = top_k x moe_ffn_hidden), one rank, one
  thread, a few sizes (BUILD_DIR/bench/moe_block);
- region `alltoall`: all-to-all time and bandwidth per message size over 2 and 4 ranks through
  piper's communicator (ialltoallv, equal and skewed counts) beside plain MPI_Alltoallv of the
  same counts in the same run (BUILD_DIR/bench/alltoall);
- region `moe-parallel`: config/examples/jamba-like.yaml at ep 2 (dp 2 ep 2 on 2 ranks; dp 2 ep 2
  pp 2 DualPipeV on 4 ranks, without and with pairs; 4 microbatches): measured step time and
  exposed all-to-all share beside `piper simulate` with a cost file from `piper calibrate` of the
  same strategy on as many ranks.

Exposed all-to-all (measured and simulated alike, from `--trace`): per rank and step, the time its
compute lane waits on its ALLTOALL nodes (the part of each one's flight inside the idle gap before
the compute of the same unit and microbatch that follows it), over the step time; the mean over
ranks, the median over the traced steps. Exposed communication: the share of the step the
compute stream waits for collectives (the executor's `comm_ms`; the simulator's `comm_ms`).

Usage: bench/moe.py BUILD_DIR [--only block,alltoall,parallel] [--reps N] [--a2a-reps N]
                    [--steps N] [--skip N] [--rounds N] [--out FILE] [--no-doc]
Standard library only. Environment: MPIRUN (default "mpirun --oversubscribe", plus
--allow-run-as-root as root).
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sim_accuracy import ROOT, mpirun, run, wait_idle  # noqa: E402

CONFIG = "config/examples/jamba-like.yaml"
COMMON = ["parallel.dp=2", "parallel.ep=2", "parallel.microbatches=4", "train.threads=1"]
PP2 = ["parallel.pp=2", "parallel.schedule=dualpipev"]
# name, ranks, --set overrides on top of COMMON, the calibration it is simulated with
CASES = [
    ("dp 2 ep 2", 2, [], "2 ranks"),
    ("dp 2 ep 2 pp 2, dualpipev", 4, PP2, "4 ranks"),
    ("dp 2 ep 2 pp 2, dualpipev, pairs", 4, PP2 + ["parallel.pairs=true"], "4 ranks"),
]
# calibration name -> (ranks, overrides): the strategy of the cases simulated with it
CALIBRATIONS = {"2 ranks": (2, []), "4 ranks": (4, PP2)}
A2A_RANKS = (2, 4)
WAIT_IDLE_S = 5
med = statistics.median


def sets(items):
    out = []
    for s in items:
        out += ["--set", s]
    return out


def json_lines(text):
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def write_region(out, name, block):
    subprocess.run([sys.executable, os.path.join(ROOT, "scripts/doc-region.py"), out, name], input=block, text=True,
                   check=True)


def mib(b):
    return f"{b / 2**20:g} MiB" if b >= 2**20 else f"{b / 2**10:g} KiB"


# ---- the block --------------------------------------------------------------------------

def block_region(build, reps):
    wait_idle(WAIT_IDLE_S)
    rows = json_lines(run([os.path.join(build, "bench/moe_block"), "--threads", "1", "--reps", str(reps)]))
    lines = [
        "<!-- bench:moe-block:begin -->", "## MoE block against a dense MLP block", "",
        f"Measured {datetime.date.today()} by `bench/moe.py` (`bench/moe_block`, part of `make bench`) on "
        f"{os.cpu_count()} CPUs, one rank, one thread: forward + fused backward of one block through the",
        "units training runs, the MoE block (router, top-k, permutation, per-expert SwiGLU, weighted combine,",
        "balance loss) against a SwiGLU MLP block of hidden top_k x expert hidden, the same active parameters",
        f"but for the router; inputs normal(0, 1), sequences of 128 tokens. Medians of {reps} repetitions, the two",
        "blocks alternating.", "",
        "| d_model | experts | top_k | expert hidden | rows | active params | MoE tokens/s | MLP tokens/s | MoE / MLP |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(f"| {r['d_model']} | {r['n_experts']} | {r['top_k']} | {r['moe_ffn_hidden']} | {r['rows']} | "
                     f"{r['moe_active_params'] / 1e6:.2f} M | {r['moe_tokens_per_s']:.0f} | {r['mlp_tokens_per_s']:.0f} | "
                     f"{r['ratio']:.2f} |")
    lines.append("<!-- bench:moe-block:end -->")
    return "\n".join(lines)


# ---- the all-to-all ---------------------------------------------------------------------

def alltoall_region(build, reps):
    rows = []
    for n in A2A_RANKS:
        wait_idle(WAIT_IDLE_S)
        rows += json_lines(run(mpirun() + ["-np", str(n), os.path.join(build, "bench/alltoall"), "--reps", str(reps)]))
    lines = [
        "<!-- bench:alltoall:begin -->", "## All-to-all", "",
        f"Measured {datetime.date.today()} by `bench/moe.py` (`bench/alltoall`, part of `make bench`) on "
        f"{os.cpu_count()} CPUs, all ranks on this host: piper's",
        "`Communicator::ialltoallv` (what the MoE dispatch and combine run; non-blocking, with the progress thread)",
        "and a plain blocking `MPI_Alltoallv` of the same counts on a duplicate of `MPI_COMM_WORLD`, alternating",
        f"repetition by repetition; a repetition's time is the maximum over ranks, the median of {reps}. Bytes: what",
        "each rank sends, its own block included; GB/s: those bytes over the time. `equal`: bytes / n to every",
        "rank; `variable`: rank i sends rank j a share proportional to 1 / (j + 1) (tokens skewed towards a hot",
        "expert's rank), the rounding remainder to itself.", "",
        "| ranks | counts | bytes per rank | piper ms | MPI ms | piper / MPI | piper GB/s | MPI GB/s |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(f"| {r['ranks']} | {r['case']} | {mib(r['bytes'])} | {r['piper_ms']:.4f} | {r['mpi_ms']:.4f} | "
                     f"{r['ratio']:.2f} | {r['piper_gb_s']:.2f} | {r['mpi_gb_s']:.2f} |")
    lines.append("<!-- bench:alltoall:end -->")
    return "\n".join(lines)


# ---- the Jamba-like model at ep 2 -------------------------------------------------------

def merged(intervals):
    out = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def exposed_ms(trace_path, kind="ALLTOALL"):
    """{(step, rank): ms the rank waits on its `kind` nodes}: for each such node, the part of its
    lifetime that falls in the compute lane's gap before the rank's next compute event of the same
    unit and microbatch (the segment that needs it); overlaps counted once."""
    lanes = {}
    for e in json.load(open(trace_path))["traceEvents"]:
        if e.get("ph") != "X":
            continue
        a = e["args"]
        compute, comm = lanes.setdefault((a.get("step", 0), e["pid"]), ([], []))
        ev = (e["ts"], a.get("end_us", e["ts"] + e["dur"]), a.get("unit", -1), a.get("microbatch", -1))
        if e.get("tid", 0) == 0:
            compute.append(ev)
        elif a.get("kind", e.get("cat")) == kind:
            comm.append(ev)
    out = {}
    for key, (compute, comm) in lanes.items():
        compute.sort()
        waits = []
        for c0, c1, unit, mb in comm:
            i = next((i for i, c in enumerate(compute) if c[2] == unit and c[3] == mb and c[0] >= c1), None)
            if i is None or i == 0:
                continue
            g0 = max(c[1] for c in compute[:i])
            g1 = compute[i][0]
            if min(g1, c1) > max(g0, c0):
                waits.append((max(g0, c0), min(g1, c1)))
        out[key] = sum(b - a for a, b in merged(waits)) / 1000.0
    return out


def alltoall_share(trace_path, step_ms):
    """Median over the traced steps of the mean over ranks of the exposed all-to-all / the step's ms."""
    per = exposed_ms(trace_path)
    shares = []
    for step in sorted({s for s, _ in per}):
        ms = [v for (s, _), v in per.items() if s == step]
        shares.append(statistics.mean(ms) / step_ms[step])
    return med(shares)


def measure(piper, ranks, extra, steps, skip, data, work):
    """(median step ms, exposed all-to-all share, exposed collective share) of one run."""
    metrics, trace = os.path.join(work, "metrics.jsonl"), os.path.join(work, "trace.json")
    run(mpirun() + ["-np", str(ranks), piper, "train", os.path.join(ROOT, CONFIG), "--quiet", "--metrics", metrics,
                    "--trace", trace, "--trace-steps", f"{skip}:{steps - 1}", "--set", f"train.steps={steps}",
                    "--set", f"data.path={data}"] + sets(COMMON + extra))
    rows = [json.loads(line) for line in open(metrics)][skip:]
    comm = med(sum(x["comm_ms"] for x in r["ranks"]) / (len(r["ranks"]) * r["step_ms"]) for r in rows)
    return med(r["step_ms"] for r in rows), alltoall_share(trace, {r["step"]: r["step_ms"] for r in rows}), comm


def simulate(piper, ranks, extra, cost, work):
    """(step ms, exposed all-to-all share, mean exposed-communication share)."""
    trace = os.path.join(work, "sim.json")
    j = json.loads(run([piper, "simulate", os.path.join(ROOT, CONFIG), "--world", str(ranks), "--ranks-per-host",
                        str(ranks), "--cost", cost, "--json", "--trace", trace] + sets(COMMON + extra)))
    comm = statistics.mean(r["comm_ms"] for r in j["ranks"]) / j["step_ms"]
    return j["step_ms"], alltoall_share(trace, {0: j["step_ms"]}), comm


def parallel_region(piper, data, steps, skip, rounds):
    per = {name: [] for name, *_ in CASES}
    with tempfile.TemporaryDirectory() as work:
        costs = {}
        for cal, (ranks, extra) in CALIBRATIONS.items():
            wait_idle(WAIT_IDLE_S)
            costs[cal] = os.path.join(work, f"cost-{ranks}.json")
            run(mpirun() + ["-np", str(ranks), piper, "calibrate", os.path.join(ROOT, CONFIG), "--quiet", "-o",
                            costs[cal], "--set", f"data.path={data}"] + sets(COMMON + extra))
            print(f"moe.py: calibrated {cal}", file=sys.stderr)
        for rnd in range(rounds):
            for name, ranks, extra, _ in CASES:
                wait_idle(WAIT_IDLE_S)
                per[name].append(measure(piper, ranks, extra, steps, skip, data, work))
                print(f"moe.py: round {rnd + 1}/{rounds}: {name}: {per[name][-1][0]:.1f} ms", file=sys.stderr)
        sims = {name: simulate(piper, ranks, extra, costs[cal], work) for name, ranks, extra, cal in CASES}
    lines = [
        "<!-- bench:moe-parallel:begin -->", "## MoE with expert parallelism: measured and simulated", "",
        f"Measured {datetime.date.today()} by `bench/moe.py` (part of `make bench`) on {os.cpu_count()} CPUs, all "
        f"ranks on this host: `{CONFIG}` with {' '.join('`' + c + '`' for c in COMMON)},",
        f"{rounds} rounds of every case in turn. Step time: the median over the rounds of each run's median (steps "
        f"{skip}..{steps - 1}).",
        "Exposed all-to-all: from the run's `--trace` of those steps, the time a rank's compute lane waits on its",
        "ALLTOALL nodes (counts exchange, dispatch, combine and their gradients): the part of each one's flight in",
        "the idle gap before the next compute of its unit and microbatch, over the step time; mean over ranks,",
        "median over steps, then over rounds. Exposed communication: the share of the step the",
        "compute stream waits for any collective (`comm_ms`), per rank, median. Simulated: `piper simulate",
        "--ranks-per-host N --cost FILE --trace` with FILE from `piper calibrate` of the case's strategy on as",
        "many ranks (the pairs case uses the DualPipeV calibration: pairs change nothing calibrate measures); its",
        "exposed all-to-all read from its trace the same way. The simulator's ranks compute alike and route",
        "evenly, so its exposed all-to-all is the transfer alone; a measured rank also waits there for its ep",
        "partner to reach the same point (the all-to-all synchronises the ep group), whatever slowed the partner:",
        "uneven routing, ranks sharing the cores. Being read from the compute lane's gaps, it also holds what the",
        "rank did between its compute events while waiting (issuing, polling, being descheduled), which the",
        "executor's `comm_ms`, the time inside the waits, leaves out.", "",
        "| case | ranks | measured step ms | simulated step ms | simulated / measured | measured exposed all-to-all | "
        "simulated exposed all-to-all | measured exposed comm | simulated exposed comm |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, ranks, _, _ in CASES:
        r, (s_step, s_a2a, s_comm) = per[name], sims[name]
        m_step = med(x[0] for x in r)
        lines.append(f"| {name} | {ranks} | {m_step:.1f} | {s_step:.1f} | {s_step / m_step:.2f} | "
                     f"{100 * med(x[1] for x in r):.1f}% | {100 * s_a2a:.1f}% | {100 * med(x[2] for x in r):.1f}% | "
                     f"{100 * s_comm:.1f}% |")
    lines.append("<!-- bench:moe-parallel:end -->")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("build")
    ap.add_argument("--only", default="block,alltoall,parallel", help="comma-separated subset of the benchmarks")
    ap.add_argument("--reps", type=int, default=7, help="repetitions per size of the block benchmark")
    ap.add_argument("--a2a-reps", type=int, default=15, help="repetitions per size of the all-to-all benchmark")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--skip", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(ROOT, "docs/benchmarks.md"))
    ap.add_argument("--no-doc", action="store_true")
    a = ap.parse_args()
    only = set(a.only.split(","))
    if only - {"block", "alltoall", "parallel"}:
        ap.error(f"--only: unknown benchmark(s) {', '.join(sorted(only - {'block', 'alltoall', 'parallel'}))}; "
                 "expected a comma-separated subset of block,alltoall,parallel")
    if not 0 <= a.skip < a.steps:
        ap.error(f"--skip {a.skip} must be at least 0 and below --steps {a.steps}")
    build = os.path.abspath(a.build)
    piper, data = os.path.join(build, "piper"), os.path.join(build, "data/corpus.tok")
    regions = []
    if "block" in only:
        regions.append(("moe-block", block_region(build, a.reps)))
    if "alltoall" in only:
        regions.append(("alltoall", alltoall_region(build, a.a2a_reps)))
    if "parallel" in only:
        regions.append(("moe-parallel", parallel_region(piper, data, a.steps, a.skip, a.rounds)))
    for name, block in regions:
        print(block)
        if not a.no_doc:
            write_region(a.out, name, block)


if __name__ == "__main__":
    main()
