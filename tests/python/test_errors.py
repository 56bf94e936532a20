#!/usr/bin/python3
"""test_errors.py - failures in the core reach the user as Python exceptions
carrying the core's message: on wait(), in the torch Future, on blocking calls
and inside DDP's backward. Run as `kaitian run -n 2 test_errors.py SCENARIO`:

  timeout    rank 1 skips a collective: rank 0's async op fails with "Timed out"
             after the group's timeout (2 s), in wait(), the future and exception()
  dead_peer  rank 1 exits without a word: rank 0's next op fails within seconds,
             naming rank 1, and every later op on the group fails the same way
  mismatch   the ranks issue different collectives: both get KT_ERR_MISMATCH
             naming both sides
  ddp        rank 1 dies before backward: rank 0's DDP backward raises the
             core's error (the C++ reducer's path through the future)
  env_timeout  timeout with a 60 s group and KAITIAN_TIMEOUT=2000: the shorter
             wins; a malformed KAITIAN_TIMEOUT warns and is ignored
"""
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import torch_kaitian  # noqa: E402

RANK = int(os.environ["RANK"])


def expect_error(fn, *needles):
    try:
        fn()
    except RuntimeError as e:
        text = str(e)
        for n in needles:
            if n not in text:
                raise AssertionError(f"rank {RANK}: error lacks {n!r}: {text}") from e
        return e
    raise AssertionError(f"rank {RANK}: no error raised (expected one with {needles})")


def timeout():
    x = torch.ones(4)
    if RANK == 0:
        t0 = time.monotonic()
        w = dist.all_reduce(x, async_op=True)
        assert time.monotonic() - t0 < 1.0, "async all_reduce did not return at once"
        e = expect_error(w.wait, "Timed out", "KT_ERR_TIMEOUT", "rank 0 of 2", "allreduce")
        took = time.monotonic() - t0
        assert 1.5 < took < 20, f"timed out after {took:.1f} s, expected about 2 s"
        assert isinstance(e, torch_kaitian.KaitianError) and e.code_name == "KT_ERR_TIMEOUT", repr(e)
        expect_error(w.get_future().wait, "Timed out")
        assert not w.is_success() and w.is_completed()
        assert "Timed out" in str(w.exception())
        # The communicator is broken now: the next op fails at once, same cause.
        t1 = time.monotonic()
        expect_error(lambda: dist.all_reduce(x), "KT_ERR_TIMEOUT")
        assert time.monotonic() - t1 < 1.0
        print("rank 0: timeout surfaced in wait(), the future and exception()")
    else:
        time.sleep(5)


def dead_peer():
    dist.barrier()
    if RANK == 1:
        os._exit(0)
    time.sleep(0.5)
    t0 = time.monotonic()
    expect_error(lambda: dist.all_reduce(torch.ones(1000)), "rank 1")
    assert time.monotonic() - t0 < 15, "dead peer noticed too late"
    w = dist.all_reduce(torch.ones(10), async_op=True)
    expect_error(w.wait, "rank 1")
    print("rank 0: dead peer named in sync and async errors")


def mismatch():
    x = torch.ones(10 + RANK)
    e = expect_error(lambda: dist.all_reduce(x), "KT_ERR_MISMATCH")
    assert "rank 0" in str(e) and "rank 1" in str(e), str(e)
    print(f"rank {RANK}: mismatch reported: {e}")


def ddp():
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 64))
    model(torch.randn(8, 64)).sum().backward()  # one good step
    dist.barrier()
    if RANK == 1:
        os._exit(0)
    time.sleep(0.5)
    expect_error(lambda: model(torch.randn(8, 64)).sum().backward(), "kaitian backend", "rank 1")
    print("rank 0: DDP backward raised the core's error")


def env_timeout_check():
    """KAITIAN_TIMEOUT (2000 here) shortens the group's 60 s timeout; a
    malformed value warns once and is ignored."""
    import warnings
    from torch_kaitian.process_group import _ms
    assert _ms(timedelta(seconds=60)) == 2000, _ms(timedelta(seconds=60))
    assert _ms(timedelta(seconds=1)) == 1000, "a shorter group timeout must win"
    saved = os.environ["KAITIAN_TIMEOUT"]
    os.environ["KAITIAN_TIMEOUT"] = "abc"
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        assert _ms(timedelta(seconds=7)) == 7000
    os.environ["KAITIAN_TIMEOUT"] = saved
    assert any("KAITIAN_TIMEOUT='abc'" in str(w.message) for w in got), [str(w.message) for w in got]


def main():
    scenario = sys.argv[1]
    if scenario == "env_timeout":  # the timeout scenario with KAITIAN_TIMEOUT=2000 and a 60 s group
        env_timeout_check()
        dist.init_process_group("kaitian", timeout=timedelta(seconds=60))
        timeout()
        return
    dist.init_process_group("kaitian", timeout=timedelta(seconds=2 if scenario == "timeout" else 60))
    globals()[scenario]()
    if scenario == "mismatch":
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
