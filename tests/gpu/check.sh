#!/bin/sh
# check.sh - the PyTorch binding on a machine with CUDA (not part of `make test`:
# CI has no GPU). Builds libkaitian, then runs with the Python that has a CUDA
# torch ($PYTHON, else python3):
#   1. the Python tests (test_ops repeats every case on cuda tensors when CUDA
#      is available; async, errors, import; test_solo: a group of one rank
#      moves nothing, CUDA tensors without a device sync), 2 and 3 ranks with --devices
#      auto+cpu (one rank per GPU, then CPU ranks: plain auto refuses -n
#      beyond the GPUs);
#   2. a job mixing a CUDA rank and a CPU rank (CUDA hidden from rank 1):
#      test_ops --quick and the digits demo;
#   2b. heterogeneous data parallelism in a job of one CUDA rank and two CPU
#      ranks (kaitian run --devices cuda:1,cpu:2): HeteroSampler + HeteroDDP
#      against one process in float64 (test_hetero.py exact --on-device), the
#      example train_hetero.py, and measure_capability on both device types;
#      HeteroDDP's batch-size exchange without a device sync (test_hetero.py
#      overhead); python -m torch_kaitian.bench --hetero at widths/batches
#      1024/512, 1024/8192, 4096/8192 (the planner against the GPU alone);
#   2c. the device path (torch_kaitian/_devpath.py): test_devpath.py cuda, every
#      pipelined op on CUDA tensors against two CPU ranks under torch's sync
#      debug mode "error" (no device synchronisation on the op path), and
#      test_devpath.py paths (pieces alike on every rank); then
#      python -m torch_kaitian.bench --device (the GPU rank alone: nccl, gloo,
#      kaitian; with 1 and 2 CPU ranks: gloo, kaitian, kaitian on CPU tensors;
#      DDP's comm per step);
#   3. the digits demo, 2 ranks of --devices auto+cpu (one rank per GPU, then
#      CPU ranks; on a 1-GPU host cuda:0 and cpu), over kaitian and over gloo
#      (same seed: the loss curves are printed side by side);
#   4. torch's conformance suite (tests/python/conformance.py) at 2 and 3 ranks,
#      with CUDA hidden (the suite needs a GPU per rank otherwise);
#   5. python -m torch_kaitian.bench (CPU tensors, kaitian vs gloo) on this torch;
#   6. kaitian bench allreduce, 2 ranks, 64 KiB-64 MiB, copying through the
#      segment and single-copy in registered buffers (-M), checked: the copy
#      routine (rep movsb) and the single-copy path on this host's CPU.
# Usage: tests/gpu/check.sh [OUTDIR]   (logs go to OUTDIR, default /tmp/kt_gpu)
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${1:-/tmp/kt_gpu}
PY=${PYTHON:-$(command -v python3)}
B="$ROOT/build-gpu"
mkdir -p "$OUT"
fails=0
run() { # name command...
  name=$1; shift
  printf '== %s: %s\n' "$name" "$*"
  if "$@" >"$OUT/$name.log" 2>&1; then echo "   ok"; else echo "   FAILED (rc $?), tail of $OUT/$name.log:"; tail -n 25 "$OUT/$name.log"; fails=$((fails + 1)); fi
}
"$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available(), torch.cuda.device_count(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")'
cmake -S "$ROOT" -B "$B" -DCMAKE_BUILD_TYPE=Release >"$OUT/cmake.log" 2>&1 &&
  cmake --build "$B" -j "$(nproc)" >>"$OUT/cmake.log" 2>&1 || { echo "build failed"; tail -n 30 "$OUT/cmake.log"; exit 1; }
export KAITIAN_LIBRARY="$B/libkaitian.so" PYTHONPATH="$ROOT/python" PYTHON="$PY" KAITIAN_TIMEOUT=120000
KT="$B/kaitian"
T="$ROOT/tests/python"
run import "$PY" "$T/test_import.py"
run ops_np1 "$KT" run -n 1 "$T/test_ops.py"
run solo "$KT" run -n 1 "$T/test_solo.py"
grep PASS "$OUT/solo.log"
run ops_np2 "$KT" run --devices auto+cpu -n 2 "$T/test_ops.py"
run ops_np3 "$KT" run --devices auto+cpu -n 3 "$T/test_ops.py" --quick
run async "$KT" run --devices auto+cpu -n 2 "$T/test_async.py"
for s in timeout dead_peer mismatch ddp; do run "errors_$s" "$KT" run --devices auto+cpu -n 2 "$T/test_errors.py" "$s"; done
# Rank 1 sees no CUDA device: a job mixing a GPU rank and a CPU rank.
cat >"$OUT/cpu_rank1.sh" <<'SH'
#!/bin/sh
[ "$RANK" = 1 ] && export CUDA_VISIBLE_DEVICES=
exec "$PYTHON" "$@"
SH
chmod +x "$OUT/cpu_rank1.sh"
run mixed_ops "$KT" run -n 2 "$OUT/cpu_rank1.sh" "$T/test_ops.py" --own-device
run mixed_digits "$KT" run -n 2 "$OUT/cpu_rank1.sh" "$ROOT/examples/train_digits.py" --epochs 4 --loss-log "$OUT/mixed.json"
if "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.device_count() >= 1 else 1)'; then
  run hetero_exact "$KT" run --devices cuda:1,cpu:2 "$T/test_hetero.py" exact --caps 4,1,1 --on-device
  run hetero_exact_accum "$KT" run --devices cuda:1,cpu:2 "$T/test_hetero.py" exact --caps 4,1,1 --accum 2 --on-device
  run hetero_example "$KT" run --devices cuda:1,cpu:2 "$ROOT/examples/train_hetero.py" --epochs 8
  echo "train_hetero:"; tail -n 9 "$OUT/hetero_example.log"
  run hetero_overhead "$KT" run --devices cuda:1,cpu:1 "$T/test_hetero.py" overhead
  # The planner on the configurations of issue 39's table (GPU alone against the
  # planned job with two CPU ranks; hetero/best_solo should be >= 0.97).
  for cfg in "1024 512" "1024 8192" "4096 8192"; do
    set -- $cfg
    run "bench_hetero_w$1_b$2" "$KT" run --devices cuda:1,cpu:2 "$PY" -m torch_kaitian.bench --hetero \
      --width "$1" --batch "$2" --slow 0 --fetch batch --steps 10 --warmup 2
    grep -E "alone|split|planned|plan:|hetero/" "$OUT/bench_hetero_w$1_b$2.log"
  done
  run devpath_cuda "$KT" run --devices cuda:1,cpu:2 "$T/test_devpath.py" cuda
  grep -E "PASS|returned after" "$OUT/devpath_cuda.log"
  run devpath_paths env KAITIAN_DEVICE_PIECE_BYTES=1000 "$KT" run --devices cuda:1,cpu:2 "$T/test_devpath.py" paths
  run bench_device_np2 "$KT" run --devices cuda:1,cpu:1 "$PY" -m torch_kaitian.bench --device
  run bench_device_np3 "$KT" run --devices cuda:1,cpu:2 "$PY" -m torch_kaitian.bench --device --skip-ddp
  echo "bench --device, 1 CPU rank:"; cat "$OUT/bench_device_np2.log"
  echo "bench --device, 2 CPU ranks:"; grep -A 6 "^2\." "$OUT/bench_device_np3.log"
else
  echo "== hetero_*, devpath_*, bench_device_*: SKIP (no CUDA device)"
fi
run digits_cuda "$KT" run --devices auto+cpu -n 2 "$ROOT/examples/train_digits.py" --loss-log "$OUT/kaitian.json"
run digits_gloo "$KT" run --devices auto+cpu -n 2 "$ROOT/examples/train_digits.py" --backend gloo --loss-log "$OUT/gloo.json"
"$PY" - "$OUT/kaitian.json" "$OUT/gloo.json" <<'PYEOF' || fails=$((fails + 1))
import json, sys
try:
    a, b = (json.load(open(f)) for f in sys.argv[1:3])
except Exception as e:
    print("no loss logs to compare:", e); sys.exit(1)
print("epoch   kaitian (cuda) loss   acc      gloo loss   acc      |diff|")
worst = 0.0
for x, y in zip(a["epochs"], b["epochs"]):
    d = abs(x["loss"] - y["loss"]); worst = max(worst, d)
    print(f"{x['epoch']:>5}   {x['loss']:19.6f} {x['accuracy']:6.2%}   {y['loss']:9.6f} {y['accuracy']:6.2%}   {d:.2e}")
print(f"reloaded accuracy: kaitian {a['reloaded_accuracy']:.2%}, gloo {b['reloaded_accuracy']:.2%}; largest loss difference {worst:.2e}")
sys.exit(0 if a["reloaded_accuracy"] >= 0.95 else 1)
PYEOF
# torch's suite skips every test when it sees fewer GPUs than ranks ("Need at
# least 2 CUDA devices"): run it on the CPU, which is what it tests for gloo.
run conformance env CUDA_VISIBLE_DEVICES= "$PY" "$T/conformance.py" --world-size 2,3
run bench "$PY" -m torch_kaitian.bench --reps 3 --scale 0.5
echo "bench:"; cat "$OUT/bench.log" | tail -n 40
run c_bench_copy "$KT" run -n 2 "$KT" bench -C allreduce -b 64K -e 64M -f 4 -I -n 50 -c 1
run c_bench_registered "$KT" run -n 2 "$KT" bench -C allreduce -b 64K -e 64M -f 4 -I -n 50 -c 1 -M
echo "C API allreduce, copying then single-copy:"; grep -v '^\[0\] #' "$OUT/c_bench_copy.log" | tail -n 6
grep -v '^\[0\] #' "$OUT/c_bench_registered.log" | tail -n 6
echo "== $fails failed"
[ "$fails" = 0 ]
