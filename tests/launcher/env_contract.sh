#!/bin/sh
# env_contract.sh - `kaitian run -n 3`: every rank sees the torchrun variables
# and KaiTian's own with the right, distinct values, and meets the others in
# the launcher's store. Args: KAITIAN_CLI STORE_PROBE
. "$(dirname "$0")/lib.sh" "$@"
PROBE=${2:?store probe program}

# Inherited values of the contract must be replaced; OMP_NUM_THREADS set.
unset OMP_NUM_THREADS PYTHONUNBUFFERED
RANK=99 WORLD_SIZE=99 KAITIAN_JOB_ID=stale KAITIAN_STORE_ADDR=1.2.3.4:5 \
  "$KT" run -n 3 "$PROBE" >"$TMP/a.out" 2>"$TMP/a.err"
expect_rc 0 $? "run -n 3 store probe"

cpus=$(nproc)  # the CPUs the launcher may run on, as it counts them
[ "$(grep -c '^\[[0-9]\] PROBE ' "$TMP/a.out")" = 3 ] || fail "expected 3 PROBE lines"
for r in 0 1 2; do
  # Bound (3 <= CPUs): the size of its block; else CPUs / 3, at least 1.
  if [ "$cpus" -ge 3 ]; then omp=$(((r + 1) * cpus / 3 - r * cpus / 3))
  else omp=1; fi
  line=$(grep "^\[$r\] PROBE " "$TMP/a.out") || fail "no output from rank $r"
  for kv in "rank=$r" "local=$r" "world=3" "lws=3" "group=0" "gws=1" "role=$r" "rws=3" \
            "maddr=127.0.0.1" "omp=$omp" "unbuffered=1" "met=3"; do
    echo "$line" | grep -q " $kv\( \|$\)" || fail "rank $r: expected $kv in: $line"
  done
  echo "$line" | grep -Eq ' store=127\.0\.0\.1:[0-9]+ ' || fail "rank $r: bad store address: $line"
  echo "$line" | grep -Eq ' secret=[0-9a-f]{32} ' || fail "rank $r: secret is not 32 hex: $line"
  echo "$line" | grep -Eq ' job=[0-9a-f]{16} ' || fail "rank $r: bad job id: $line"
done
# Shared values are the same on every rank; MASTER_PORT is not the store's.
for key in store secret job mport; do
  n=$(sed -n "s/.* $key=\([^ ]*\).*/\1/p" "$TMP/a.out" | sort -u | wc -l)
  [ "$n" = 1 ] || fail "$key differs between ranks"
done
sport=$(sed -n 's/.* store=127\.0\.0\.1:\([0-9]*\) .*/\1/p' "$TMP/a.out" | head -n 1)
mport=$(sed -n 's/.* mport=\([0-9]*\) .*/\1/p' "$TMP/a.out" | head -n 1)
[ -n "$mport" ] && [ "$mport" -gt 0 ] && [ "$mport" != "$sport" ] || fail "MASTER_PORT $mport vs store port $sport"
# torch's store binds MASTER_PORT only when rank 0 gets there: it must lie
# outside the ephemeral range, where no outgoing connection can take it first.
read -r elo ehi </proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || { elo=32768; ehi=60999; }
[ "$mport" -lt "$elo" ] || [ "$mport" -gt "$ehi" ] ||
  fail "MASTER_PORT $mport is in the ephemeral range ($elo-$ehi)"
grep -q 'job=stale' "$TMP/a.out" && fail "inherited KAITIAN_JOB_ID leaked into ranks"

# A second job gets another secret and job id; a user's OMP_NUM_THREADS is kept.
OMP_NUM_THREADS=7 "$KT" run -n 2 "$PROBE" >"$TMP/b.out" 2>"$TMP/b.err"
expect_rc 0 $? "second run"
s1=$(sed -n 's/.* secret=\([^ ]*\).*/\1/p' "$TMP/a.out" | head -n 1)
s2=$(sed -n 's/.* secret=\([^ ]*\).*/\1/p' "$TMP/b.out" | head -n 1)
j1=$(sed -n 's/.* job=\([^ ]*\).*/\1/p' "$TMP/a.out" | head -n 1)
j2=$(sed -n 's/.* job=\([^ ]*\).*/\1/p' "$TMP/b.out" | head -n 1)
[ "$s1" != "$s2" ] || fail "two jobs got the same secret $s1"
[ "$j1" != "$j2" ] || fail "two jobs got the same job id $j1"
[ "$(grep -c ' omp=7 ' "$TMP/b.out")" = 2 ] || fail "user's OMP_NUM_THREADS=7 not kept"
echo "PASS env_contract"
