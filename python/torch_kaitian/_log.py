"""_log.py - the Python layer's INFO lines, at the level the C core logs at
(KAITIAN_DEBUG: NONE, WARN, INFO or TRACE; INFO and TRACE print them)."""
import os
import sys


def info_enabled():
    return os.environ.get("KAITIAN_DEBUG", "WARN").strip().upper() in ("INFO", "TRACE")


def info(message, force=False):
    """'torch_kaitian: message' on stderr at INFO (or when force)."""
    if force or info_enabled():
        print(f"torch_kaitian: {message}", file=sys.stderr, flush=True)
