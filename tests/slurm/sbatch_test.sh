#!/usr/bin/env bash
# slurm.sbatch_two_ranks: krugrun in batch jobs of a real one-machine Slurm cluster.
#
#   sbatch_test.sh SLURM_LOCAL KRUGRUN EXAMPLE
#
# Starts a cluster with scripts/slurm-local (always torn down on exit), then submits, each with
# `sbatch --wait --ntasks=2`:
#   1. krugrun EXAMPLE without -H or -np: 2 ranks, each its own srun step, correct results;
#   2. a job whose rank 1 exits 3: the job fails with 3, krugrun names rank 1 and its host, and
#      rank 0's step is cancelled (no process of it is left);
#   3. a job that SIGKILLs krugrun as its steps start: srun cancels both steps;
#   4. krugrun -np 3 in a 2-task allocation: a usage error that says what to ask Slurm for.
# Exit status: 0 when all held, 1 on the first failed check, 77 when Slurm cannot run here.
set -euo pipefail

[ $# -eq 3 ] || { echo "usage: $0 SLURM_LOCAL KRUGRUN EXAMPLE" >&2; exit 2; }
# Absolute: the jobs run in their own directory.
slurm_local=$(realpath "$1") krugrun=$(realpath "$2") example=$(realpath "$3")

"$slurm_local" check || exit $?

state=$(mktemp -d /tmp/krug-slurm.XXXXXX)
jobs=$state/jobs
host=$(hostname -s)
# Unique in this machine's process table: names rank processes so leftovers can be found.
marker=krug-slurm-rank-$(basename "$state")

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

cleanup() {
  local rc=$?
  if [ "$rc" -ne 0 ] && [ -d "$jobs" ]; then
    for f in "$jobs"/*.out; do
      [ -e "$f" ] || continue
      echo "---- $f" >&2
      cat "$f" >&2
    done
    for f in "$state"/slurmctld.log "$state"/slurmd.log; do
      [ -e "$f" ] && { echo "---- last lines of $f" >&2; tail -n 30 "$f" >&2; }
    done
  fi
  "$slurm_local" down --state "$state" || rc=1
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

"$slurm_local" up --state "$state"
export SLURM_CONF=$state/slurm.conf
mkdir -p "$jobs"

# submit NAME: runs $jobs/NAME.sh as a 2-task batch job and waits; sets job_id and job_rc.
submit() {
  local out
  job_rc=0
  out=$(sbatch --parsable --wait --ntasks=2 --time=10 --job-name="$1" --chdir="$jobs" \
          --output="$jobs/$1.out" "$jobs/$1.sh") || job_rc=$?
  job_id=${out%%;*}
  [[ "$job_id" =~ ^[0-9]+$ ]] || fail "sbatch of $1 printed no job id: '$out'"
  echo "job $job_id ($1) exited with $job_rc"
}

# The line the controller writes for a finished job (JobCompType=jobcomp/filetxt).
completion() {
  grep "^JobId=$1 " "$state/jobcomp.txt" || fail "job $1 is not in $state/jobcomp.txt"
}

expect_in() {  # expect_in FILE TEXT
  grep -qF -- "$2" "$1" || fail "'$2' not in $1"
}

no_rank_left() {  # no rank process nor srun of job $1 remains
  if pgrep -f "$marker" >/dev/null; then fail "rank processes left: $(pgrep -a -f "$marker")"; fi
  if pgrep -f "srun --jobid=$1 " >/dev/null; then fail "srun left: $(pgrep -a -f "srun --jobid=$1 ")"; fi
  [ -z "$(squeue -h -s -j "$1" 2>/dev/null)" ] || fail "steps of job $1 left: $(squeue -s -j "$1")"
}

# 1. Two ranks from the allocation, each an srun step.
cat > "$jobs/two.sh" <<EOF
#!/bin/bash
exec "$krugrun" /bin/sh -c 'echo "step=\$SLURM_STEP_ID rank=\$KRUG_RANK host=\$KRUG_HOSTNAME"; exec "$example"'
EOF
submit two
out=$jobs/two.out
[ "$job_rc" -eq 0 ] || fail "job exited with $job_rc"
completion "$job_id" | grep -q "JobState=COMPLETED .*ExitCode=0:0" || fail "job not COMPLETED 0:0"
for r in 0 1; do
  expect_in "$out" "[$r]<stdout>:rank $r/2: averaged 1000000 floats"
  expect_in "$out" "[$r]<stdout>:rank $r/2: allgather of $((r + 1)) rows gave 3 rows"
  expect_in "$out" "[$r]<stdout>:rank $r/2: broadcast from rank 0: weights[7] = 3.5"
done
expect_in "$out" "[0]<stdout>:OK"
! grep -q WRONG "$out" || fail "wrong results in $out"
# Each rank ran in a step of its own (the batch script itself is not a numbered step).
steps=$(sed -n "s/^\[[01]\]<stdout>:step=\([0-9][0-9]*\) rank=[01] host=$host\$/\1/p" "$out" |
        sort -u | wc -l)
[ "$steps" -eq 2 ] || fail "expected 2 distinct srun steps on host $host in $out, got $steps"

# 2. Rank 1 fails: the job fails with its status and rank 0's step is cancelled.
cat > "$jobs/fail.sh" <<EOF
#!/bin/bash
exec "$krugrun" /bin/bash -c 'if [ "\$KRUG_RANK" = 1 ]; then exit 3; fi; exec -a "$marker" sleep 300'
EOF
submit fail
out=$jobs/fail.out
[ "$job_rc" -eq 3 ] || fail "job exited with $job_rc, expected 3"
completion "$job_id" | grep -q "JobState=FAILED .*ExitCode=3:0" || fail "job not FAILED 3:0"
expect_in "$out" "krugrun: rank 1 on host $host exited with status 3; stopping the other ranks"
[ "$(grep '^krugrun:' "$out" | tail -n 1)" = "krugrun: rank 1 on host $host exited with status 3" ] ||
  fail "the last krugrun line of $out does not name rank 1 as the failure"
no_rank_left "$job_id"

# 3. krugrun is SIGKILLed as soon as both steps exist: its sruns get SIGTERM and cancel their
# steps. That is the moment a SIGKILLed srun would leave its step behind (it forks the watchdog
# that cancels the step only after creating it): in a loop, 1 of the first 4 such kills did;
# with SIGTERM, 30 of 30 left nothing.
cat > "$jobs/kill.sh" <<EOF
#!/bin/bash
steps() { squeue -h -s -j "\$SLURM_JOB_ID" -o %j | grep -c '^krug-rank'; }
wait_steps() {  # wait_steps N: up to 30 s
  for _ in \$(seq 150); do [ "\$(steps)" -eq "\$1" ] && return 0; sleep 0.2; done
  return 1
}
"$krugrun" /bin/bash -c 'exec -a "$marker" sleep 300' &
wait_steps 2 && echo "both ranks running as steps"
kill -KILL \$!
wait_steps 0 && echo "no step left"
EOF
submit kill
out=$jobs/kill.out
[ "$job_rc" -eq 0 ] || fail "job exited with $job_rc"
expect_in "$out" "both ranks running as steps"
expect_in "$out" "no step left"
no_rank_left "$job_id"

# 4. More ranks than the allocation has tasks.
cat > "$jobs/np.sh" <<EOF
#!/bin/bash
exec "$krugrun" -np 3 true
EOF
submit np
[ "$job_rc" -eq 2 ] || fail "job exited with $job_rc, expected 2 (usage error)"
expect_in "$jobs/np.out" "krugrun: -np 3 exceeds the Slurm allocation: job $job_id has 2 task slot(s): $host:2"
expect_in "$jobs/np.out" "--ntasks=3"

echo "PASS: 4 Slurm jobs behaved"
