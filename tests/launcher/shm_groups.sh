#!/bin/sh
# shm_groups.sh - a torch job in a small /dev/shm (30 MiB, a private tmpfs in
# a mount namespace): its process group makes three communicators and a
# new_group three more, several of whose segments shrink to fit. (Each takes
# up to 3/4 of what is free when it is made, less the room the job's earlier
# communicators keep for their rings, so later ones get less.) The shrink
# warning is printed once for the job, not once per communicator (the others
# go to INFO), and every all_reduce is right. In 12 MiB the last
# communicators have no room at all: they run over TCP, with one warning
# that says so, and the job still runs (in 16 MiB it used to fail making its
# third). Skipped (77) without a mount namespace (needs root).
# Args: KAITIAN_CLI (KAITIAN_LIBRARY, PYTHONPATH set)
. "$(dirname "$0")/lib.sh" "$@"
need_mount_ns
PY=${PYTHON:-/usr/bin/python3}
cat >"$TMP/groups.py" <<'PYEOF'
import torch, torch.distributed as dist, torch_kaitian
dist.init_process_group("kaitian")
r, n = dist.get_rank(), dist.get_world_size()
t = torch.full((1 << 18,), float(r + 1))
dist.all_reduce(t)
assert torch.all(t == n * (n + 1) / 2), t[:4]
g = dist.new_group(list(range(n)))
u = torch.full((1 << 18,), 2.0)
dist.all_reduce(u, group=g)
assert torch.all(u == 2.0 * n)
out, inp = torch.full((1 << 17,), float(r)), torch.zeros(1 << 17)
reqs = [dist.isend(out, (r + 1) % n), dist.irecv(inp, (r - 1) % n)]
for q in reqs:
    q.wait()
assert torch.all(inp == float((r - 1) % n))
dist.destroy_process_group()
print("PASS groups rank", r)
PYEOF
with_shm 30m env KAITIAN_DEBUG=INFO "$KT" run -n 2 "$PY" "$TMP/groups.py" >"$TMP/out" 2>"$TMP/err"
expect_rc 0 $? "a torch job with a new_group in a 30 MiB /dev/shm: $(tail -5 "$TMP/err")"
[ "$(grep -c 'PASS groups' "$TMP/out")" = 2 ] || fail "not every rank passed: $(cat "$TMP/out")"
shrunk=$(grep -c 'too little for the shared memory of 2 ranks with the default sizes' "$TMP/err")
warned=$(grep 'too little for the shared memory of 2 ranks with the default sizes' "$TMP/err" | grep -c 'KAITIAN WARN')
echo "segments shrunk: $shrunk, warnings: $warned"
[ "$shrunk" -ge 3 ] || fail "expected several communicators to shrink, saw $shrunk: $(grep 'too little' "$TMP/err")"
[ "$warned" = 1 ] || fail "the shrink warning must be printed once per job, was $warned times: $(grep 'too little' "$TMP/err")"

with_shm 12m "$KT" run -n 2 "$PY" "$TMP/groups.py" >"$TMP/out" 2>"$TMP/err"
expect_rc 0 $? "the same job in a 12 MiB /dev/shm: $(tail -5 "$TMP/err")"
[ "$(grep -c 'PASS groups' "$TMP/out")" = 2 ] || fail "not every rank passed in 12 MiB: $(cat "$TMP/out")"
[ "$(grep -c 'use TCP instead' "$TMP/err")" = 1 ] ||
  fail "expected one warning that communicators use TCP for want of room: $(cat "$TMP/err")"
grep -q 'cannot reserve' "$TMP/err" && fail "something could not be reserved in 12 MiB: $(cat "$TMP/err")"
echo "PASS shm_groups"
