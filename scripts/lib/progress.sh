# shellcheck shell=bash
# Sourced by scripts/install-deps, scripts/build and scripts/run-example: numbered steps that say
# what they do before they start and how long they took after, and quiet commands whose whole
# output goes to a log file, shown (its tail and its path) only when they fail.
#
# A script that runs another passes on the numbering: KRUG_STEPS is the total of the steps of
# the whole run, KRUG_STEP_NEXT the number of the child's first step.

KRUG_LOG_DIR=${KRUG_LOG_DIR:-${TMPDIR:-/tmp}/krug-logs}
mkdir -p "$KRUG_LOG_DIR"
step_number=${KRUG_STEP_NEXT:-1}
step_started=$SECONDS

# "42 s" or "3 min 5 s".
duration() {
  local s=$1
  if [ "$s" -lt 60 ]; then echo "$s s"; else echo "$((s / 60)) min $((s % 60)) s"; fi
}

# step TITLE: "[2/4] TITLE" (just TITLE when the run has one step).
step() {
  if [ "${KRUG_STEPS:-1}" -gt 1 ]; then
    echo "[$step_number/$KRUG_STEPS] $*"
  else
    echo "$*"
  fi
  step_number=$((step_number + 1))
  step_started=$SECONDS
}

# step_done [WHAT]: "    WHAT in 2 min 3 s", the time since the step began.
step_done() {
  echo "    ${1:-done} in $(duration $((SECONDS - step_started)))"
}

# note TEXT: a line under the current step.
note() {
  echo "    $*"
}

# quietly LOG COMMAND...: runs COMMAND with its output appended to LOG. On a terminal the
# latest line of that output stands on one line that is rewritten, so a long download or
# install shows it is moving. On failure: the last lines of LOG and its path, and the exit
# status is returned.
quietly() {
  local log=$1 rc=0
  shift
  echo "== $(date '+%F %T') $*" >>"$log"
  if [ -t 1 ]; then
    "$@" >>"$log" 2>&1 &
    local pid=$! width
    width=$(($(tput cols 2>/dev/null || echo 80) - 5))
    while kill -0 "$pid" 2>/dev/null; do
      printf '\r\033[K    %s' "$(tail -n 1 "$log" | tr -d '\r' | cut -c "1-$width")"
      sleep 1
    done
    wait "$pid" || rc=$?
    printf '\r\033[K'
  else
    "$@" >>"$log" 2>&1 || rc=$?
  fi
  if [ "$rc" -ne 0 ]; then
    echo "failed (exit status $rc): $*" >&2
    echo "---- the last 40 lines of $log:" >&2
    tail -n 40 "$log" >&2
    echo "---- the full log: $log" >&2
  fi
  return "$rc"
}
