#!/usr/bin/env bash
# Self-test of scripts/netns-hosts, the simulated hosts the multi-host tests run on: two hosts
# come up isolated from this machine's network, reach each other over ssh, lose and regain
# their link, and leave nothing behind (namespaces, processes, state directory).
# Usage: netns_selftest.sh [path/to/netns-hosts]. Exits 77 (skip) where namespaces or sshd are
# not available.
set -uo pipefail

NETNS=${1:-$(dirname "$0")/../../scripts/netns-hosts}
PFX=kst$$
SUBNET=10.251.$(($$ % 250 + 1))
WORK=$(mktemp -d /tmp/krug-netns-selftest.XXXXXX)
STATE=$WORK/state
SSH_PID=""

"$NETNS" check || exit $?

cleanup() {
  [ -z "$SSH_PID" ] || kill "$SSH_PID" 2>/dev/null
  exec 3>&- 2>/dev/null
  "$NETNS" down --name "$PFX" --state "$STATE" >/dev/null 2>&1
  rm -rf -- "$WORK"
}
trap cleanup EXIT

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

# Deadlines here only guard against hangs; none decides an outcome. On a loaded machine (a full
# CI run on 2 cores) one ssh takes over a second, because sshd forks and re-executes itself for
# every connection before it sends its banner, and ssh's ConnectTimeout covers that banner too.
# So an ssh that must succeed waits up to HANG_GUARD seconds (a 2 s ConnectTimeout here made
# this test fail under load), and only the ssh that must fail (link cut) has a short one: a
# slow machine cannot turn a cut link into a working one.
readonly HANG_GUARD=120

# ssh from host 1 with the generated configuration, giving up on connecting after $1 seconds.
ssh_from_h1_within() {
  local seconds=$1
  shift
  ip netns exec "$PFX-h1" ssh -F "$STATE/ssh_config" -o ConnectTimeout="$seconds" "$@"
}

ssh_from_h1() { ssh_from_h1_within "$HANG_GUARD" "$@"; }

# True once "$@" succeeds, trying every 0.2 s; false if it still fails after HANG_GUARD seconds.
eventually() {
  local deadline=$((SECONDS + HANG_GUARD))
  while ((SECONDS < deadline)); do
    "$@" && return 0
    sleep 0.2
  done
  "$@"
}

# Commands (comm) of the processes inside namespace $1, one a line.
namespace_commands() {
  local pid
  for pid in $(ip netns pids "$1"); do cat "/proc/$pid/comm" 2>/dev/null; done
}

echo "== up: 2 hosts $PFX on $SUBNET.0/24"
"$NETNS" up --name "$PFX" --hosts 2 --subnet "$SUBNET" --state "$STATE" || fail "up failed"
[ "$(cat "$STATE/hosts")" = "$SUBNET.1"$'\n'"$SUBNET.2" ] || fail "hosts file: $(cat "$STATE/hosts")"
for f in id_ed25519 id_ed25519.pub ssh_config; do [ -s "$STATE/$f" ] || fail "no $STATE/$f"; done

echo "== ssh from host 1 runs a command on host 2"
out=$(ssh_from_h1 "$SUBNET.2" 'echo $((6 * 7)) $(hostname)') || fail "ssh to host 2 failed"
[ "$out" = "42 $PFX-h2" ] || fail "ssh to host 2 printed '$out', expected '42 $PFX-h2'"

echo "== the simulated network is isolated from the root namespace"
ip -o addr show | grep -q " $SUBNET\." && fail "an address of $SUBNET.0/24 is in the root namespace"
root_addr=$(ip -4 -o addr show scope global | awk '{split($4, a, "/"); print a[1]; exit}')
if [ -n "$root_addr" ]; then
  ip netns exec "$PFX-h1" ip route get "$root_addr" >/dev/null 2>&1 &&
    fail "host 1 has a route to this machine's address $root_addr"
fi

echo "== an open session ends on both sides after the link is cut"
mkfifo "$WORK/stdin"
exec 3<>"$WORK/stdin"   # held open so the remote `cat` only ends when the session does
ssh_from_h1 "$SUBNET.2" 'exec cat' <"$WORK/stdin" >/dev/null 2>&1 &
SSH_PID=$!
eventually eval 'namespace_commands "$PFX-h2" | grep -qx cat' || fail "remote cat did not start"

echo "== link of host 2 down: ssh fails"
"$NETNS" link --name "$PFX" --host 2 down || fail "link down failed"
ssh_from_h1_within 2 "$SUBNET.2" true 2>/dev/null &&
  fail "ssh to host 2 worked with its link down"
# ServerAlive/ClientAlive 2 s x 3: both ends give up after about 6 s.
eventually eval '! kill -0 "$SSH_PID" 2>/dev/null' || fail "ssh client still alive after the cut"
wait "$SSH_PID" && fail "ssh client exited 0 after the link was cut"
SSH_PID=""
eventually eval '! namespace_commands "$PFX-h2" | grep -qx cat' ||
  fail "the remote session is still running on host 2 after the cut"

echo "== link of host 2 up: ssh works again"
"$NETNS" link --name "$PFX" --host 2 up || fail "link up failed"
eventually eval 'out=$(ssh_from_h1 "$SUBNET.2" hostname 2>/dev/null)' ||
  fail "ssh to host 2 still fails after the link came back"
[ "$out" = "$PFX-h2" ] || fail "ssh to host 2 printed '$out' after the link came back"

echo "== down leaves nothing behind"
"$NETNS" down --name "$PFX" --state "$STATE" || fail "down failed"
ip netns list | grep -q "^$PFX-" && fail "namespaces left: $(ip netns list | grep "^$PFX-")"
[ ! -e "$STATE" ] || fail "$STATE still exists"
pgrep -f -- "$STATE" >/dev/null && fail "processes left: $(pgrep -af -- "$STATE")"
"$NETNS" down --name "$PFX" --state "$STATE" || fail "a second down failed"
echo "PASS"
