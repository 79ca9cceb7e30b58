#!/usr/bin/env bash
# test_slurm.sh — jobs/slurm/train.sbatch and jobs/slurm/elastic.sbatch on a real one-node Slurm
# (scripts/slurm-local.sh).
#   tests/slurm/test_slurm.sh [SOURCE_DIR [PIPER_EXE]]
# Part 1 (training): a short job trains config/tiny.yaml on 2 ranks and finishes.
# Part 2 (checkpoint): a longer job gets SIGUSR1
# (scancel --signal=USR1 --batch), checkpoints, requeues itself and resumes from the checkpoint.
# Part 3 (elastic): a job on 4 ranks + 2 in reserve gets a preemption notice (SIGUSR2) and shrinks to
# 2 ranks, then SIGHUP and grows back to 4, and finishes; every step is in its metrics once.
# Needs root (or sudo) for the daemons; stops them on every exit.
set -euo pipefail

src=$(cd "${1:-$(dirname "${BASH_SOURCE[0]}")/../..}" && pwd)
piper=$(realpath "${2:-$src/build/piper}")
[[ -x $piper ]] || { echo "test_slurm: no piper binary at $piper" >&2; exit 1; }
corpus=$(dirname "$piper")/data/corpus.tok
[[ -f $corpus ]] || corpus=$src/build/data/corpus.tok
[[ -f $corpus ]] || { echo "test_slurm: no token file (build/data/corpus.tok; make data)" >&2; exit 1; }

work=$(mktemp -d /tmp/piper-slurm.XXXXXX)
cleanup() {
  local rc=$?
  # A job of this test still running (a failed wait) would outlive the daemons: its processes (the batch
  # shell, mpirun, the ranks), as slurmd lists them; only this test's jobs (two local clusters on one
  # host share Slurm's default ports, so slurmd may list another run's jobs too).
  # (Every command here may fail without ending the cleanup: set -e still applies inside a trap.)
  local id pid
  for id in $(cat "$work/jobs" 2>/dev/null || true); do
    for pid in $(SLURM_CONF=$work/slurm.conf scontrol listpids "$id" 2>/dev/null | awk 'NR > 1 {print $1}' || true); do
      kill -KILL "$pid" 2>/dev/null || true
    done
  done
  "$src/scripts/slurm-local.sh" stop "$work" >/dev/null 2>&1 || true
  if [[ $rc -ne 0 ]]; then
    echo "test_slurm: FAILED (rc $rc); job outputs and daemon logs:" >&2
    for f in "$work"/*.out "$work"/log/*.log; do [[ -f $f ]] && { echo "== $f"; tail -n 40 "$f"; }; done >&2
    echo "test_slurm: kept $work" >&2
  else
    rm -rf "$work" 2>/dev/null || true  # a daemon may still be closing its log as the folder goes
  fi
  exit "$rc"  # the test's own outcome, whatever the cleanup's last command returned
}
trap cleanup EXIT
trap 'exit 130' INT TERM

"$src/scripts/slurm-local.sh" start "$work"
export SLURM_CONF=$work/slurm.conf

fail() { echo "test_slurm: FAIL: $*" >&2; exit 1; }
job_state() { scontrol show job "$1" -o 2>/dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2; }
# wait_state JOB SECONDS: until the job is finished; prints its final state
wait_done() {
  local s=""
  for _ in $(seq $(( $2 * 2 ))); do
    s=$(job_state "$1")
    case $s in COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|BOOT_FAIL|DEADLINE|PREEMPTED) echo "$s"; return;; esac
    sleep 0.5
  done
  echo "TIMEOUT_WAITING($s)"
}
# wait_for FILE PATTERN SECONDS [JOB]: until a line of FILE matches (extended regex)
wait_for() {
  for _ in $(seq $(( $3 * 2 ))); do
    grep -Eq "$2" "$1" 2>/dev/null && return 0
    sleep 0.5
  done
  fail "no line /$2/ in $1 after $3 s (job state $( [[ -n ${4:-} ]] && job_state "$4"))"
}
submit() {  # submit SCRIPT NAME NTASKS VAR=VALUE...: prints the job id
  local script=$1 name=$2 n=$3 over=()
  shift 3
  (( n > $(nproc) )) && over=(--overcommit)  # more tasks than the node's CPUs
  local id
  id=$(cd "$src" && env "$@" sbatch --parsable --job-name="$name" --ntasks="$n" "${over[@]}" \
       --output="$work/$name-%j.out" "$script" | cut -d';' -f1)
  echo "$id" >> "$work/jobs"  # for the cleanup
  echo "$id"
}

ran=()
common=(CONFIG="$src/config/tiny.yaml" PIPER="$piper")
has_resume=1
"$piper" train --help 2>&1 | grep -q -- --resume || fail "$piper train has no --resume"

# ---- part 1: a short job trains and finishes -----------------------------------------------
resume=()
if [[ $has_resume -eq 1 ]]; then resume=(CKPT_DIR="$work/ckpt-train"); else resume=(RESUME=); fi
id=$(submit jobs/slurm/train.sbatch train 2 "${common[@]}" "${resume[@]}" METRICS="$work/train.jsonl" \
     EXTRA="--set parallel.dp=2 --set train.steps=5 --set train.log_every=1 --set data.path=$corpus")
echo "test_slurm: part 1: job $id (2 ranks, 5 steps)"
state=$(wait_done "$id" 180)
out=$work/train-$id.out
[[ $state == COMPLETED ]] || fail "job $id ended $state"
grep -q '2 rank(s)' "$out" || fail "job $id did not run 2 ranks"
grep -q '^step *4 ' "$out" || fail "job $id printed no step 4"
grep -q '^summary: 5 steps' "$out" || fail "job $id printed no summary"
[[ $(wc -l < "$work/train.jsonl") -ge 5 ]] || fail "job $id wrote no metrics"
ran+=("training")
echo "test_slurm: part 1 passed: job $id trained 5 steps and finished"

# ---- part 2: signal -> checkpoint -> requeue -> resume ---------------------------------------
if [[ $has_resume -eq 1 ]]; then
  ckpt=$work/ckpt
  id=$(submit jobs/slurm/train.sbatch resume 2 "${common[@]}" CKPT_DIR="$ckpt" METRICS="$work/resume.jsonl" \
       EXTRA="--set parallel.dp=2 --set train.steps=400 --set train.log_every=1 --set checkpoint.every=100000 --set data.path=$corpus")
  out=$work/resume-$id.out
  echo "test_slurm: part 2: job $id (2 ranks, 400 steps)"
  wait_for "$out" '^step +[0-9]+ ' 120 "$id"
  scancel --signal=USR1 --batch "$id"
  wait_for "$out" 'checkpointed at step [0-9]+' 120 "$id"
  n=$(grep -Eo 'checkpointed at step [0-9]+' "$out" | head -1 | grep -Eo '[0-9]+$')
  ls "$ckpt"/step_*.h5 >/dev/null 2>&1 || fail "no checkpoint file in $ckpt"
  [[ -s $ckpt/latest ]] || fail "no $ckpt/latest"
  grep -q "step_$(printf %08d "$n").h5" "$ckpt/latest" || fail "$ckpt/latest ($(cat "$ckpt/latest")) does not name step $n"
  echo "test_slurm: job $id checkpointed at step $n; waiting for the requeued run"
  wait_for "$out" 'requeueing job' 60 "$id"
  # Slurm holds a requeued job back for the credential lifetime (120 s by default): start it now.
  for _ in $(seq 120); do [[ $(job_state "$id") == PENDING ]] && break; sleep 0.5; done
  scontrol update JobId="$id" StartTime=now || true
  wait_for "$out" 'resumed from' 300 "$id"
  state=$(wait_done "$id" 300)
  [[ $state == COMPLETED ]] || fail "requeued job $id ended $state"
  grep -q '^summary:' "$out" || fail "requeued job $id printed no summary"
  grep -q 'restart 1' "$out" || fail "job $id did not run a second time"
  ran+=("checkpoint/requeue/resume")
  echo "test_slurm: part 2 passed: job $id checkpointed at step $n, requeued, resumed and finished"
else
  fail "unreachable: checkpointing is always tested"
fi

# ---- part 3: preemption notice -> shrink 4 -> 2 ranks; SIGHUP -> grow back to 4 ---------------------
steps=600
id=$(submit jobs/slurm/elastic.sbatch elastic 6 "${common[@]}" ACTIVE=4 STANDBY=2 CKPT_DIR="$work/ckpt-elastic" \
     METRICS="$work/elastic.jsonl" SWITCH_FILE="$work/switch-elastic.yaml" \
     EXTRA="--set parallel.dp=4 --set train.steps=$steps --set train.log_every=1 --set train.threads=1 --set train.switch_tune_s=2 --set data.path=$corpus")
out=$work/elastic-$id.out
echo "test_slurm: part 3: job $id (4 ranks + 2 in reserve, $steps steps)"
wait_for "$out" '^step +[0-9]+ ' 120 "$id"
scancel --signal=USR2 --batch "$id"
wait_for "$out" 'rank\(s\) 2, 3 left the job' 120 "$id"
wait_for "$out" 'switch at step [0-9]+ .*: 4 rank\(s\) .* -> 2 rank\(s\)' 10 "$id"
scancel --signal=HUP --batch "$id"
wait_for "$out" 'switch at step [0-9]+ .*: 2 rank\(s\) .* -> 4 rank\(s\)' 120 "$id"
state=$(wait_done "$id" 300)
[[ $state == COMPLETED ]] || fail "elastic job $id ended $state"
grep -q '^summary:' "$out" || fail "elastic job $id printed no summary"
[[ $(grep -Ec '^step +[0-9]+ ' "$out") -eq $steps ]] || fail "elastic job $id printed $(grep -Ec '^step +[0-9]+ ' "$out") step lines, not $steps"
# Two switch events (4 -> 2 ranks, ranks 2 and 3 leaving; 2 -> 4, the reserve joining) and every step once, in order.
python3 - "$work/elastic.jsonl" "$steps" <<'PY' || fail "elastic job $id: its metrics ($work/elastic.jsonl) are not as expected"
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
events = [r for r in rows if "event" in r]
steps = [r["step"] for r in rows if "event" not in r]
shape = [(len(e["active_before"]), len(e["active_after"]), e["leaving"]) for e in events]
print(f"test_slurm: switches {shape} at steps {[e['step'] for e in events]}; {len(steps)} step lines")
ok = shape == [(4, 2, [2, 3]), (2, 4, [])] and steps == list(range(int(sys.argv[2])))
sys.exit(0 if ok else 1)
PY
ran+=("elastic shrink/grow")
echo "test_slurm: part 3 passed: job $id shrank to 2 ranks on a notice, grew back to 4 and finished"
echo "test_slurm: passed; parts run: ${ran[*]}"
