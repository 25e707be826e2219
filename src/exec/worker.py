# falcon-rl exec worker: the trusted side of the sandbox (see docs/sandbox.md).
#
# One worker runs inside one bubblewrap sandbox and serves jobs from the
# trainer over length-prefixed JSON on its original stdin/stdout. It never
# executes candidate code itself: for every test it forks a child that drops
# to an unprivileged uid, applies rlimits and runs the candidate's solution.
# In "trusted" mode the worker then evaluates the test code itself, with every
# candidate-defined name replaced by a proxy that forwards calls to the child;
# the child answers with plain data only (tagged JSON), which the worker
# decodes into exact built-in types and compares. In "program" mode (numba
# kernels that mutate device arrays) the whole test runs in the child and only
# its completion is reported: that mode is NOT forgery-proof.
import builtins
import base64
import gc
import importlib
import json
import os
import re
import resource
import signal
import struct
import sys
import time

sys.path[:] = [p for p in sys.path if p not in ("", ".")]
LIM = json.loads(sys.argv[1])
PROTO_IN = os.dup(0)
PROTO_OUT = os.dup(1)
NULL = os.open(os.devnull, os.O_RDWR)
os.dup2(NULL, 0)
os.dup2(NULL, 1)

UID = LIM["uid"]
SETUID = LIM["setuid"]
JOBDIR = LIM["jobdir"]
MAX_MSG = LIM["max_msg"]
OUT_CAP = LIM["out_cap"]
GRACE = 0.5
CAND = "<candidate>"

# numpy is not imported up front: a worker that holds it pays for its
# 16 MiB and 70 mappings at every fork and every child's exit, 6-8% of a
# HumanEval job. The trusted side imports it at first need (`_numpy`, and
# `_preload_for` before a job that may use it); values are recognised as
# numpy's when numpy is loaded in the process that encodes them.
_np_tried = False


def _numpy():
    """The real numpy, imported on first need; None where it is missing."""
    global _np_tried
    np = sys.modules.get("numpy")
    if np is None and not _np_tried:
        _np_tried = True
        try:
            import numpy as np
        except BaseException:
            np = None
    return np


# ndonnx (NdonnxEval's private library) when installed: its arrays and
# dtypes travel as plain data ($x / $xd) and are rebuilt as real ndonnx
# objects on the receiving side, so the trusted side never holds one the
# candidate built.
_ndx = None


def _ndonnx():
    global _ndx
    if _ndx is None:
        try:
            import ndonnx
            _ndx = ndonnx
        except BaseException:
            _ndx = False
    return _ndx or None


# Standard-library preloads are imported now. The others (numpy) wait for the
# first job that imports a module outside the standard library or names one
# of them: pure-Python task sets never fork a worker that holds them.
_STDLIB = getattr(sys, "stdlib_module_names", None)


def _import_all(names):
    for m in names:
        try:
            importlib.import_module(m)
        except BaseException:
            pass


_deferred = [m for m in LIM.get("preload", []) if _STDLIB is not None and m.split(".")[0] not in _STDLIB]
_import_all(m for m in LIM.get("preload", []) if m not in _deferred)
# Import statements, by their whole shape: a docstring's "from two integers"
# must not count.
_IMPORTS = re.compile(r"^[ \t]*(?:from[ \t]+([\w.]+)[ \t]+import\b"
                      r"|import[ \t]+((?:[\w.]+(?:[ \t]+as[ \t]+\w+)?[ \t]*,[ \t]*)*[\w.]+(?:[ \t]+as[ \t]+\w+)?)"
                      r"[ \t]*(?:[;#].*)?$)", re.M)


def _wants_deferred(src):
    if any(m.split(".")[0] in src for m in _deferred):
        return True
    for frm, imp in _IMPORTS.findall(src):
        for name in [frm] if frm else imp.split(","):
            words = name.split()
            if words and words[0].split(".")[0] not in _STDLIB:
                return True
    return False


def _preload_for(sources):
    """Imports the deferred preloads before the first job that may use them."""
    if not _deferred:
        return
    if not any(type(src) is str and _wants_deferred(src) for src in sources):
        return
    _import_all(_deferred)
    del _deferred[:]
    gc.collect()
    gc.freeze()

# Modules the trusted side may import itself when the candidate bound a name
# to them (`import math`, `import numpy as np`): the test then gets the real
# module, never the candidate's copy. Others stay proxies into the child.
_DENY = {"antigravity", "this", "idlelib", "tkinter", "turtle", "turtledemo", "webbrowser", "pydoc"}
_ALLOW_ROOTS = (set(getattr(sys, "stdlib_module_names", ())) - _DENY) | {"numpy", "scipy", "numba", "sympy", "networkx",
                                                                       "ndonnx"}


# ---------------------------------------------------------------- framing

def _read_exact(fd, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = os.read(fd, min(n - len(buf), 1 << 20))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def recv(fd, cap):
    head = _read_exact(fd, 4)
    if head is None:
        return None
    (n,) = struct.unpack(">I", head)
    if n > cap:
        raise BadMessage("message of %d bytes exceeds the cap of %d" % (n, cap))
    body = _read_exact(fd, n)
    if body is None:
        return None
    return json.loads(body)


def send(fd, obj):
    data = json.dumps(obj, separators=(",", ":")).encode()
    data = struct.pack(">I", len(data)) + data
    view = memoryview(data)
    while view:
        k = os.write(fd, view)
        view = view[k:]


class BadMessage(Exception):
    pass


# ------------------------------------------------- plain-data encoding
# JSON plus one-key tag objects; every JSON object is a tag, so decoding is
# unambiguous: $t tuple, $s set, $f frozenset, $d dict (pair list), $b bytes,
# $c complex, $y a built-in type by name, $a numpy array [dtype, shape, base64], $r remote handle,
# $x an ndonnx array (its numpy value, as $a), $xd an ndonnx dtype by its name in the ndonnx namespace.

# Built-in types travel by name ({"$y": "int"}): tests pass them as arguments.
_BUILTIN_TYPES = {t.__name__: t for t in (int, float, str, bool, bytes, bytearray, complex, list, tuple,
                                          dict, set, frozenset, type(None), object)}


class Unsendable(Exception):
    pass


def encode(x, ref, depth=0):
    if depth > 200:
        raise Unsendable("value nested too deeply")
    t = type(x)
    if x is None or t is bool or t is str or t is int or t is float:
        return x
    d = depth + 1
    if t is list:
        return [encode(v, ref, d) for v in x]
    if t is tuple:
        return {"$t": [encode(v, ref, d) for v in x]}
    if t is dict:
        return {"$d": [[encode(k, ref, d), encode(v, ref, d)] for k, v in x.items()]}
    if t is set:
        return {"$s": [encode(v, ref, d) for v in x]}
    if t is frozenset:
        return {"$f": [encode(v, ref, d) for v in x]}
    if t is bytes or t is bytearray:
        return {"$b": base64.b64encode(bytes(x)).decode()}
    if t is complex:
        return {"$c": [x.real, x.imag]}
    if t is type and _BUILTIN_TYPES.get(x.__name__) is x:
        return {"$y": x.__name__}
    np = sys.modules.get("numpy")
    if np is not None and t.__module__.split(".")[0] == "ndonnx":
        ndx = _ndonnx()
        if ndx is not None and isinstance(x, ndx.Array):
            try:
                value = x.unwrap_numpy()
            except BaseException:
                raise Unsendable("an ndonnx array without a value")
            return {"$x": encode(np.asarray(value), ref, d)}
        if ndx is not None and isinstance(x, ndx.DType):
            for name in dir(ndx):
                if not name.startswith("_") and getattr(ndx, name) is x:
                    return {"$xd": name}
    if np is not None:
        if t is np.ndarray and x.dtype.kind not in "OV":
            return {"$a": [x.dtype.str, list(x.shape), base64.b64encode(np.ascontiguousarray(x).tobytes()).decode()]}
        if isinstance(x, np.generic):
            return encode(x.item(), ref, d)
    # Subclasses of plain types travel as their base value.
    if isinstance(x, bool):
        return bool(x)
    if isinstance(x, int):
        return int.__index__(x)
    if isinstance(x, float):
        return float.__float__(x)
    if isinstance(x, str):
        return str.__str__(x)
    if isinstance(x, tuple):
        return {"$t": [encode(v, ref, d) for v in tuple.__iter__(x)]}
    if isinstance(x, list):
        return [encode(v, ref, d) for v in list.__iter__(x)]
    if isinstance(x, dict):
        return {"$d": [[encode(k, ref, d), encode(v, ref, d)] for k, v in dict.items(x)]}
    return ref(x)


def decode(v, deref, depth=0):
    if depth > 200:
        raise BadMessage("value nested too deeply")
    t = type(v)
    if v is None or t is bool or t is str or t is int or t is float:
        return v
    d = depth + 1
    if t is list:
        return [decode(e, deref, d) for e in v]
    if t is not dict or len(v) != 1:
        raise BadMessage("malformed value")
    (tag, p), = v.items()
    if tag == "$r":
        if type(p) is not int:
            raise BadMessage("malformed handle")
        return deref(p)
    if tag == "$y":
        if type(p) is not str or p not in _BUILTIN_TYPES:
            raise BadMessage("unknown type")
        return _BUILTIN_TYPES[p]
    if tag == "$c":
        if type(p) is not list or len(p) != 2 or not all(type(e) in (int, float) for e in p):
            raise BadMessage("malformed complex")
        return complex(p[0], p[1])
    if tag == "$b":
        if type(p) is not str:
            raise BadMessage("malformed bytes")
        return base64.b64decode(p, validate=True)
    if tag == "$a":
        np = _numpy()
        if np is None or type(p) is not list or len(p) != 3 or type(p[0]) is not str or type(p[2]) is not str:
            raise BadMessage("malformed array")
        dt = np.dtype(p[0])
        if dt.kind in "OV" or type(p[1]) is not list or not all(type(s) is int and s >= 0 for s in p[1]):
            raise BadMessage("array of unsupported dtype or shape")
        return np.frombuffer(base64.b64decode(p[2], validate=True), dtype=dt).reshape(p[1]).copy()
    if tag == "$x":
        ndx = _ndonnx()
        if ndx is None or type(p) is not dict or list(p) != ["$a"]:
            raise BadMessage("malformed ndonnx array")
        return ndx.asarray(decode(p, deref, d))
    if tag == "$xd":
        ndx = _ndonnx()
        if ndx is None or type(p) is not str or p.startswith("_") or not isinstance(getattr(ndx, p, None), ndx.DType):
            raise BadMessage("unknown ndonnx dtype")
        return getattr(ndx, p)
    if type(p) is not list:
        raise BadMessage("malformed container")
    if tag == "$t":
        return tuple(decode(e, deref, d) for e in p)
    if tag == "$s":
        return set(decode(e, deref, d) for e in p)
    if tag == "$f":
        return frozenset(decode(e, deref, d) for e in p)
    if tag == "$d":
        out = {}
        for kv in p:
            if type(kv) is not list or len(kv) != 2:
                raise BadMessage("malformed dict")
            out[decode(kv[0], deref, d)] = decode(kv[1], deref, d)
        return out
    raise BadMessage("unknown tag")


# ----------------------------------------------------------- the child
# Everything below `_child_main` runs in the forked, unprivileged process
# that executes candidate code. It can be subverted by that code; nothing it
# sends is believed beyond being plain data.

class _CandidateTimeout(BaseException):
    pass


_in_child = False


def _on_timer(signum, frame):
    """SIGALRM / SIGPROF on either side: the worker installs it once and its
    children inherit it, so a child makes no `signal.signal` call of its own.
    Its first one costs 0.1-0.2 ms (signal.py's enum conversion of the old
    handler runs cold, faulting in copy-on-write pages), about 4% of a
    HumanEval job."""
    if _in_child:
        raise _CandidateTimeout()
    raise Deadline()


# The child's own timer, SIGALRM either way. "cpu" (the default, so that a
# test's verdict does not depend on how busy the machine is): a POSIX timer on
# the process's CPU-time clock, which counts the scheduler's exact runtime.
# ITIMER_PROF would be simpler, but it is charged in whole scheduler ticks: on
# a shared CPU it fired after 0.8 s of real CPU time for a 1 s limit. It
# stays as the fallback where timer_create is missing. "wall": ITIMER_REAL.
CLOCKS = ("cpu", "wall")
try:
    import ctypes

    class _Timespec(ctypes.Structure):
        _fields_ = [("sec", ctypes.c_long), ("nsec", ctypes.c_long)]

    class _Itimerspec(ctypes.Structure):
        _fields_ = [("interval", _Timespec), ("value", _Timespec)]

    _libc = ctypes.CDLL(None, use_errno=True)
    if not (hasattr(_libc, "timer_create") and hasattr(_libc, "timer_settime")):
        _libc = None
    else:
        # Built here, once, so that arming in a fresh child converts no
        # arguments and creates no ctypes objects (it runs cold there).
        _libc.timer_create.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
        _libc.timer_settime.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
        _timer_id = ctypes.c_void_p()
        _timer_id_ref = ctypes.byref(_timer_id)
        _timer_spec = _Itimerspec()
        _timer_spec_ref = ctypes.byref(_timer_spec)
except BaseException:
    _libc = None
_CLOCK_PROCESS_CPUTIME_ID = 2
try:
    # signal.signal's wrapper turns the old handler into an enum, which for a
    # Python handler raises and catches a ValueError: 0.2 ms in a fresh child.
    from _signal import signal as _raw_signal, SIG_DFL as _SIG_DFL
except ImportError:
    _raw_signal, _SIG_DFL = signal.signal, signal.SIG_DFL
_clock = "wall"
_cpu_timer = False


def _arm(seconds):
    """(Re)arm the child's timer to fire after `seconds` on its clock."""
    global _cpu_timer
    if _clock == "wall":
        signal.setitimer(signal.ITIMER_REAL, seconds)
        return
    if _libc is not None and not _cpu_timer:
        _cpu_timer = _libc.timer_create(_CLOCK_PROCESS_CPUTIME_ID, None, _timer_id_ref) == 0
    if not _cpu_timer:
        signal.setitimer(signal.ITIMER_PROF, seconds)
        return
    sec = int(seconds)
    _timer_spec.value.sec = sec
    _timer_spec.value.nsec = int((seconds - sec) * 1e9)
    if _libc.timer_settime(_timer_id, 0, _timer_spec_ref, None) != 0:
        raise OSError(ctypes.get_errno(), "timer_settime")


def _exc_info(e):
    name = "Timeout" if isinstance(e, _CandidateTimeout) else type(e).__name__
    try:
        msg = str(e)[:500]
    except BaseException:
        msg = ""
    lines = []
    if isinstance(e, SyntaxError) and getattr(e, "filename", None) == CAND and isinstance(e.lineno, int):
        lines.append(e.lineno)
    tb = e.__traceback__
    deepest = None
    in_test = False
    while tb is not None:
        fn = tb.tb_frame.f_code.co_filename
        if fn == CAND:
            deepest = tb.tb_lineno
        in_test = fn == "<test>"
        tb = tb.tb_next
    if deepest is not None and not lines:
        lines.append(deepest)
    return {"type": name, "msg": msg, "lines": lines, "in_test": in_test}


def _span(f):
    code = getattr(f, "__code__", None)
    if code is None or code.co_filename != CAND:
        return None
    ls = [ln for (_, _, ln) in code.co_lines() if ln is not None]
    return [code.co_firstlineno, max(ls) if ls else code.co_firstlineno]


SIM_THREADS = 1100


def _become_candidate(tdir, argv0, path_first):
    """The last steps into a candidate process: its directory, its uid, an
    environment and import path that point nowhere else."""
    os.chdir(tdir)
    if SETUID:
        os.setgroups([])
        os.setgid(UID)
        os.setuid(UID)
    os.environ["HOME"] = tdir
    os.environ["TMPDIR"] = tdir
    sys.path[:] = path_first + [p for p in sys.path if p not in ("", ".")]
    sys.argv[:] = [argv0]


def _child_main(code_objs, rfd, wfd, outfd, tdir, timeout, clock, mode, setup, test, ntests):
    global _clock, _in_child
    _in_child = True
    try:
        os.setsid()
        os.dup2(NULL, 0)
        os.dup2(outfd, 1)
        os.dup2(outfd, 2)
        os.dup2(rfd, 3)
        os.dup2(wfd, 4)
        os.closerange(5, 1 << 16)
        rfd, wfd = 3, 4
        on_gpu = mode == "program" and LIM.get("cuda_device")
        # A CUDA context reserves tens of GiB of (PROT_NONE) address space:
        # on the GPU, the memory limit applies to the data segment instead.
        as_res = resource.RLIMIT_DATA if on_gpu else resource.RLIMIT_AS
        for name, res in (("as", as_res), ("fsize", resource.RLIMIT_FSIZE),
                          ("nofile", resource.RLIMIT_NOFILE), ("nproc", resource.RLIMIT_NPROC)):
            # Without a uid of its own, NPROC would count the user's other processes.
            lim = LIM[name]
            if name == "nproc" and mode == "program":
                # numba's CUDA simulator runs one Python thread per CUDA
                # thread of a block (up to 1024): numba tasks need that many.
                lim = max(lim, SIM_THREADS)
            if name != "nproc" or SETUID:
                resource.setrlimit(res, (lim, lim))
        if mode == "program":
            # ...and each of those threads would reserve an 8 MiB stack of
            # address space: 256 of them alone exceed the memory limit.
            import threading
            threading.stack_size(512 * 1024)
        # The soft limit is re-armed per test when the process serves several
        # (`reuse_child`); the hard limit bounds the whole job.
        resource.setrlimit(resource.RLIMIT_CPU, (LIM["cpu"], LIM["cpu"] * max(1, ntests) + 1))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        _become_candidate(tdir, CAND, [])
        _clock = clock
        _arm(timeout)
    except BaseException:
        os._exit(71)
    try:
        _child_serve(code_objs, rfd, wfd, mode, setup, test)
    except BaseException:
        pass
    os._exit(0)


def _child_serve(code_objs, rfd, wfd, mode, setup, test):
    g = {"__name__": "__main__", "__builtins__": builtins}
    refs = []

    def ref(x):
        refs.append(x)
        return {"$r": len(refs) - 1}

    def deref(i):
        if not 0 <= i < len(refs):
            raise BadMessage("unknown handle")
        return refs[i]

    try:
        if mode == "program" and LIM.get("cuda_device"):
            _cap_cuda_memory(float(LIM.get("cuda_memory_fraction", 0.05)))
        # The task's prelude (its prompt's imports), then the candidate.
        for code_obj in code_objs:
            exec(code_obj, g)
        if mode == "program":
            if setup:
                exec(compile(setup, "<setup>", "exec"), g)
            exec(compile(test, "<test>", "exec"), g)
            send(wfd, {"done": True})
            return
        listing = {}
        for name, v in list(g.items()):
            if type(name) is not str or name.startswith("__"):
                continue
            if type(v).__name__ == "module":
                listing[name] = {"mod": str(getattr(v, "__name__", "")), "ref": ref(v)["$r"]}
            else:
                listing[name] = {"val": encode(v, ref)}
        send(wfd, {"ns": listing})
    except BaseException as e:
        send(wfd, {"exc": _exc_info(e)})
        return
    while True:
        req = recv(rfd, MAX_MSG)
        if req is None:
            return
        try:
            op = req["op"]
            reply = {}
            if op == "rearm":
                # The next test of a reused process: a fresh time budget.
                _arm(float(req["t"]))
                ru = resource.getrusage(resource.RUSAGE_SELF)
                _, hard = resource.getrlimit(resource.RLIMIT_CPU)
                soft = int(ru.ru_utime + ru.ru_stime) + LIM["cpu"]
                resource.setrlimit(resource.RLIMIT_CPU, (min(soft, hard), hard))
                send(wfd, {"ok": None})
                continue
            obj = deref(req["obj"])
            if op == "call":
                args = [decode(a, deref) for a in req["args"]]
                kwargs = {k: decode(a, deref) for k, a in req["kwargs"]}
                reply["span"] = _span(obj)
                res = obj(*args, **kwargs)
                np = sys.modules.get("numpy")
                reply["out"] = [[i, encode(a, ref)] for i, a in enumerate(args)
                                if type(a) in (list, dict, set) or (np is not None and type(a) is np.ndarray)]
            elif op == "getattr":
                res = getattr(obj, req["name"])
            elif op == "setattr":
                setattr(obj, req["name"], decode(req["value"], deref))
                res = None
            elif op == "getitem":
                res = obj[decode(req["key"], deref)]
            elif op == "setitem":
                obj[decode(req["key"], deref)] = decode(req["value"], deref)
                res = None
            elif op == "list":
                res = list(obj)
            elif op == "bool":
                res = bool(obj)
            elif op == "repr":
                res = repr(obj) if req.get("repr") else str(obj)
            else:
                raise BadMessage("unknown op")
            reply["ok"] = encode(res, ref)
        except BaseException as e:
            reply = {"exc": _exc_info(e)}
        send(wfd, reply)


def _cap_cuda_memory(fraction):
    """Make numba refuse device allocations past `fraction` of the GPU's
    memory, so candidates leave the rest to the trainer. Cooperative: code
    that calls the CUDA driver itself bypasses it (docs/sandbox.md)."""
    from numba import cuda
    from numba.cuda.cudadrv import driver as drv

    class CappedMemoryManager(drv.NumbaCUDAMemoryManager):
        def initialize(self):
            super().initialize()
            self._cap = int(self.get_memory_info().total * fraction)

        def _admit(self, size):
            live = sum(getattr(m, "size", 0) for m in list(self.allocations.values()))
            if live + size > getattr(self, "_cap", 0):
                raise MemoryError("CUDA allocation of %d bytes exceeds the sandbox's share of GPU memory "
                                  "(%d of %d bytes already in use)" % (size, live, self._cap))

        def memalloc(self, size):
            self._admit(size)
            return super().memalloc(size)

        def memallocmanaged(self, size, attach_global):
            self._admit(size)
            return super().memallocmanaged(size, attach_global)

    cuda.set_memory_manager(CappedMemoryManager)


# ------------------------------------------------------- trusted side

class Deadline(BaseException):
    pass


class ChildGone(BaseException):
    """The child died or answered nonsense: the test cannot pass."""

    def __init__(self, kind, message):
        self.kind = kind
        self.message = message


class Harness(BaseException):
    """Our limitation, not the candidate's fault: the sample gets no signal."""


class Starved(Harness):
    """The wall-clock backstop fired while the candidate was waiting for a
    CPU, not running or sleeping: the machine's load, not the code. The
    sample gets no signal (and the trainer runs it again)."""


def _schedstat(pid):
    """(CPU ns, run-queue wait ns) of a process so far, or None."""
    try:
        with open("/proc/%d/schedstat" % pid) as f:
            cpu, wait = f.read().split()[:2]
        return int(cpu), int(wait)
    except (OSError, ValueError):
        return None


def _children_cpu_and_nice(pid):
    """CPU seconds of the children a process has waited for (cutime +
    cstime), and its nice value; None when /proc cannot tell."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            st = f.read()
        fields = st[st.rfind(b")") + 2:].split()
        return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK"), int(fields[16])
    except (OSError, ValueError, IndexError):
        return None


def _starved(pid, since, wall, cpu_limit):
    """Whether the process spent at least half of the wall limit waiting on
    a run queue since `since` (its schedstat then) and had not yet used its
    CPU limit: it wanted a CPU and the machine had none for it (a candidate
    past its CPU limit that ignores the timer is timed out, whatever the
    load). Never when the candidate starved itself: any
    other process of its uid alive (a fork bomb competes with its own
    parent), CPU spent by children it has reaped, or a priority it lowered."""
    now = _schedstat(pid)
    if now is None:
        return False
    others = [p for p in _procs_of_uid() if p not in (pid, os.getpid())]
    stat = _children_cpu_and_nice(pid)
    if others or stat is None or stat[0] > 0.05 or stat[1] > os.getpriority(os.PRIO_PROCESS, 0):
        return False
    cpu0, wait0 = since if since else (0, 0)
    return (now[1] - wait0) / 1e9 >= 0.5 * wall and (now[0] - cpu0) / 1e9 < cpu_limit


class CandidateRaised:
    """Mixin marking an exception that candidate code raised in the child."""


_exc_classes = {}


def _candidate_exception(info):
    name = info.get("type") if type(info.get("type")) is str else "Exception"
    base = getattr(builtins, name, None)
    if not (isinstance(base, type) and issubclass(base, Exception)):
        base = Exception
    cls = _exc_classes.get((name, base))
    if cls is None:
        cls = type(name, (base, CandidateRaised), {})
        _exc_classes[(name, base)] = cls
    e = cls(str(info.get("msg", ""))[:500])
    e.kind = "Timeout" if name == "Timeout" else name
    lines = info.get("lines")
    e.lines = [int(x) for x in lines if type(x) is int] if type(lines) is list else []
    return e


class Child:
    def __init__(self, code_objs, tdir, outfd, timeout, clock, mode, setup, test, ntests):
        r1, w1 = os.pipe()  # trusted -> child
        r2, w2 = os.pipe()  # child -> trusted
        pid = os.fork()
        if pid == 0:
            _child_main(code_objs, r1, w2, outfd, tdir, timeout, clock, mode, setup, test, ntests)
            os._exit(72)
        os.close(r1)
        os.close(w2)
        self.pid = pid
        self.wfd = w1
        self.rfd = r2
        self.status = None
        self.timed_out = False
        self.last_span = None
        self.refs = {}

    def _gone(self):
        if self.status is None:
            try:
                _, self.status = os.waitpid(self.pid, 0)
            except ChildProcessError:
                self.status = 0
        st = self.status
        if os.WIFSIGNALED(st):
            sig = os.WTERMSIG(st)
            if sig in (signal.SIGXCPU, signal.SIGKILL) and self.timed_out:
                return ChildGone("Timeout", "time limit exceeded")
            if sig == signal.SIGXCPU:
                return ChildGone("Timeout", "CPU time limit exceeded")
            if sig == signal.SIGXFSZ:
                return ChildGone("Other", "file size limit exceeded (output or disk)")
            return ChildGone("Other", "candidate process killed by signal %d" % sig)
        return ChildGone("Other", "candidate process exited with status %d before answering" % os.WEXITSTATUS(st))

    def recv(self):
        try:
            msg = recv(self.rfd, MAX_MSG)
        except (BadMessage, ValueError, RecursionError) as e:
            raise ChildGone("Other", "invalid answer from candidate process: %s" % e)
        except OSError:
            msg = None
        if msg is None:
            raise self._gone()
        if type(msg) is not dict:
            raise ChildGone("Other", "invalid answer from candidate process")
        return msg

    def deref(self, i):
        r = self.refs.get(i)
        if r is None:
            r = Remote(self, i)
            self.refs[i] = r
        return r

    def rpc(self, req):
        if self.status is not None:
            raise ChildGone("Other", "candidate process is gone")
        try:
            send(self.wfd, req)
        except OSError:
            raise self._gone()
        msg = self.recv()
        if "exc" in msg and type(msg["exc"]) is dict:
            raise _candidate_exception(msg["exc"])
        if "ok" not in msg:
            raise ChildGone("Other", "invalid answer from candidate process")
        try:
            return msg, decode(msg["ok"], self.deref)
        except (BadMessage, ValueError, TypeError, RecursionError) as e:
            raise ChildGone("Other", "invalid answer from candidate process: %s" % e)

    def kill(self):
        for fd in (self.wfd, self.rfd):
            try:
                os.close(fd)
            except OSError:
                pass
        if self.status is None:
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except OSError:
                pass
            try:
                os.kill(self.pid, signal.SIGKILL)
            except OSError:
                pass
            try:
                _, self.status = os.waitpid(self.pid, 0)
            except ChildProcessError:
                self.status = 0


def _send_value(child, x):
    def ref(obj):
        if isinstance(obj, Remote) and object.__getattribute__(obj, "_c") is child:
            return {"$r": object.__getattribute__(obj, "_id")}
        raise Harness("a test passes a %s to candidate code, which the sandbox cannot send" % type(obj).__name__)
    try:
        return encode(x, ref)
    except Unsendable as e:
        raise Harness(str(e))


class Remote:
    """A handle on an object living in the child. Calls, attribute and item
    access are forwarded; equality is identity, so a candidate object can never
    make a comparison come out true; truth value is the child's plain bool."""

    __slots__ = ("_c", "_id")

    def __init__(self, c, i):
        object.__setattr__(self, "_c", c)
        object.__setattr__(self, "_id", i)

    def _rpc(self, **req):
        req["obj"] = object.__getattribute__(self, "_id")
        c = object.__getattribute__(self, "_c")
        return c.rpc(req)

    def __call__(self, *args, **kwargs):
        c = object.__getattribute__(self, "_c")
        enc = [_send_value(c, a) for a in args]
        kw = [[k, _send_value(c, v)] for k, v in kwargs.items()]
        msg, res = self._rpc(op="call", args=enc, kwargs=kw)
        span = msg.get("span")
        if type(span) is list and len(span) == 2 and all(type(s) is int for s in span):
            c.last_span = span
        out = msg.get("out")
        if type(out) is list:
            _copy_back(c, args, out)
        return res

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return self._rpc(op="getattr", name=name)[1]

    def __setattr__(self, name, value):
        c = object.__getattribute__(self, "_c")
        self._rpc(op="setattr", name=name, value=_send_value(c, value))

    def __getitem__(self, key):
        c = object.__getattribute__(self, "_c")
        return self._rpc(op="getitem", key=_send_value(c, key))[1]

    def __setitem__(self, key, value):
        c = object.__getattribute__(self, "_c")
        self._rpc(op="setitem", key=_send_value(c, key), value=_send_value(c, value))

    def _materialize(self):
        res = self._rpc(op="list")[1]
        if type(res) is not list:
            raise TypeError("candidate object did not iterate to a list")
        return res

    def __iter__(self):
        return iter(self._materialize())

    def __len__(self):
        return len(self._materialize())

    def __bool__(self):
        # Asked of the child, answered as a plain bool. No weaker than the
        # candidate returning True itself: a test that only asks for truth
        # (`assert f(x)`) accepts any truthy result by design.
        res = self._rpc(op="bool")[1]
        if type(res) is not bool:
            raise TypeError("candidate object's truth value is not a bool")
        return res

    def __eq__(self, other):
        return self is other

    def __ne__(self, other):
        return self is not other

    def __hash__(self):
        return id(self)

    def __str__(self):
        res = self._rpc(op="repr", repr=False)[1]
        if type(res) is not str:
            raise TypeError("__str__ returned non-string")
        return res

    def __repr__(self):
        try:
            res = self._rpc(op="repr", repr=True)[1]
        except BaseException:
            return "<candidate object>"
        return res if type(res) is str else "<candidate object>"


def _copy_back(child, args, out):
    np = sys.modules.get("numpy")
    for item in out:
        if type(item) is not list or len(item) != 2 or type(item[0]) is not int or not 0 <= item[0] < len(args):
            continue
        orig = args[item[0]]
        try:
            new = decode(item[1], child.deref)
        except (BadMessage, ValueError, TypeError, RecursionError):
            raise ChildGone("Other", "invalid answer from candidate process")
        t = type(orig)
        if t is list and type(new) is list:
            orig[:] = new
        elif t is dict and type(new) is dict:
            orig.clear()
            orig.update(new)
        elif t is set and type(new) is set:
            orig.clear()
            orig.update(new)
        elif np is not None and t is np.ndarray and type(new) is np.ndarray and new.shape == orig.shape:
            orig[...] = new


def _namespace(child, listing):
    ns = {"__name__": "__main__", "__builtins__": builtins}
    if type(listing) is not dict:
        raise ChildGone("Other", "invalid answer from candidate process")
    for name, ent in listing.items():
        if type(name) is not str or not name.isidentifier() or type(ent) is not dict:
            continue
        try:
            if "mod" in ent:
                mod = ent["mod"]
                got = None
                if type(mod) is str:
                    got = sys.modules.get(mod)
                    if got is None and mod.split(".")[0] in _ALLOW_ROOTS:
                        try:
                            got = importlib.import_module(mod)
                        except BaseException:
                            got = None
                ns[name] = got if got is not None else child.deref(int(ent["ref"]))
            elif "val" in ent:
                ns[name] = decode(ent["val"], child.deref)
        except (BadMessage, ValueError, TypeError, RecursionError):
            raise ChildGone("Other", "invalid answer from candidate process")
    return ns


_compiled = {}


def _compile_cached(src, name):
    key = (src, name)
    c = _compiled.get(key)
    if c is None:
        if len(_compiled) > 4096:
            _compiled.clear()
        c = compile(src, name, "exec")
        _compiled[key] = c
    return c


def _result(status, kind=None, message="", lines=(), seconds=0.0):
    return {"status": status, "kind": kind, "message": message[:500], "lines": sorted(set(lines)), "seconds": seconds}


def _procs_of_uid():
    out = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                if os.stat("/proc/" + p).st_uid == UID:
                    with open("/proc/%s/stat" % p, "rb") as f:
                        st = f.read()
                    if st[st.rfind(b")") + 2:st.rfind(b")") + 3] != b"Z":
                        out.append(int(p))
            except OSError:
                pass
    return out


def _reap():
    """Kill every process of the candidate uid (daemons included)."""
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass
    if not SETUID:
        return
    for _ in range(200):
        if not _procs_of_uid():
            return
        pid = os.fork()
        if pid == 0:
            try:
                os.setgid(UID)
                os.setuid(UID)
                os.kill(-1, signal.SIGKILL)
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            pass
        time.sleep(0.001)


def _rmtree(path):
    import shutil
    shutil.rmtree(path, ignore_errors=True)


def _fresh_tdir():
    tdir = os.path.join(JOBDIR, "t")
    # Reuse the test directory when the last candidate left it empty and
    # unchanged; otherwise start from a fresh one.
    try:
        st = os.lstat(tdir)
        fresh = not (st.st_mode == 0o40700 and st.st_uid == (UID if SETUID else os.getuid()) and not os.listdir(tdir))
    except OSError:
        fresh = True
    if fresh:
        _rmtree(tdir)
        os.mkdir(tdir, 0o700)
        if SETUID:
            os.chown(tdir, UID, UID)
    return tdir


def _end_child(st, outpath):
    """Kill the job's candidate process (and anything it left), and keep the
    tail of what it printed."""
    child = st.pop("child", None)
    if child is not None:
        child.kill()
    _reap()
    if child is not None:
        child.refs.clear()
        st["out"] = (st.get("out", b"") + _tail(outpath, OUT_CAP))[-OUT_CAP:]


def run_test(job, code_objs, i, outpath, st):
    """Run test `i`. `st` carries the candidate process between the tests of
    a job: it is kept only after a pass (with `reuse_child`), so a test that
    failed, crashed or timed out never shares a process with the next one."""
    timeout = float(job["timeout"])
    clock = job["clock"] if job.get("clock") in CLOCKS else "wall"
    # The worker's own deadline is always wall time: it is what stops code
    # that sleeps or blocks under the CPU clock.
    wall = max(timeout, float(job.get("wall", timeout)))
    mode = job["mode"]
    setup = job.get("setup") or ""
    test = job["tests"][i]
    child = st.get("child")
    outfd = None
    keep = False
    since = _schedstat(child.pid) if child is not None else None
    try:
        signal.setitimer(signal.ITIMER_REAL, wall + GRACE)
        if child is None:
            tdir = _fresh_tdir()
            outfd = os.open(outpath, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            child = Child(code_objs, tdir, outfd, timeout, clock, mode, setup, test, len(job["tests"]))
            st["child"] = child
            os.close(outfd)
            outfd = None
            msg = child.recv()
            if "exc" in msg:
                e = _candidate_exception(msg["exc"] if type(msg["exc"]) is dict else {})
                if mode == "program" and e.kind == "AssertionError" and msg["exc"].get("in_test") is True:
                    return _result("fail", "WrongAnswer", e.args[0] if e.args else "", e.lines)
                return _result("error", e.kind, e.args[0] if e.args else "", e.lines)
            if mode == "program":
                if msg.get("done") is True:
                    return _result("pass")
                raise ChildGone("Other", "invalid answer from candidate process")
            st["listing"] = msg.get("ns")
        else:
            child.rpc({"op": "rearm", "t": timeout})
        ns = _namespace(child, st.get("listing"))
        if setup:
            exec(_compile_cached(setup, "<setup>"), ns)
        exec(_compile_cached(test, "<test>"), ns)
        keep = bool(LIM.get("reuse_child"))
        return _result("pass")
    except Deadline:
        if child is not None:
            child.timed_out = True
            if clock == "cpu" and _starved(child.pid, since, wall, timeout):
                raise Starved("starved: the candidate waited for a CPU for most of the %gs wall-clock limit (the machine is overloaded)" % wall)
        if clock == "cpu":
            return _result("error", "Timeout", "wall-clock limit of %gs exceeded (CPU limit %gs)" % (wall, timeout))
        return _result("error", "Timeout", "time limit of %gs exceeded" % timeout)
    except ChildGone as e:
        return _result("error", e.kind, e.message)
    except Harness:
        raise
    except BaseException as e:
        if isinstance(e, CandidateRaised):
            return _result("error", e.kind, e.args[0] if e.args else "", e.lines)
        if type(e) is AssertionError:
            span = child.last_span if child is not None else None
            lines = list(range(span[0], span[1] + 1)) if span and 0 < span[0] <= span[1] and span[1] - span[0] < 10000 else []
            return _result("fail", "WrongAnswer", str(e)[:500], lines)
        return _result("error", type(e).__name__, str(e)[:500])
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        if outfd is not None:
            os.close(outfd)
        if not keep:
            _end_child(st, outpath)


def _tail(path, cap):
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            if size == 0:
                return b""
            f.seek(max(0, size - cap))
            return f.read(cap)
    except OSError:
        return b""


def run_job(job):
    tests = job["tests"]
    _preload_for([job.get("code"), job.get("prelude"), job.get("setup")] + list(tests))
    t0 = time.perf_counter()
    try:
        code_obj = compile(job["code"], CAND, "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as e:
        lineno = getattr(e, "lineno", None)
        kind = type(e).__name__ if isinstance(e, SyntaxError) else "SyntaxError"
        r = _result("error", kind, str(e)[:500], [lineno] if isinstance(lineno, int) else [])
        return {"tests": [dict(r) for _ in tests], "output": "", "seconds": time.perf_counter() - t0}
    except RecursionError as e:
        r = _result("error", "RecursionError", "the code nests too deeply to compile")
        return {"tests": [dict(r) for _ in tests], "output": "", "seconds": time.perf_counter() - t0}
    code_objs = [code_obj]
    if job.get("prelude"):
        # The task's own code: a prelude that does not compile is no signal
        # about the candidate.
        try:
            code_objs.insert(0, compile(job["prelude"], "<prelude>", "exec", dont_inherit=True))
        except (SyntaxError, ValueError, RecursionError) as e:
            return {"no_signal": "the task's prelude does not compile: %s" % e}
    results = []
    outpath = os.path.join(JOBDIR, "out")
    st = {}
    try:
        for i in range(len(tests)):
            ts = time.perf_counter()
            try:
                r = run_test(job, code_objs, i, outpath, st)
            except Harness as e:
                return {"no_signal": "test %d: %s" % (i, e)}
            r["seconds"] = time.perf_counter() - ts
            results.append(r)
    finally:
        _end_child(st, outpath)
    out = st.get("out", b"")
    try:
        os.unlink(outpath)
    except OSError:
        pass
    return {"tests": results, "output": out.decode("utf-8", "replace"), "seconds": time.perf_counter() - t0}


# ------------------------------------------------------- script mode
# A whole program run as `python main.py` would run it: stdin from the job,
# stdout and stderr kept apart, the exit status as the verdict. This is what
# SandboxFusion's `run_code` does (`falcon sandbox serve`); the candidate gets
# the same limits, uid and clean-up as a test's candidate process.

SCRIPT_NAME = "main.py"


def _safe_rel(path):
    """A relative path inside the job directory, or None."""
    if type(path) is not str or not path or path.startswith("/") or "\0" in path:
        return None
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if not parts or any(p == ".." for p in parts):
        return None
    return os.path.join(*parts)


def _script_limits(as_limit, cpu):
    """A script process's rlimits: the worker's, an address-space limit of
    its own when lower, and `cpu` seconds of CPU."""
    for name, res in (("as", resource.RLIMIT_AS), ("fsize", resource.RLIMIT_FSIZE),
                      ("nofile", resource.RLIMIT_NOFILE), ("nproc", resource.RLIMIT_NPROC)):
        lim = min(LIM[name], as_limit) if name == "as" and as_limit else LIM[name]
        if name != "nproc" or SETUID:
            resource.setrlimit(res, (lim, lim))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _script_child(code, inpath, outpath, errpath, tdir, timeout, clock, as_limit):
    global _clock
    try:
        os.setsid()
        fds = [os.open(inpath, os.O_RDONLY),
               os.open(outpath, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600),
               os.open(errpath, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)]
        for i, fd in enumerate(fds):
            os.dup2(fd, i)
        os.closerange(3, 1 << 16)
        _script_limits(as_limit, max(1, int(timeout) + 1))
        # A script imports its own files from its directory, as `python main.py` would.
        _become_candidate(tdir, SCRIPT_NAME, [tdir])
        # The timer's signal ends the process (default action): the parent
        # reads a SIGALRM death as the time limit. Code that catches SIGALRM
        # still meets RLIMIT_CPU or the wall-clock deadline.
        _clock = clock
        _raw_signal(int(signal.SIGALRM), _SIG_DFL)
        _raw_signal(int(signal.SIGPROF), _SIG_DFL)
        _arm(timeout)
    except BaseException:
        os._exit(71)
    os._exit(_run_as_main(lambda: compile(code, SCRIPT_NAME, "exec", dont_inherit=True)))


def _run_as_main(get_code):
    """Runs a program as `python main.py` would, with fresh globals; returns
    its exit status, its output flushed."""
    rc = 0
    try:
        g = {"__name__": "__main__", "__builtins__": builtins, "__file__": SCRIPT_NAME}
        exec(get_code(), g)
    except SystemExit as e:
        c = e.code
        if c is None:
            rc = 0
        elif type(c) is int:
            rc = c & 0xFF
        else:
            try:
                sys.stderr.write(str(c) + "\n")
            except BaseException:
                pass
            rc = 1
    except BaseException:
        try:
            import traceback
            traceback.print_exc()
        except BaseException:
            pass
        rc = 1
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except BaseException:
            pass
    return rc


def run_script(job):
    _preload_for([job.get("script")])
    t0 = time.perf_counter()
    timeout = float(job["timeout"])
    clock = job["clock"] if job.get("clock") in CLOCKS else "wall"
    wall = max(timeout, float(job.get("wall", timeout)))
    cap = int(job.get("out_cap", OUT_CAP))
    try:
        code = job["script"]
        if type(code) is not str:
            raise ValueError("script is not a string")
        tdir = _fresh_tdir()
        for path, data in (job.get("files") or {}).items():
            rel = _safe_rel(path)
            if rel is None:
                return {"script_error": "file path %r must be relative, inside the job directory" % path}
            full = os.path.join(tdir, rel)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "wb") as f:
                f.write(base64.b64decode(data or "", validate=True))
            if SETUID:
                d = os.path.dirname(full)
                while len(d) >= len(tdir):
                    os.chown(d, UID, UID)
                    d = os.path.dirname(d)
                os.chown(full, UID, UID)
        inpath = os.path.join(JOBDIR, "stdin")
        with open(inpath, "wb") as f:
            f.write((job.get("stdin") or "").encode())
    except (ValueError, OSError, TypeError) as e:
        return {"script_error": "bad job: %s" % e}
    outpath = os.path.join(JOBDIR, "out")
    errpath = os.path.join(JOBDIR, "err")
    as_limit = int(job.get("as") or 0)
    pid = os.fork()
    if pid == 0:
        _script_child(code, inpath, outpath, errpath, tdir, timeout, clock, as_limit)
        os._exit(72)
    status, ru, timed_out = None, None, False
    try:
        signal.setitimer(signal.ITIMER_REAL, wall + GRACE)
        _, status, ru = os.wait4(pid, 0)
    except Deadline:
        timed_out = True
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    if status is None:
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
        _, status, ru = os.wait4(pid, 0)
    _reap()
    seconds = time.perf_counter() - t0
    out = {"seconds": seconds, "cpu_seconds": (ru.ru_utime + ru.ru_stime) if ru else 0.0,
           "stdout": _tail(outpath, cap).decode("utf-8", "replace"),
           "stderr": _tail(errpath, cap).decode("utf-8", "replace"), "files": {}}
    sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
    if timed_out or sig in (signal.SIGALRM, signal.SIGPROF, signal.SIGXCPU):
        out["status"] = "timeout"
        out["return_code"] = None
    elif sig is not None:
        out["status"] = "finished"
        out["return_code"] = -sig
    elif os.WEXITSTATUS(status) == 71:
        return {"script_error": "the candidate process could not be set up"}
    else:
        out["status"] = "finished"
        out["return_code"] = os.WEXITSTATUS(status)
    for path in job.get("fetch_files") or []:
        rel = _safe_rel(path)
        if rel is None:
            continue
        full = os.path.join(tdir, rel)
        try:
            if os.path.isfile(full) and not os.path.islink(full) and os.path.getsize(full) <= cap:
                with open(full, "rb") as f:
                    out["files"][path] = base64.b64encode(f.read()).decode()
        except OSError:
            pass
    for p in (outpath, errpath, inpath):
        try:
            os.unlink(p)
        except OSError:
            pass
    return {"script": out}


def _tail_own(path, cap):
    """`_tail` of a file in the candidate's directory, never through a link."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return b""
    try:
        if not stat_is_reg(os.fstat(fd).st_mode):
            return b""
        size = os.fstat(fd).st_size
        os.lseek(fd, max(0, size - cap), 0)
        out = b""
        while len(out) < cap:
            chunk = os.read(fd, cap - len(out))
            if not chunk:
                break
            out += chunk
        return out
    finally:
        os.close(fd)


def stat_is_reg(mode):
    import stat
    return stat.S_ISREG(mode)


def _fresh_file(name, mode):
    """A new file `name` in the current directory, whatever was there."""
    try:
        os.unlink(name)
    except FileNotFoundError:
        pass
    except IsADirectoryError:
        _rmtree(name)
    return os.open(name, mode | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)


def _programs_child(code, stdins, tdir, start, n, timeout, clock, as_limit, wfd, ack):
    """Runs the program on tests start..n-1 in turn, each with its own stdin,
    stdout and stderr files and its own timer, reporting `j rc` on fd 3 and
    waiting for the worker's ack on fd 4 (it has read test j's output by
    then, so no later test can touch it)."""
    global _clock
    try:
        os.setsid()
        os.dup2(wfd, 3)
        os.dup2(ack, 4)
        os.closerange(5, 1 << 16)
        inputs = [x.encode() for x in stdins[start:n]]
        _script_limits(as_limit, max(1, (int(timeout) + 1) * (n - start)))
        _become_candidate(tdir, SCRIPT_NAME, [tdir])
        _clock = clock
        _raw_signal(int(signal.SIGALRM), _SIG_DFL)
        _raw_signal(int(signal.SIGPROF), _SIG_DFL)
    except BaseException:
        os._exit(71)
    cache = []

    def compiled_code():
        if not cache:
            cache.append(compile(code, SCRIPT_NAME, "exec", dont_inherit=True))
        return cache[0]

    for j in range(start, n):
        try:
            fin = _fresh_file(".stdin", os.O_RDWR)
            data = inputs[j - start]
            while data:
                data = data[os.write(fin, data):]
            os.lseek(fin, 0, 0)
            os.unlink(".stdin")
            fds = [fin, _fresh_file("out%d" % j, os.O_WRONLY), _fresh_file("err%d" % j, os.O_WRONLY)]
            for i, fd in enumerate(fds):
                os.dup2(fd, i)
                os.close(fd)
            sys.stdin = open(0, "r", closefd=False)
            sys.stdout = open(1, "w", closefd=False)
            sys.stderr = open(2, "w", closefd=False)
        except BaseException:
            os._exit(71)
        _arm(timeout)
        rc = _run_as_main(compiled_code)
        _arm(0)
        try:
            os.write(3, b"%d %d\n" % (j, rc))
            if os.read(4, 1) != b"k":
                os._exit(0)
        except BaseException:
            # The program closed or broke its report pipe: this test ends
            # here, as if it had exited with its status.
            os._exit(rc)
    os._exit(0)


def run_programs(job):
    """One program on many stdins: one candidate process runs the tests in
    turn (as LiveCodeBench's and verl's runners do), a new one after a test
    that ended it (time limit, crash, exit). Only outputs come back; the
    expected ones are not here."""
    import select
    _preload_for([job.get("programs")])
    code = job["programs"]
    stdins = job["stdins"]
    if type(code) is not str or type(stdins) is not list or not all(type(x) is str for x in stdins):
        return {"script_error": "bad job: programs must be a string and stdins a list of strings"}
    n = len(stdins)
    timeout = float(job["timeout"])
    clock = job["clock"] if job.get("clock") in CLOCKS else "wall"
    wall = max(timeout, float(job.get("wall", timeout)))
    cap = int(job.get("out_cap", OUT_CAP))
    as_limit = int(job.get("as") or 0)
    tdir = _fresh_tdir()
    runs = [None] * n
    start = 0
    while start < n:
        r, w = os.pipe()
        ack_r, ack_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            os.close(ack_w)
            # The inputs come with the fork, read before the candidate runs.
            _programs_child(code, stdins, tdir, start, n, timeout, clock, as_limit, w, ack_r)
            os._exit(72)
        os.close(w)
        os.close(ack_r)
        done, buf, timed_out = start, b"", False
        t_test = time.perf_counter()
        while True:
            left = wall + GRACE - (time.perf_counter() - t_test)
            if left <= 0:
                timed_out = True
                break
            ready, _, _ = select.select([r], [], [], left)
            if not ready:
                continue
            chunk = os.read(r, 65536)
            if not chunk:
                break
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                parts = line.split()
                if len(parts) == 2 and parts[0] == str(done).encode():
                    now = time.perf_counter()
                    runs[done] = {"status": "finished", "return_code": int(parts[1]), "seconds": now - t_test}
                    _collect(runs[done], tdir, done, cap)
                    done += 1
                    try:
                        os.write(ack_w, b"k")
                    except OSError:
                        pass
                    t_test = time.perf_counter()
        os.close(r)
        os.close(ack_w)
        # Its report pipe closed: the process is ending, or it closed the
        # pipe and runs on; the test's deadline still holds.
        status = None
        left = wall + GRACE - (time.perf_counter() - t_test)
        if not timed_out and left > 0:
            try:
                signal.setitimer(signal.ITIMER_REAL, left)
                _, status = os.waitpid(pid, 0)
            except Deadline:
                pass
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        if status is None:
            timed_out = True
            for kill in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
                try:
                    kill()
                except OSError:
                    pass
        if status is None:
            _, status = os.waitpid(pid, 0)
        _reap()
        if done < n and runs[done] is None:
            sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
            seconds = time.perf_counter() - t_test
            if timed_out or sig in (signal.SIGALRM, signal.SIGPROF, signal.SIGXCPU):
                runs[done] = {"status": "timeout", "return_code": None, "seconds": seconds}
            elif sig is not None:
                runs[done] = {"status": "finished", "return_code": -sig, "seconds": seconds}
            elif os.WEXITSTATUS(status) == 71 and done == start:
                # No candidate code ran in this process yet: our failure.
                return {"script_error": "the candidate process could not be set up"}
            else:
                runs[done] = {"status": "finished", "return_code": os.WEXITSTATUS(status), "seconds": seconds}
            _collect(runs[done], tdir, done, cap)
            done += 1
        start = done
    return {"programs": runs}


def _collect(run, tdir, j, cap):
    for key, name in (("stdout", "out%d" % j), ("stderr", "err%d" % j)):
        path = os.path.join(tdir, name)
        run[key] = _tail_own(path, cap).decode("utf-8", "replace")
        # Read: gone, so that the directory is left empty for the next job.
        try:
            os.unlink(path)
        except OSError:
            pass
    run["cpu_seconds"] = 0.0
    run["files"] = {}


def main():
    try:
        # Worker and its children share one CPU: the many short hand-offs
        # of a test's calls then stay on a warm core.
        cpus = sorted(os.sched_getaffinity(0))
        if LIM.get("pin") is not None and len(cpus) > 1:
            os.sched_setaffinity(0, {cpus[LIM["pin"] % len(cpus)]})
    except (AttributeError, OSError):
        pass
    signal.signal(signal.SIGALRM, _on_timer)
    signal.signal(signal.SIGPROF, _on_timer)
    gc.collect()
    gc.freeze()
    info = {"ready": True, "python": sys.version.split()[0], "numpy": "numpy" in sys.modules,
            "numba": "numba" in sys.modules}
    send(PROTO_OUT, info)
    os.dup2(NULL, 2)
    while True:
        try:
            job = recv(PROTO_IN, 1 << 30)
        except BaseException:
            return
        if job is None:
            return
        try:
            if "programs" in job:
                reply = run_programs(job)
            elif "script" in job:
                reply = run_script(job)
            else:
                reply = run_job(job)
        except BaseException as e:
            reply = {"no_signal": "worker internal error: %s: %s" % (type(e).__name__, str(e)[:300])}
        send(PROTO_OUT, reply)


main()
