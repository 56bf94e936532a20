#!/bin/sh
# soak.sh - long runs whose memory and descriptors must stay flat (make soak;
# a short one in make test). Runs soak_prog on NP ranks of this host under
# `kaitian run` (small and large allreduces, every collective, communicators
# split and destroyed; see soak_prog.c) and prints, per rank and phase, the
# first and last resident set and descriptor count and the RSS slope.
# Fails when a rank reports SOAK_FAILED (a wrong result, RSS growth past the
# slack after the warm-up, descriptors not back to where they started), when
# the launcher exits non-zero, or when something of the job remains.
# Args: KAITIAN_CLI SOAK_PROG NP [soak_prog key=value ...]
set -u
KT=${1:?usage: $0 KAITIAN_CLI SOAK_PROG NP [key=value ...]}
PROG=${2:?usage}
NP=${3:?usage}
shift 3
TMP=$(mktemp -d "${TMPDIR:-/tmp}/kt_soak.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
ls /dev/shm | grep -i kaitian | sort >"$TMP/shm.before"
t0=$(date +%s)
"$KT" run -n "$NP" "$PROG" "$@" >"$TMP/out" 2>"$TMP/err"
rc=$?
echo "soak: $NP ranks, $* ($(($(date +%s) - t0)) s, launcher exit $rc)"
grep -h 'SOAK rank=' "$TMP/out" | sed 's/^\[[0-9]*\] //' | sort -t= -k2n
ls /dev/shm | grep -i kaitian | sort >"$TMP/shm.after"
left=$(comm -13 "$TMP/shm.before" "$TMP/shm.after" | tr '\n' ' ')
status=0
if grep -q 'SOAK_FAILED' "$TMP/err"; then grep 'SOAK_FAILED' "$TMP/err" >&2; status=1; fi
[ "$rc" = 0 ] || { echo "FAIL: the launcher exited $rc" >&2; tail -n 30 "$TMP/err" >&2; status=1; }
[ "$(grep -c 'SOAK_OK' "$TMP/out")" = "$NP" ] || { echo "FAIL: not every rank printed SOAK_OK" >&2; status=1; }
[ -z "$left" ] || { echo "FAIL: left in /dev/shm: $left" >&2; status=1; }
[ "$status" = 0 ] && echo PASSED
exit $status
