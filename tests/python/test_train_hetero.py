#!/usr/bin/python3
"""test_train_hetero.py - examples/train_hetero.py as a user runs it: with
`kaitian run --devices cpu:2` it reaches >= 95% held-out accuracy, and because
the gradient is the exact mean over the global batch, a job split 1:3:2 over 3
ranks (KAITIAN_CAPABILITIES) follows the same loss curve (float32 tolerance).
Usage: test_train_hetero.py KAITIAN_CLI."""
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(HERE, "..", "..", "examples", "train_hetero.py")


def run(cli, launch, epochs, env_extra=None):
    env = dict(os.environ, **(env_extra or {}))
    cmd = [cli, "run"] + launch + [EXAMPLE, "--epochs", str(epochs), "--seed", "2"]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                       timeout=200)
    print(p.stdout)
    if p.returncode != 0:
        sys.exit(f"FAIL: {' '.join(cmd)} exited with {p.returncode}")
    losses = [float(m) for m in re.findall(r"train loss ([0-9.]+)", p.stdout)]
    accs = [float(m) / 100 for m in re.findall(r"held-out accuracy +([0-9.]+)%", p.stdout)]
    if len(losses) != epochs or len(accs) != epochs:
        sys.exit(f"FAIL: expected {epochs} epoch lines, got {len(losses)}")
    return losses, accs, p.stdout


def main():
    cli = sys.argv[1]
    losses, accs, out = run(cli, ["--devices", "cpu:2"], 15)
    if "2 ranks on cpu, cpu" not in out:
        sys.exit("FAIL: the plan cpu:2 did not give 2 CPU ranks")
    if accs[-1] < 0.95:
        sys.exit(f"FAIL: held-out accuracy {accs[-1]:.2%} < 95% after 15 epochs")
    l3, _, out3 = run(cli, ["-n", "3"], 3, {"KAITIAN_CAPABILITIES": "1,3,2"})
    if "shares of each batch of 64: [11, 32, 21]" not in out3:
        sys.exit("FAIL: KAITIAN_CAPABILITIES=1,3,2 did not give shares 11:32:21")
    worst = max(abs(a - b) / b for a, b in zip(l3, losses))
    if worst > 1e-3:
        sys.exit(f"FAIL: the 1:3:2 job's losses {l3} differ from the 2-rank job's {losses[:3]} "
                 f"by {worst:.2e} (relative)")
    print(f"PASS train_hetero: accuracy {accs[-1]:.2%}; loss curves of 2 ranks (even) and 3 "
          f"ranks (1:3:2) agree within {worst:.1e}")


if __name__ == "__main__":
    main()
