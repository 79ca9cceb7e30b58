#!/usr/bin/python3
"""tuner_measured.py — `piper tune` measured on this machine: for config/examples/tuner-cpu.yaml (a
heterogeneous hybrid whose batch leaves the ranks no choice but a pipeline) at each of --worlds
ranks, all on this host (more ranks than cores share them), --rounds rounds of

1. `piper calibrate` on that many ranks (the cost file: this machine's units, collectives and host
   sharing), afresh each round as its figures vary from one calibration to the next;
2. `piper tune --world N --cost FILE --mem-gib G --ranks-per-host N --json`: the chosen strategy and
   the baselines (uniform interleaved 1F1B, uniform 1F1B, uniform DualPipeV, no pipeline);
3. the tuned config as `piper tune` wrote it, and each baseline that fits as a config (its degrees as
   --set overrides of `parallel:`, its uniform partition as a `place` directive), each predicted by
   `piper simulate --cost FILE --ranks-per-host N` and trained for --steps steps in turn: the median
   step time after --skip steps and the peak memory of the largest rank by the allocator's
   accounting.

The table (medians over the rounds) is printed and written into docs/tuner.md (region
`tuner-measured`) through scripts/doc-region.py. The targets, marked met or not met per rank count:
the tuned strategy faster than uniform 1F1B and uniform interleaved in measured step time; its
measured step within 5% of the prediction; its peak memory within the limit, simulated and
measured, in every round.

Usage: bench/tuner_measured.py BUILD_DIR [--worlds 2,4] [--steps N] [--skip N] [--rounds N]
                               [--mem-gib G] [--retries N] [--max-other F] [--out FILE] [--no-doc]
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
from moe import sets  # noqa: E402
from sim_accuracy import ROOT, measure, mpirun, others_share, run, wait_idle  # noqa: E402
from tuner import BASELINES, check_tune, int_list, met, write_region  # noqa: E402

CONFIG = "config/examples/tuner-cpu.yaml"
ERROR_TARGET = 0.05       # the tuned strategy's measured step within this share of its prediction
BEATEN = ("1f1b", "interleaved")  # the baselines the tuned strategy must beat in measured step time
QUIET_LOAD = 1.5          # wait for the 1-minute load average below this before each rank count
QUIET_WAIT_S = 600        # ... for this long at most
WAIT_IDLE_S = 30          # before the calibration: wait this long at most for a quiet second
TUNED = "tuned"
med = statistics.median


def load_average():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def wait_quiet():
    """Waits up to QUIET_WAIT_S for the 1-minute load average below QUIET_LOAD; returns it."""
    deadline = datetime.datetime.now() + datetime.timedelta(seconds=QUIET_WAIT_S)
    while load_average() >= QUIET_LOAD and datetime.datetime.now() < deadline:
        wait_idle(10)
    return load_average()


def ranks_text(world):
    cores = os.cpu_count()
    return f"{world} ranks" + (f" sharing {cores} cores" if world > cores else "")


def calibrate(piper, world, a, data, work, rnd):
    """A cost file of `piper calibrate` on `world` ranks, rerun while other processes took more than
    --max-other of the CPUs (the quietest kept); and the share they took."""
    best = None
    for attempt in range(a.retries + 1):
        cost = os.path.join(work, f"cal{world}-{rnd}-{attempt}.json")
        wait_idle(WAIT_IDLE_S)
        _, other = others_share(lambda: run(mpirun() + [
            "-np", str(world), piper, "calibrate", os.path.join(ROOT, CONFIG), "--quiet", "-o", cost]
            + sets([f"data.path={data}"])))
        if best is None or other < best[1]:
            best = (cost, other)
        if other <= a.max_other:
            break
        print(f"tuner_measured.py:   other processes used {100 * other:.0f}% of the CPUs; calibrating again",
              file=sys.stderr)
    return best


def tune(piper, world, cost, mem_gib, data, work, rnd):
    """(the JSON object of `piper tune --json`, the tuned config it wrote)."""
    out = os.path.join(work, f"tuned{world}-{rnd}.yaml")
    j = json.loads(run([piper, "tune", os.path.join(ROOT, CONFIG), "--world", str(world), "--cost", cost,
                        "--mem-gib", str(mem_gib), "--ranks-per-host", str(world), "-o", out, "--json", "--quiet"]
                       + sets([f"data.path={data}"])))
    return j, out


def baseline_config(name, r, path):
    """The --set overrides of baseline result `r` of `piper tune --json`, having written to `path` the
    config with the baseline's uniform partition as a place directive; its degrees go in `parallel:`."""
    if r["custom_order"]:
        sys.exit(f"tuner_measured.py: the {name} baseline has a hand-written order, which a config of its degrees "
                 "and partition does not say; expected the schedule's own order for a baseline")
    with open(os.path.join(ROOT, CONFIG)) as f:
        text = f.read()
    place = (f"{{pp: {r['pp']}, virtual_stages: {r['virtual_stages']}, "
             f"stage_of_unit: [{', '.join(map(str, r['stage_of_unit']))}]}}")
    with open(path, "w") as f:
        f.write(f"{text}directives:\n  - place: {place}\n")
    keys = ("tp", "pp", "dp", "ep", "zero", "microbatches", "virtual_stages", "schedule", "pairs", "recompute")
    return sets(f"parallel.{k}={str(r[k]).lower()}" for k in keys)


def simulate(piper, path, args, world, cost, data):
    """(predicted step ms, predicted peak bytes of the largest rank)."""
    j = json.loads(run([piper, "simulate", path, "--world", str(world), "--ranks-per-host", str(world), "--cost",
                        cost, "--json"] + sets([f"data.path={data}"]) + args))
    return j["step_ms"], max(r["peak_mem_bytes"] for r in j["ranks"])


def strategies(j, tuned, world, work, rnd):
    """{name: (tuner's result, config path, --set overrides)} of the chosen strategy and every baseline
    that fits, in table order."""
    out = {TUNED: (j["chosen"], tuned, [])}
    for b in BASELINES:
        if j["baselines"][b]:
            path = os.path.join(work, f"{b}{world}-{rnd}.yaml")
            out[b] = (j["baselines"][b], path, baseline_config(b, j["baselines"][b], path))
    return out


def check_prediction(name, tuner_ms, sim_ms, path):
    """Exits unless `piper simulate` of the written config predicts the tuner's step: else the config
    would not be the strategy the tuner chose or compared with."""
    if abs(sim_ms / tuner_ms - 1) > 1e-3:
        sys.exit(f"tuner_measured.py: `piper simulate {path}` predicts {sim_ms:.2f} ms, `piper tune` said "
                 f"{tuner_ms:.2f} ms for the {name} strategy: the config written for it is not that strategy")


def run_round(piper, world, a, data, work, rnd):
    """{name: (label, predicted (step ms, peak bytes), Measured)} of one round: a fresh calibration,
    the tuner on it, and every strategy it names that fits, predicted and trained in turn; with the
    share of the CPUs others took during the calibration."""
    cost, cal_other = calibrate(piper, world, a, data, work, rnd)
    j, tuned = tune(piper, world, cost, a.mem_gib, data, work, rnd)
    out = {}
    for name, (r, path, args) in strategies(j, tuned, world, work, rnd).items():
        predicted = simulate(piper, path, args, world, cost, data)
        check_prediction(name, r["step_ms"], predicted[0], path)
        m = measure(piper, path, world, args, a.steps, a.skip, data, work, a.retries, a.max_other)
        print(f"tuner_measured.py: {ranks_text(world)}, round {rnd + 1}/{a.rounds}: {name} ({r['label']}) "
              f"{m.step_ms:.1f} ms, predicted {predicted[0]:.1f} ms", file=sys.stderr)
        out[name] = (r["label"], predicted, m)
    return out, cal_other, j["mem_limit_bytes"]


def run_world(piper, world, a, data, work):
    load = wait_quiet()
    print(f"tuner_measured.py: {ranks_text(world)} (1-minute load average {load:.2f})", file=sys.stderr)
    rounds, cal_other = [], 0.0
    for rnd in range(a.rounds):
        r, other, limit = run_round(piper, world, a, data, work, rnd)
        rounds.append(r)
        cal_other = max(cal_other, other)
    return {"world": world, "load": load, "rounds": rounds, "cal_other": cal_other, "limit": limit}


def mib(b):
    return f"{b / 2**20:.1f}"


def per_round(w, name, fn):
    """[fn(that round's figures of `name`, of the tuned strategy)] over the rounds where `name` fits."""
    return [fn(r[name], r[TUNED]) for r in w["rounds"] if name in r]


def error(x, _):
    return x[1][0] / x[2].step_ms - 1


def speedup_predicted(x, t):
    return x[1][0] / t[1][0]


def speedup_measured(x, t):
    return x[2].step_ms / t[2].step_ms


def fits_text(w, name):
    n = len(per_round(w, name, lambda x, t: 1))
    return "" if n == len(w["rounds"]) else f" (fits in {n} of {len(w['rounds'])} rounds)"


def table_row(w, name):
    where = ranks_text(w["world"])
    if not per_round(w, name, lambda x, t: 1):
        return f"| {where} | {name} | nothing valid fits | | | | | | | | |"
    labels = list(dict.fromkeys(per_round(w, name, lambda x, t: x[0])))
    pred = med(per_round(w, name, lambda x, t: x[1][0]))
    meas = med(per_round(w, name, lambda x, t: x[2].step_ms))
    speed = ("", "") if name == TUNED else (f"{med(per_round(w, name, speedup_predicted)):.3f}x",
                                            f"{med(per_round(w, name, speedup_measured)):.3f}x")
    return (f"| {where} | {name}{fits_text(w, name)} | {' / '.join(labels)} | {pred:.1f} | {meas:.1f} | "
            f"{100 * med(per_round(w, name, error)):+.1f}% | {speed[0]} | {speed[1]} | "
            f"{mib(max(per_round(w, name, lambda x, t: x[1][1])))} | "
            f"{mib(max(per_round(w, name, lambda x, t: x[2].max_peak_bytes)))} | "
            f"{100 * max(per_round(w, name, lambda x, t: x[2].other)):.0f}% |")


def percents(values):
    return ", ".join(f"{100 * v:+.1f}%" for v in values)


def target_lines(w):
    head = f"{ranks_text(w['world'])}:"
    n = len(w["rounds"])
    lines = []
    for b in BEATEN:
        s = per_round(w, b, speedup_measured)
        if not s:
            lines.append(f"{head} tuned faster than uniform {b} in measured step time: not measured (no {b} strategy "
                         "is valid and fits).")
            continue
        lines.append(f"{head} tuned faster than uniform {b} in measured step time ({med(s):.3f}x, the median over "
                     f"the rounds; faster in {sum(v > 1 for v in s)} of {len(s)}): {met(med(s) > 1)}.")
    err = per_round(w, TUNED, error)
    lines.append(f"{head} tuned measured step within {100 * ERROR_TARGET:.0f}% of its prediction ({100 * med(err):+.1f}%, "
                 f"the median of the rounds' {percents(err)}): {met(abs(med(err)) <= ERROR_TARGET)}.")
    sim_peak = max(per_round(w, TUNED, lambda x, t: x[1][1]))
    run_peak = max(per_round(w, TUNED, lambda x, t: x[2].max_peak_bytes))
    lines.append(f"{head} tuned peak memory within the {w['limit'] / 2**30:g} GiB limit in all {n} rounds, simulated "
                 f"(at most {mib(sim_peak)} MiB) and measured (at most {mib(run_peak)} MiB): "
                 f"{met(max(sim_peak, run_peak) <= w['limit'])}.")
    return lines


def region(worlds, a):
    lines = [
        "<!-- bench:tuner-measured:begin -->",
        f"Measured {datetime.date.today()} by `bench/tuner_measured.py` (part of `make bench`) on {os.cpu_count()} "
        f"CPUs, every rank on this host: `{CONFIG}`",
        f"in {a.rounds} rounds per rank count N (1-minute load average at the start of each rank count: "
        f"{', '.join('%.2f' % w['load'] for w in worlds)}). Each round runs",
        "`mpirun -np N piper calibrate CONFIG -o cal.json` and `piper tune CONFIG --world N --cost cal.json --mem-gib "
        f"{a.mem_gib:g} --ranks-per-host N",
        "-o tuned.yaml`, then trains in turn the tuned config and each baseline that fits (its degrees as "
        "`--set parallel...`, its",
        f"uniform partition as a `place` directive): the median step time over steps {a.skip}..{a.steps - 1}, and the "
        "most any rank held in any of",
        "them by the allocator's accounting; each is predicted by `piper simulate --cost cal.json --ranks-per-host N`. "
        "Degrees: those the",
        "tuner found in each round. Times: medians over the rounds; error and speedups (the baseline's step over the "
        "tuned one's): the",
        "medians of each round's; peaks: the most of any round. A run or calibration during which other processes "
        f"used more than {100 * a.max_other:.0f}%",
        f"of the CPUs is repeated (up to {a.retries} times, the quietest kept; the last column: the most they used in "
        "a kept run; in the",
        f"calibrations: {', '.join('%.0f%%' % (100 * w['cal_other']) for w in worlds)}).", "",
        "| ranks | strategy | degrees | predicted ms | measured ms | error | speedup predicted | speedup measured | "
        "predicted peak MiB | measured peak MiB | others' CPU |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for w in worlds:
        lines += [table_row(w, name) for name in (TUNED,) + BASELINES]
    lines.append("")
    for w in worlds:
        lines += target_lines(w)
    lines.append("<!-- bench:tuner-measured:end -->")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("build")
    ap.add_argument("--worlds", type=int_list, default=[2, 4], help="rank counts, all on this host")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--skip", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--mem-gib", type=float, default=2.0, help="the memory limit per rank `piper tune` is given")
    ap.add_argument("--retries", type=int, default=2)
    ap.add_argument("--max-other", type=float, default=0.10)
    ap.add_argument("--out", default=os.path.join(ROOT, "docs/tuner.md"))
    ap.add_argument("--no-doc", action="store_true")
    a = ap.parse_args()
    if not 0 <= a.skip < a.steps:
        ap.error(f"--skip {a.skip} must be below --steps {a.steps}: the step time is taken over the steps after it")
    build = os.path.abspath(a.build)
    piper = os.path.join(build, "piper")
    check_tune(piper)
    data = os.path.join(build, "data/corpus.tok")
    with tempfile.TemporaryDirectory(prefix="piper-tuner-measured.") as work:
        worlds = [run_world(piper, n, a, data, work) for n in a.worlds]
    block = region(worlds, a)
    print(block)
    if not a.no_doc:
        write_region(a.out, "tuner-measured", block)


if __name__ == "__main__":
    main()
