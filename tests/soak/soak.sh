#!/bin/sh
# soak.sh - long runs whose memory and descriptors must stay flat (make soak;
# short ones in make test). Runs PROG (soak_prog: small and large allreduces,
# every collective, communicators split and destroyed, see soak_prog.c; or
# soak_torch.py: process groups made and destroyed through torch) on NP ranks
# under `kaitian run` and prints, per rank and phase, the first and last
# resident set and descriptor count and the RSS slope.
# One host (default): one `kaitian run -n NP`. --hosts H: H "hosts" made of
# network namespaces (tests/multihost/hosts.sh), NP/H ranks each, one
# `kaitian run --nnodes H` per host (skipped, exit 77, where `ip netns add`
# fails; the namespaces are always removed).
# Fails when a rank reports SOAK_FAILED (a wrong result, RSS growth past the
# slack after the warm-up, descriptors not back to where they started), when
# a launcher exits non-zero, or when something of the job remains.
# Args: [--hosts H] KAITIAN_CLI PROG NP [PROG's key=value ...]
set -u
HOSTS=0
if [ "${1:-}" = --hosts ]; then HOSTS=$2; shift 2; fi
KT=${1:?usage: $0 [--hosts H] KAITIAN_CLI PROG NP [key=value ...]}
PROG=${2:?usage}
NP=${3:?usage}
shift 3
TMP=$(mktemp -d "${TMPDIR:-/tmp}/kt_soak.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
ls /dev/shm | grep -i kaitian | sort >"$TMP/shm.before"
status=0
t0=$(date +%s)
if [ "$HOSTS" -gt 0 ]; then
  . "$(dirname "$0")/../multihost/hosts.sh"
  hosts_start soak "$NP" "$HOSTS" "$TMP"
  trap 'rc=$?; hosts_down || rc=1; rm -rf "$TMP"; exit $rc' EXIT
  trap 'exit 130' INT TERM
  secret=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
  for k in $(seq 0 $((HOSTS - 1))); do
    hosts_exec "$k" env KAITIAN_JOB_SECRET="$secret" \
      "$KT" run -n $((NP / HOSTS)) --nnodes "$HOSTS" --node-rank "$k" --master "$HOSTS_NET.1:29400" \
      "$PROG" "$@" >"$TMP/out.$k" 2>"$TMP/err.$k" &
    echo $! >"$TMP/pid.$k"
  done
  rc=0
  for k in $(seq 0 $((HOSTS - 1))); do
    wait "$(cat "$TMP/pid.$k")"
    r=$?
    [ "$r" = 0 ] || rc=$r
  done
  for k in $(seq 0 $((HOSTS - 1))); do
    left=$(hosts_pids "$k")
    [ -z "$left" ] || { echo "FAIL: processes left on host $k: $left" >&2; status=1; }
  done
  where="on $HOSTS hosts (network namespaces)"
else
  "$KT" run -n "$NP" "$PROG" "$@" >"$TMP/out.0" 2>"$TMP/err.0"
  rc=$?
  where="on one host"
fi
echo "soak: $NP ranks $where, $(basename "$PROG") $* ($(($(date +%s) - t0)) s, launcher exit $rc)"
cat "$TMP"/out.* | grep -h 'SOAK rank=' | sed 's/^\[[0-9]*\] //' | sort -t= -k2n
ls /dev/shm | grep -i kaitian | sort >"$TMP/shm.after"
left=$(comm -13 "$TMP/shm.before" "$TMP/shm.after" | tr '\n' ' ')
if cat "$TMP"/err.* | grep -q 'SOAK_FAILED'; then cat "$TMP"/err.* | grep 'SOAK_FAILED' >&2; status=1; fi
[ "$rc" = 0 ] || { echo "FAIL: a launcher exited $rc" >&2; tail -n 30 "$TMP"/err.* >&2; status=1; }
[ "$(cat "$TMP"/out.* | grep -c 'SOAK_OK')" = "$NP" ] || { echo "FAIL: not every rank printed SOAK_OK" >&2; status=1; }
[ -z "$left" ] || { echo "FAIL: left in /dev/shm: $left" >&2; status=1; }
[ "$status" = 0 ] && echo PASSED
exit $status
