"""_lib.py - find and load libkaitian.so, declare the C API through ctypes.

The search order (first hit wins):
  1. $KAITIAN_LIBRARY (a path to the library file),
  2. next to this package (a wheel or `pip install .` bundles it there),
  3. the build tree of a source checkout: <repo>/build/, then any <repo>/build*/,
  4. the system loader (libkaitian.so.0 / libkaitian.so, e.g. after `make install`).
"""
import ctypes
import glob
import os
import re

# kt_result codes (include/kaitian.h, KT_RESULT_LIST).
SUCCESS = 0
ERR_INVALID_ARGUMENT = 1
ERR_NO_MEMORY = 2
ERR_SYSTEM = 3
ERR_TIMEOUT = 4
ERR_PEER_FAILED = 5
ERR_MISMATCH = 6
ERR_ABORTED = 7
ERR_STORE = 8
ERR_UNSUPPORTED = 9
ERR_IN_PROGRESS = 10
ERR_TRUNCATED = 11
ERR_INTERNAL = 12

# kt_dtype
INT8, UINT8, INT32, INT64, FLOAT16, BFLOAT16, FLOAT32, FLOAT64, BOOL = range(9)
# kt_op
SUM, PROD, MIN, MAX, AVG, BAND, BOR, BXOR = range(8)

_LIB_NAMES = ("libkaitian.so", "libkaitian.so.0")


def _candidates():
    """Yield (path, where) in search order."""
    env = os.environ.get("KAITIAN_LIBRARY")
    if env:
        yield env, "KAITIAN_LIBRARY"
        return  # an explicit choice is never silently replaced by another library
    here = os.path.dirname(os.path.abspath(__file__))
    for name in _LIB_NAMES:
        yield os.path.join(here, name), "package directory"
    repo = os.path.dirname(os.path.dirname(here))  # python/torch_kaitian -> repo root
    if os.path.isfile(os.path.join(repo, "include", "kaitian.h")):
        dirs = [os.path.join(repo, "build")]
        dirs += sorted(d for d in glob.glob(os.path.join(repo, "build*")) if d not in dirs)
        for d in dirs:
            # A sanitizer build cannot be loaded into an interpreter started without
            # the sanitizer runtime (ASan aborts the process): skip it.
            if _sanitized(d):
                continue
            for name in _LIB_NAMES:
                yield os.path.join(d, name), "build tree"
    for name in ("libkaitian.so.0", "libkaitian.so"):
        yield name, "system loader"


def _sanitized(build_dir):
    try:
        with open(os.path.join(build_dir, "CMakeCache.txt"), errors="replace") as f:
            cache = f.read()
    except OSError:
        return False
    return re.search(r"^KT_SANITIZE_(ADDRESS|THREAD):BOOL=(ON|1|TRUE|YES)", cache, re.M | re.I) is not None


# Symbols this binding needs: a library built before they existed is skipped.
_REQUIRED = ("kt_version_string", "kt_comm_init", "kt_cq_wait", "kt_request_notify", "kt_ialltoallv")


def _load():
    tried = []
    for path, where in _candidates():
        if where != "system loader" and not os.path.isfile(path):
            tried.append(f"{path} ({where}: missing)")
            continue
        try:
            lib = ctypes.CDLL(path)
            missing = [s for s in _REQUIRED if not hasattr(lib, s)]
            if missing:
                tried.append(f"{path} ({where}: too old or not KaiTian, lacks {', '.join(missing)})")
                continue
            return lib, path
        except (OSError, AttributeError) as e:
            tried.append(f"{path} ({where}: {e})")
    raise ImportError(
        "torch_kaitian: cannot load libkaitian.so; tried:\n  " + "\n  ".join(tried)
        + "\nBuild it (`make` at the repository root), install it (`make install`), "
        "or point KAITIAN_LIBRARY at the library file.")


lib, path = _load()

c_int, c_int64, c_uint64, c_size_t, c_void_p, c_char_p = (
    ctypes.c_int, ctypes.c_int64, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_char_p)
P = ctypes.POINTER


class Config(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("timeout_ms", c_int64), ("prefix", c_char_p)]


# Store callback signatures (kt_store_ops).
SET_FN = ctypes.CFUNCTYPE(c_int, c_void_p, c_char_p, c_void_p, c_size_t)
GET_FN = ctypes.CFUNCTYPE(c_int, c_void_p, c_char_p, c_void_p, c_size_t, P(c_size_t), c_int64)
ADD_FN = ctypes.CFUNCTYPE(c_int, c_void_p, c_char_p, c_int64, P(c_int64))
WAIT_FN = ctypes.CFUNCTYPE(c_int, c_void_p, P(c_char_p), c_size_t, c_int64)
CHECK_FN = ctypes.CFUNCTYPE(c_int, c_void_p, P(c_char_p), c_size_t, P(c_int))
DEL_FN = ctypes.CFUNCTYPE(c_int, c_void_p, c_char_p)
DESTROY_FN = ctypes.CFUNCTYPE(None, c_void_p)


class StoreOps(ctypes.Structure):
    _fields_ = [("set", SET_FN), ("get", GET_FN), ("add", ADD_FN), ("wait", WAIT_FN),
                ("check", CHECK_FN), ("del_", DEL_FN), ("destroy", DESTROY_FN)]


def _decl(name, restype, *argtypes):
    fn = getattr(lib, name)
    fn.restype = restype
    fn.argtypes = list(argtypes)
    return fn


_decl("kt_strerror", c_char_p, c_int)
_decl("kt_last_error", c_char_p)
_decl("kt_version_string", c_char_p)
_decl("kt_build_info", c_char_p)
_decl("kt_store_create", c_int, P(StoreOps), c_void_p, P(c_void_p))
_decl("kt_store_free", None, c_void_p)
_decl("kt_comm_init", c_int, P(c_void_p), c_int, c_int, c_void_p, P(Config))
_decl("kt_comm_destroy", c_int, c_void_p)
_decl("kt_comm_abort", c_int, c_void_p)
_decl("kt_comm_get_error", c_int, c_void_p)
_decl("kt_wait", c_int, c_void_p)
_decl("kt_test", c_int, c_void_p, P(c_int))
_decl("kt_cq_create", c_int, P(c_void_p))
_decl("kt_cq_destroy", None, c_void_p)
_decl("kt_request_notify", c_int, c_void_p, c_void_p, c_uint64)
_decl("kt_cq_post", c_int, c_void_p, c_uint64)
_decl("kt_cq_wait", c_int, c_void_p, P(c_uint64), c_int64)

# Collectives: blocking and non-blocking (the latter end with kt_request *).
_R = P(c_void_p)
_COLL = {
    "allreduce": (c_void_p, c_void_p, c_size_t, c_int, c_int, c_void_p),
    "broadcast": (c_void_p, c_void_p, c_size_t, c_int, c_int, c_void_p),
    "reduce": (c_void_p, c_void_p, c_size_t, c_int, c_int, c_int, c_void_p),
    "allgather": (c_void_p, c_void_p, c_size_t, c_int, c_void_p),
    "allgatherv": (c_void_p, c_size_t, c_void_p, P(c_size_t), P(c_size_t), c_int, c_void_p),
    "reduce_scatter": (c_void_p, c_void_p, c_size_t, c_int, c_int, c_void_p),
    "reduce_scatterv": (c_void_p, c_void_p, P(c_size_t), c_int, c_int, c_void_p),
    "gather": (c_void_p, c_void_p, c_size_t, c_int, c_int, c_void_p),
    "scatter": (c_void_p, c_void_p, c_size_t, c_int, c_int, c_void_p),
    "alltoall": (c_void_p, c_void_p, c_size_t, c_int, c_void_p),
    "alltoallv": (c_void_p, P(c_size_t), P(c_size_t), c_void_p, P(c_size_t), P(c_size_t), c_int,
                  c_void_p),
    "barrier": (c_void_p,),
    "send": (c_void_p, c_size_t, c_int, c_int, c_int, c_void_p),
    "recv": (c_void_p, c_size_t, c_int, c_int, c_int, c_void_p),
}
COLLECTIVES = tuple(_COLL)
for _name, _args in _COLL.items():
    _decl("kt_" + _name, c_int, *_args)
    _decl("kt_i" + _name, c_int, *(_args + (_R,)))
_decl("kt_mem_register", c_int, c_void_p, c_size_t, c_int, c_uint64)
_decl("kt_mem_deregister", c_int, c_void_p)
_decl("kt_mem_alloc", c_int, c_size_t, P(c_void_p))
_decl("kt_mem_free", c_int, c_void_p)
_decl("kt_sendrecv", c_int, c_void_p, c_size_t, c_int, c_void_p, c_size_t, c_int, c_int, c_int, c_void_p)


class AdamConfig(ctypes.Structure):
    """kt_adam_config (include/kaitian.h)."""
    _fields_ = [("struct_size", c_size_t), ("lr", ctypes.c_double), ("beta1", ctypes.c_double),
                ("beta2", ctypes.c_double), ("eps", ctypes.c_double),
                ("weight_decay", ctypes.c_double), ("adamw", c_int), ("bias_correction", c_int),
                ("step", c_int64), ("threads", c_int)]


# Optional: a library built before the optimizer kernels still serves the backend.
if hasattr(lib, "kt_adam_step"):
    _decl("kt_adam_step", c_int, P(AdamConfig), c_void_p, c_void_p, c_int, c_void_p, c_void_p,
          c_void_p, c_int, c_size_t)


def strerror(code):
    return lib.kt_strerror(code).decode(errors="replace")


def last_error():
    return lib.kt_last_error().decode(errors="replace")


def version():
    return lib.kt_version_string().decode()
