#!/usr/bin/python3
"""test_train_zero.py - examples/train_zero.py as a user runs it: ZeRO-2 with the
AdamW state offloaded to CPUAdam over kaitian on 4 ranks follows the loss curve
of DDP + torch.optim.AdamW (--plain; within 0.2% at epoch 1 and 2% after, as
far as rounding moves the curve) and reaches >= 90% held-out accuracy in 3
epochs, holding about 1/4 of the optimizer state per rank.
Usage: test_train_zero.py KAITIAN_CLI."""
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(HERE, "..", "..", "examples", "train_zero.py")


def run(cli, extra):
    cmd = [cli, "run", "-n", "4", EXAMPLE, "--epochs", "3"] + extra
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=250)
    print(p.stdout)
    if p.returncode != 0:
        sys.exit(f"FAIL: {' '.join(cmd)} exited with {p.returncode}")
    losses = [float(x) for x in re.findall(r"train loss ([0-9.]+)", p.stdout)]
    accs = [float(x) / 100 for x in re.findall(r"held-out accuracy +([0-9.]+)%", p.stdout)]
    if len(losses) != 3:
        sys.exit(f"FAIL: expected 3 epoch lines, got {len(losses)}")
    return losses, accs, p.stdout


def main():
    cli = sys.argv[1]
    zl, za, out = run(cli, [])
    if "ZeroOptimizer(stage=2, CPUAdam" not in out or "offload" not in out:
        sys.exit("FAIL: the example did not run ZeRO-2 with CPUAdam offloaded")
    state = [float(x) for x in re.findall(r"optimizer state on this rank ([0-9.]+) MiB", out)]
    full = 0.75e6 * 8 / 2**20  # exp_avg + exp_avg_sq of 0.75 M fp32 parameters
    if not state or not state[-1] <= full / 4 * 1.05:
        sys.exit(f"FAIL: optimizer state per rank {state} MiB, expected about {full / 4:.2f}")
    pl, pa, _ = run(cli, ["--plain"])
    # Relative tolerance per epoch. Rounding alone moves the curve more as it
    # goes on: on an AVX-512 machine (2026-11-28) the plain run itself read
    # 1.6970 0.3456 0.1941 with torch's AVX2 kernels and 1.6978 0.3435 0.1960
    # with its scalar ones (ATEN_CPU_CAPABILITY=avx2 / default: 5e-4, 6e-3,
    # 1e-2), and ZeRO-2 read 1.6970 0.3456 0.1936 (2.6e-3 at epoch 3). Epoch 1
    # still tells a wrong update: ZeRO-2 with the learning rate 2% off read
    # 1.6880 there (5.3e-3).
    tol = [2e-3, 2e-2, 2e-2]
    diff = [abs(a - b) / b for a, b in zip(zl, pl)]
    worst = max(diff)
    if any(d > t for d, t in zip(diff, tol)):
        sys.exit(f"FAIL: ZeRO-2 + CPUAdam losses {zl} differ from DDP + AdamW {pl} "
                 f"(relative {', '.join(f'{d:.1e}' for d in diff)}; allowed {tol})")
    if za[-1] < 0.90 or not zl[-1] < zl[0]:
        sys.exit(f"FAIL: accuracy {za[-1]:.2%} after 3 epochs, losses {zl}")
    print(f"PASS train_zero: losses {zl} (DDP + AdamW {pl}, within {worst:.1e}), accuracy "
          f"{za[-1]:.2%}, optimizer state {state[-1]} MiB per rank")


if __name__ == "__main__":
    main()
