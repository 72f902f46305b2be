"""Bounded execution of generated Python programs: an evaluation grader and an RL reward.

:func:`run_program` runs one source file, :func:`check_program` runs a HumanEval/MBPP item
(the program in a candidate process, the tests, optionally followed by ``check(entry_point)``,
in a checker process that gets the candidate's results by value) and :func:`run_many` runs many
of either on a thread pool, each in its own sandbox, results in input order.

Every run gets

* a fresh temporary working directory (``HOME`` and ``TMPDIR`` point at it) that is removed
  afterwards, also after a timeout;
* the current interpreter started with ``-s -B`` (and ``-P`` on 3.11+): no user site directory,
  no bytecode files, the script directory is not put on ``sys.path``. ``-I``/``-E`` are not used
  because the environment is built from scratch anyway and ``-E`` would drop the
  ``PYTHONHASHSEED=0`` we set for reproducible ``set``/``dict`` ordering; the standard library and
  the interpreter's site-packages stay importable;
* a scrubbed environment: only ``PATH=/usr/local/bin:/usr/bin:/bin``, ``HOME``, ``TMPDIR``,
  ``LANG``/``LC_ALL=C.UTF-8``, ``PYTHONDONTWRITEBYTECODE=1``, ``PYTHONHASHSEED=0``,
  ``PYTHONIOENCODING=utf-8``; nothing of the parent's environment (tokens, keys) is visible;
* its own session and process group; on timeout, and after every normal exit, the whole group
  gets ``SIGKILL`` (the group leader is killed while it is still an unreaped zombie, so the
  process-group id cannot have been reused);
* resource limits (:class:`Limits`) set in the child between ``fork`` and ``exec``: CPU seconds
  (``SIGXCPU``, then ``SIGKILL`` one second later), address space, processes, file size, open
  files, and no core files;
* stdout and stderr read concurrently and kept up to :attr:`Limits.output_bytes` each (the rest is
  read and discarded, so a chatty child never blocks on a full pipe); ``stdin`` comes from a file;
* no network where the OS allows it: the child calls ``unshare(CLONE_NEWNET)`` before ``exec``
  and so runs in an empty network namespace whose only interface, loopback, is down — no
  connection to the internet, to the host's loopback services or to DNS is possible. This needs
  ``CAP_SYS_ADMIN`` (root, or a container that grants it); no user namespace is created, so an
  unprivileged caller gets no isolation. Whether it works is probed once per process
  (:func:`network_isolation_available`) and reported as :attr:`ExecutionResult.network_isolated`.
  When it does not work the program runs with the host's network, and the run does not fail
  unless the caller passes ``require_network_isolation=True``.

* PID and file-system containment where the OS allows it (``CAP_SYS_ADMIN`` again; probed once,
  :func:`containment_available`, reported as :attr:`ExecutionResult.contained`): the child also
  calls ``unshare(CLONE_NEWNS | CLONE_NEWPID)`` before ``exec``, makes all mounts private,
  bind-mounts its working directory onto itself and remounts every other mount read-only, so a
  write outside the working directory fails with ``EROFS``. The harness's first child is PID 1 of
  the new PID namespace: a minimal init that forks the program, reaps orphans and exits when the
  program ends, whereupon the kernel kills everything left in the namespace, including
  descendants that called ``setsid()``; at a timeout the ``killpg`` reaches that init (the
  program cannot move it out of the group), with the same effect. ``os.kill(os.getppid(), ...)``
  only reaches the init, which ignores signals from inside its namespace. ``/proc`` is the
  host's (not remounted): it lists host processes, but pids inside the namespace do not name them.

What is **not** contained: the program runs as the calling user, so it can read any file that
user can read. ``RLIMIT_NPROC`` counts all processes of the real user id and is not enforced for
root, so a fork bomb run as root is stopped only by the timeout; memory is bounded per process
(address space), not for the group as a whole. Without containment (an unprivileged caller, a
container without the capability) the program also sees the caller's writable filesystem (it may
write up to :attr:`Limits.file_size` bytes per file anywhere the user can write), its parent is
the calling process (which it may signal), and a descendant that calls ``setsid()``/``setpgid()``
leaves the process group and survives the final ``killpg``. For untrusted code at scale run the
trainer itself in a container or VM; this module is the inner, per-program layer.

Outcome (:attr:`ExecutionResult.status`): the program is executed by a small harness that maps an
uncaught ``AssertionError`` to ``wrong`` and ``MemoryError`` to ``memory``; any other uncaught
exception, a syntax error or a non-zero exit is ``error``; a signal is ``killed``; the wall clock
running out is ``timeout``; exit status 0 is ``passed``. :func:`check_program` is stricter: the
harness forks the candidate process first, then reads a random token (given to it through a
pipe, never through the environment or a file) that the checker process writes to a marker file
only after the tests ran to the end, and ``passed`` needs that token, so
``sys.exit(0)``/``os._exit(0)``/``quit()`` before the tests finish is ``error`` rather than a
reward. The candidate's process never holds the token nor runs a test; only a process with
ptrace rights over the checker (root with ``CAP_SYS_PTRACE``) could reach into it.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import ctypes.util
import math
import os
import re
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Callable, Iterable, List, Literal, Optional, Sequence, Union

import attrs

from dare_core.api import DareError

try:  # POSIX only
    import resource
except ImportError:  # pragma: no cover - Windows
    resource = None  # type: ignore[assignment]

__all__ = [
    "EXIT_MEMORY",
    "EXIT_WRONG",
    "STATUSES",
    "ExecutionResult",
    "Job",
    "Limits",
    "Status",
    "check_program",
    "containment_available",
    "network_isolation_available",
    "run_many",
    "run_program",
]

Status = Literal["passed", "wrong", "error", "timeout", "memory", "killed"]
STATUSES = ("passed", "wrong", "error", "timeout", "memory", "killed")

#: exit status of the harness for an uncaught ``AssertionError`` (a failed test)
EXIT_WRONG = 117
#: exit status of the harness for an uncaught ``MemoryError``
EXIT_MEMORY = 118

CLONE_NEWNET = 0x40000000
CLONE_NEWNS = 0x00020000
CLONE_NEWPID = 0x20000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_REMOUNT, _MS_NOATIME, _MS_NODIRATIME, _MS_BIND, _MS_REC = 32, 1024, 2048, 4096, 16384
_MS_PRIVATE, _MS_RELATIME = 1 << 18, 1 << 21
_MOUNT_OPTIONS = {
    "nosuid": _MS_NOSUID,
    "nodev": _MS_NODEV,
    "noexec": _MS_NOEXEC,
    "noatime": _MS_NOATIME,
    "nodiratime": _MS_NODIRATIME,
    "relatime": _MS_RELATIME,
}
_KIB, _MIB, _GIB = 1024, 1024**2, 1024**3
_PROGRAM = "main.py"
_HARNESS = "_dare_harness.py"
_MARKER = ".dare_done"
_STDIN = ".dare_stdin"
_READ_CHUNK = 65536
_TESTS = "_dare_tests.py"
_CONTEXT = "_dare_context.py"
#: largest message (a call's arguments or a result) between the checker and the candidate
_MAX_MESSAGE = 256 * 1024**2


def _positive_or_none(instance, attribute, value) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
        raise DareError(f"Limits.{attribute.name} must be a positive number or None, got {value!r}")


def _positive_int(instance, attribute, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise DareError(f"Limits.{attribute.name} must be a positive integer, got {value!r}")


@attrs.frozen
class Limits:
    """Per-run resource limits; ``None`` leaves a limit as inherited from the caller.

    Attributes:
        cpu_seconds: CPU time (user + system) of the program process, rounded up to whole seconds
            (``RLIMIT_CPU``); exceeding it delivers ``SIGXCPU``, one second more ``SIGKILL``
            (status ``killed``). Each process of the group has its own budget.
        address_space: virtual memory per process in bytes (``RLIMIT_AS``); allocations beyond it
            fail, which Python reports as ``MemoryError`` (status ``memory``).
        processes: processes of the real user id (``RLIMIT_NPROC``; a fork-bomb brake — it counts
            the user's other processes too and root is exempt).
        file_size: largest file the program may write, in bytes (``RLIMIT_FSIZE``); writing more
            fails with ``OSError: File too large``.
        open_files: file descriptors per process (``RLIMIT_NOFILE``).
        output_bytes: bytes of stdout and of stderr each that are kept; more is read and dropped
            and the result's ``stdout_truncated``/``stderr_truncated`` is set.
    """

    cpu_seconds: Optional[float] = attrs.field(default=10.0, validator=_positive_or_none)
    address_space: Optional[int] = attrs.field(default=4 * _GIB, validator=_positive_or_none)
    processes: Optional[int] = attrs.field(default=256, validator=_positive_or_none)
    file_size: Optional[int] = attrs.field(default=16 * _MIB, validator=_positive_or_none)
    open_files: Optional[int] = attrs.field(default=64, validator=_positive_or_none)
    output_bytes: int = attrs.field(default=64 * _KIB, validator=_positive_int)


@attrs.frozen
class ExecutionResult:
    """Outcome of one sandboxed run.

    Attributes:
        status: ``passed`` (exit 0; for :func:`check_program` also: the tests ran to the end),
            ``wrong`` (uncaught ``AssertionError``), ``error`` (other exception, syntax error,
            non-zero exit, early exit during tests), ``timeout`` (wall clock), ``memory``
            (``MemoryError`` / address-space limit), ``killed`` (ended by a signal, e.g. the CPU
            limit's ``SIGXCPU``).
        returncode: exit status of the program process; negative for a signal
            (``-signal.SIGKILL`` after a timeout).
        stdout, stderr: captured output (UTF-8, invalid bytes replaced), at most
            ``Limits.output_bytes`` bytes each.
        stdout_truncated, stderr_truncated: whether more output was produced than kept.
        seconds: wall-clock seconds from start to the end of the process group.
        network_isolated: whether the program ran in an empty network namespace.
        contained: whether the program ran under its own PID 1 in new PID and mount namespaces
            with the file system read-only except its working directory
            (:func:`containment_available`).
        detail: a short human-readable reason for the status.
    """

    status: Status
    returncode: Optional[int]
    stdout: str
    stderr: str
    stdout_truncated: bool
    stderr_truncated: bool
    seconds: float
    network_isolated: bool
    contained: bool = False
    detail: str = ""

    @property
    def passed(self) -> bool:
        return self.status == "passed"


@attrs.frozen
class Job:
    """One unit of work for :func:`run_many`: :func:`check_program` when ``tests`` is given,
    else :func:`run_program` of ``program``."""

    program: str
    tests: Optional[str] = None
    entry_point: Optional[str] = None
    context: Optional[str] = None
    timeout: float = 10.0
    limits: Limits = Limits()
    stdin: str = ""


# --------------------------------------------------------------------------- the child-side harness
# Run as ``python <harness> <token-fd> <marker> <program> <strict> <contained>``. It reads its token from the
# pipe, compiles and executes the program as ``__main__`` and maps the outcome to exit statuses.
_HARNESS_SOURCE = f"""\
import builtins, importlib, json, os, signal, sys, traceback

def _dare_contain():
    # This process is outside the new PID namespace; its first child is that namespace's PID 1, a
    # minimal init that forks the program, reaps orphans and, once the program has ended, passes
    # its wait status up a pipe and exits, whereupon the kernel kills every process left in the
    # namespace (setsid() or not). This process then exits the way the program did.
    read_end, write_end = os.pipe()
    init = os.fork()
    if init == 0:
        os.close(read_end)
        program = os.fork()
        if program == 0:
            os.close(write_end)
            return
        while True:
            try:
                pid, status = os.wait()
            except ChildProcessError:
                os._exit(1)
            if pid == program:
                os.write(write_end, str(status).encode())
                os._exit(0)
    os.close(write_end)
    os.waitpid(init, 0)
    data = os.read(read_end, 64)
    if not data:
        os._exit(1)
    status = int(data)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError):
            pass
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)
    os._exit(os.WEXITSTATUS(status))

def _dare_send(fd, obj):
    data = json.dumps(obj, allow_nan=False).encode()
    data = len(data).to_bytes(8, "little") + data
    while data:
        data = data[os.write(fd, data):]

def _dare_recv(fd):
    need, header = 8, True
    while True:
        buf = bytearray()
        while len(buf) < need:
            chunk = os.read(fd, min(need - len(buf), 1 << 20))
            if not chunk:
                return None
            buf += chunk
        if not header:
            return json.loads(bytes(buf))
        need, header = int.from_bytes(buf, "little"), False
        if need > {_MAX_MESSAGE}:
            raise MemoryError("a candidate result larger than {_MAX_MESSAGE} bytes")

def _dare_encode(value):
    # candidate side: a plain value as tagged JSON; anything else is refused
    kind = type(value)
    if value is None:
        return None
    if kind is bool:
        return ["b", value]
    if kind is int:
        return ["i", value]
    if kind is float:
        return ["f", value.hex()]
    if kind is str:
        return ["s", value]
    if kind is complex:
        return ["c", value.real.hex(), value.imag.hex()]
    if kind is bytes:
        return ["y", value.hex()]
    if kind in (list, tuple, set, frozenset):
        return [{{list: "l", tuple: "t", set: "S", frozenset: "F"}}[kind], [_dare_encode(v) for v in value]]
    if kind is dict:
        return ["d", [[_dare_encode(k), _dare_encode(v)] for k, v in value.items()]]
    raise TypeError(f"a {{kind.__name__}} is not a plain value")

_DARE_SCALARS = {{"b": bool, "i": int, "s": str}}
_DARE_SEQUENCES = {{"l": list, "t": tuple, "S": set, "F": frozenset}}

def _dare_decode(item):
    # checker side: only the tags above, each rebuilt with this process's own constructors
    if item is None:
        return None
    if type(item) is not list or not item or type(item[0]) is not str:
        raise TypeError("malformed candidate value")
    tag, rest = item[0], item[1:]
    if tag in _DARE_SCALARS and len(rest) == 1 and type(rest[0]) is _DARE_SCALARS[tag]:
        return rest[0]
    if tag == "f" and len(rest) == 1 and type(rest[0]) is str:
        return float.fromhex(rest[0])
    if tag == "c" and len(rest) == 2 and all(type(r) is str for r in rest):
        return complex(float.fromhex(rest[0]), float.fromhex(rest[1]))
    if tag == "y" and len(rest) == 1 and type(rest[0]) is str:
        return bytes.fromhex(rest[0])
    if tag in _DARE_SEQUENCES and len(rest) == 1 and type(rest[0]) is list:
        return _DARE_SEQUENCES[tag](_dare_decode(v) for v in rest[0])
    if tag == "d" and len(rest) == 1 and type(rest[0]) is list:
        out = {{}}
        for pair in rest[0]:
            if type(pair) is not list or len(pair) != 2:
                raise TypeError("malformed candidate dict")
            out[_dare_decode(pair[0])] = _dare_decode(pair[1])
        return out
    raise TypeError(f"malformed candidate value with tag {{tag!r}}")

def _dare_report(exc):
    try:
        traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next)
    except BaseException:
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass

def _dare_load(program, on_exit):
    # exec the program as __main__; returns its namespace, or exits the way a failure maps
    with open(program, encoding="utf-8") as handle:
        source = handle.read()
    sys.argv = [program]
    namespace = {{"__name__": "__main__", "__file__": program, "__builtins__": __builtins__}}
    try:
        exec(compile(source, program, "exec"), namespace)
    except MemoryError:
        namespace = source = None
        os.write(2, b"MemoryError\\n")
        os._exit({EXIT_MEMORY})
    except AssertionError as exc:
        _dare_report(exc)
        os._exit({EXIT_WRONG})
    except SystemExit as exc:
        on_exit(exc)
    except BaseException as exc:
        _dare_report(exc)
        os._exit(1)
    return namespace

def _dare_serve(program, requests, replies):
    # the candidate's process: load the program, then answer calls by value until the pipe closes
    def leave(exc):
        os.write(2, b"SystemExit(" + repr(exc.code).encode() + b") before the tests finished\\n")
        _dare_report(exc)
        os._exit(1)

    namespace = _dare_load(program, leave)
    module = type(os)
    names = [n for n, v in namespace.items()
             if not n.startswith("__") and callable(v) and type(v) is not module]
    modules = {{n: v.__name__ for n, v in namespace.items() if type(v) is module and type(v.__name__) is str}}
    _dare_send(replies, ["ready", names, modules])
    while True:
        call = _dare_recv(requests)
        if call is None:
            os._exit(0)
        try:
            args, kwargs = _dare_decode(call[1]), _dare_decode(call[2])
            reply = ["ok", _dare_encode(namespace[call[0]](*args, **kwargs))]
        except BaseException as exc:
            reply = ["raise", type(exc).__name__, str(exc)[:2000]]
        try:
            _dare_send(replies, reply)
        except (TypeError, ValueError) as exc:  # e.g. an int too long for JSON
            _dare_send(replies, ["raise", "TypeError", str(exc)[:2000]])

class _DareCandidateError(Exception):
    pass

def _dare_ended(child):
    # the candidate's process has ended: leave the way it did (a signal, a failing status)
    _, status = os.waitpid(child, 0)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError):  # SIGKILL, SIGSTOP
            pass
        os.kill(os.getpid(), sig)
    if os.WIFEXITED(status) and os.WEXITSTATUS(status) != 0:
        os._exit(os.WEXITSTATUS(status))

def _dare_checker(child, requests, replies, names, modules, tests, context, entry):
    # the checker's process: the candidate's code never ran here
    def proxy(name):
        def call(*args, **kwargs):
            _dare_send(requests, [name, _dare_encode(list(args)), _dare_encode(dict(kwargs))])
            reply = _dare_recv(replies)
            if reply is None:
                _dare_ended(child)
                raise _DareCandidateError(f"the candidate's process ended during a call of {{name}}")
            if reply[0] == "ok":
                return _dare_decode(reply[1])
            kind = getattr(builtins, str(reply[1]), None)
            if isinstance(kind, type) and issubclass(kind, Exception) and kind is not _DareCandidateError:
                raise kind(str(reply[2]))
            raise _DareCandidateError(f"{{reply[1]}}: {{reply[2]}}")
        call.__name__ = name
        return call

    namespace = {{"__name__": "__main__", "__builtins__": builtins}}
    stdlib = getattr(sys, "stdlib_module_names", ())
    for name, module_name in modules.items():  # `import math`, `import os.path` (as `os`)
        if name in stdlib and str(module_name).split(".")[0] == name and name not in builtins.__dict__:
            namespace[name] = importlib.import_module(name)
    if entry:
        if context:
            exec(compile(context, "<prompt>", "exec"), namespace)
        namespace[entry] = proxy(entry)  # test strings may call check(<entry point>) themselves
        exec(compile(tests, "<tests>", "exec"), namespace)
        namespace["check"](namespace[entry])
    else:
        for name in names:
            if name not in builtins.__dict__ and name not in namespace:
                namespace[name] = proxy(name)
        exec(compile(tests, "<tests>", "exec"), namespace)

def _dare_check(token_fd, marker, program, tests_path, context_path, entry):
    # fork before the token is read: the candidate's process never holds it
    req_r, req_w = os.pipe()
    rep_r, rep_w = os.pipe()
    child = os.fork()
    if child == 0:
        for fd in (token_fd, req_w, rep_r):
            os.close(fd)
        _dare_serve(program, req_r, rep_w)
        os._exit(0)
    os.close(req_r)
    os.close(rep_w)
    token = os.read(token_fd, 256)
    os.close(token_fd)

    def finish(code):
        try:
            os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)
        except OSError:
            pass
        os._exit(code)

    with open(tests_path, encoding="utf-8") as handle:
        tests = handle.read()
    context = None
    if context_path:
        with open(context_path, encoding="utf-8") as handle:
            context = handle.read()
    ready = _dare_recv(rep_r)
    if ready is None:  # the program exited (or was killed) before the tests ran
        _dare_ended(child)
        os.write(2, b"the program ended before the tests ran\\n")
        os._exit(1)
    try:
        _dare_checker(child, req_w, rep_r, ready[1], ready[2], tests, context, entry)
    except MemoryError:
        os.write(2, b"MemoryError\\n")
        finish({EXIT_MEMORY})
    except AssertionError as exc:
        _dare_report(exc)
        finish({EXIT_WRONG})
    except BaseException as exc:
        _dare_report(exc)
        finish(1)
    fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.write(fd, token)
    os.close(fd)
    finish(0)

def _dare_main():
    token_fd, marker, program, mode = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    if sys.argv[5] == "1":
        _dare_contain()
    if mode == "check":
        _dare_check(token_fd, marker, program, sys.argv[6], sys.argv[7], sys.argv[8])
    os.close(token_fd)

    def leave(exc):
        if exc.code not in (None, 0):
            raise exc

    _dare_load(program, leave)

_dare_main()
"""


# ------------------------------------------------------------------------------- network isolation
_unshare_fn = None
_probe_lock = threading.Lock()
_probe_result: Optional[bool] = None


def _load_unshare():
    """A callable ``unshare(flags) -> None`` raising ``OSError``, or ``None`` where there is none."""
    if hasattr(os, "unshare"):  # Python 3.12+
        return os.unshare
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        raw = libc.unshare
    except (OSError, AttributeError):
        return None
    raw.argtypes = [ctypes.c_int]
    raw.restype = ctypes.c_int

    def unshare(flags: int) -> None:
        if raw(flags) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, os.strerror(errno))

    return unshare


def _probe_run(code: list[str], preexec: Callable[[], None], cwd: Optional[str] = None) -> bool:
    """Whether ``python -S -c CODE...`` exits 0 when started with ``preexec`` (an isolation probe)."""
    try:
        return (
            subprocess.run(
                [sys.executable, "-S", "-c", *code],
                preexec_fn=preexec,
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=30,
                env={},
            ).returncode
            == 0
        )
    except (subprocess.SubprocessError, OSError):
        return False


def network_isolation_available() -> bool:
    """Whether a child can be put into a new network namespace; probed once per process."""
    global _probe_result, _unshare_fn
    if _probe_result is not None:
        return _probe_result
    with _probe_lock:
        if _probe_result is None:
            _unshare_fn = _load_unshare()
            ok = False
            if _unshare_fn is not None:
                unshare = _unshare_fn

                def preexec() -> None:
                    unshare(CLONE_NEWNET)

                ok = _probe_run(["pass"], preexec)
            _probe_result = ok
    return _probe_result


# ---------------------------------------------------------------- process and filesystem containment
_mount_fn = None
_contain_result: Optional[bool] = None
_CONTAIN_PROBE = """\
import os, sys
pid = os.fork()
if pid == 0:
    ok = os.getpid() == 1 and open("inside", "w").write("x") == 1
    try:
        open(sys.argv[1], "w")
    except OSError:
        os._exit(0 if ok else 1)
    os._exit(1)
_, status = os.waitpid(pid, 0)
sys.exit(0 if status == 0 else 1)
"""


def _load_mount():
    """A callable ``mount(source, target, flags) -> None`` raising ``OSError``, or ``None``."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        raw = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True).mount
    except (OSError, AttributeError):
        return None
    raw.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
    raw.restype = ctypes.c_int

    def mount(source, target, flags) -> None:
        if raw(source, target, None, flags, None) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, os.strerror(errno))

    return mount


def _mount_points() -> list:
    """``(path, flags)`` for every mount in this mount namespace, from ``/proc/self/mountinfo``."""
    points = []
    with open("/proc/self/mountinfo", "rb") as handle:
        for line in handle:
            fields = line.split()
            if len(fields) < 6:
                continue
            # the mount point has octal escapes (\\040 for a space)
            path = re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m.group(1), 8)]), fields[4])
            flags = _MS_REMOUNT | _MS_BIND | _MS_RDONLY
            for option in fields[5].decode("ascii", "replace").split(","):
                flags |= _MOUNT_OPTIONS.get(option, 0)
            points.append((path, flags))
    return points


def _make_contain(workdir: str):
    """The pre-exec step that puts the child into new PID and mount namespaces whose file system
    is read-only except ``workdir``; only pre-bound functions and pre-encoded data inside."""
    unshare, mount, chdir = _unshare_fn, _mount_fn, os.chdir
    target = os.fsencode(workdir)
    points = _mount_points()

    def contain() -> None:
        unshare(CLONE_NEWNS | CLONE_NEWPID)
        mount(None, b"/", _MS_REC | _MS_PRIVATE)  # nothing done here reaches the host
        mount(target, target, _MS_BIND)  # the working directory keeps its own writable mount
        for path, flags in points:
            try:
                mount(None, path, flags)
            except OSError:  # hidden under another mount, or gone; the probe checks the result
                pass
        chdir(target)  # the inherited cwd is the directory under the new mount

    return contain


def containment_available() -> bool:
    """Whether a child can run in new PID and mount namespaces with a read-only file system
    except its working directory; probed once per process by running such a child."""
    global _contain_result, _unshare_fn, _mount_fn
    if _contain_result is not None:
        return _contain_result
    with _probe_lock:
        if _contain_result is None:
            _unshare_fn = _unshare_fn or _load_unshare()
            _mount_fn = _load_mount()
            ok = False
            if _unshare_fn is not None and _mount_fn is not None and resource is not None:
                workdir = tempfile.mkdtemp(prefix="dare-sandbox-")
                outside = workdir + "-outside"
                try:
                    ok = _probe_run([_CONTAIN_PROBE, outside], _make_contain(workdir), cwd=workdir)
                    ok = ok and os.path.exists(os.path.join(workdir, "inside"))
                finally:
                    if os.path.exists(outside):
                        ok = False
                        os.unlink(outside)
                    _remove_tree(workdir)
            _contain_result = ok
    return _contain_result


# ------------------------------------------------------------------------------------ the runner
def _rlimits(limits: Limits) -> list:
    """``(resource, (soft, hard))`` pairs, clamped to the caller's hard limits (never raised)."""
    wanted = [(resource.RLIMIT_CORE, 0, 0)]
    if limits.cpu_seconds is not None:
        seconds = max(1, math.ceil(limits.cpu_seconds))
        wanted.append((resource.RLIMIT_CPU, seconds, seconds + 1))
    for name, value in (
        ("RLIMIT_AS", limits.address_space),
        ("RLIMIT_NPROC", limits.processes),
        ("RLIMIT_FSIZE", limits.file_size),
        ("RLIMIT_NOFILE", limits.open_files),
    ):
        if value is not None and hasattr(resource, name):
            value = int(value)
            wanted.append((getattr(resource, name), value, value))
    pairs = []
    for res, soft, hard in wanted:
        _, current_hard = resource.getrlimit(res)
        if current_hard != resource.RLIM_INFINITY:
            hard = min(hard, current_hard)
            soft = min(soft, hard)
        pairs.append((res, (soft, hard)))
    return pairs


def _make_preexec(pairs: list, isolate: bool, contain):
    # Runs between fork and exec, possibly while other threads of the parent hold locks: it only
    # calls pre-bound functions and imports nothing.
    setrlimit = resource.setrlimit
    unshare = _unshare_fn if isolate else None

    def preexec() -> None:
        if unshare is not None:  # before RLIMIT_NOFILE/NPROC could get in the way
            unshare(CLONE_NEWNET)
        if contain is not None:
            contain()
        for res, value in pairs:
            setrlimit(res, value)

    return preexec


class _Capture:
    """Reads a pipe to its end on a daemon thread, keeping the first ``cap`` bytes."""

    def __init__(self, pipe, cap: int) -> None:
        self._pipe, self._cap = pipe, cap
        self._chunks: List[bytes] = []
        self._kept = 0
        self.truncated = False
        self._lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        fd = self._pipe.fileno()
        try:
            while True:
                chunk = os.read(fd, _READ_CHUNK)
                if not chunk:
                    break
                with self._lock:
                    room = self._cap - self._kept
                    if len(chunk) > room:
                        self.truncated = True
                        chunk = chunk[:room]
                    if chunk:
                        self._chunks.append(chunk)
                        self._kept += len(chunk)
        except OSError:
            pass

    def text(self) -> str:
        with self._lock:
            return b"".join(self._chunks).decode("utf-8", errors="replace")


def _wait_exit(proc: subprocess.Popen, deadline: float) -> bool:
    """Wait until ``proc`` has exited *without reaping it*; False if ``deadline`` passed first."""
    pidfd = None
    if hasattr(os, "pidfd_open"):
        try:
            pidfd = os.pidfd_open(proc.pid)
        except OSError:
            pidfd = None
    try:
        if pidfd is not None:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                try:
                    ready, _, _ = select.select([pidfd], [], [], remaining)
                except InterruptedError:  # pragma: no cover - PEP 475 retries already
                    continue
                if ready:
                    return True
        delay = 0.001
        while True:  # fallback: poll without reaping
            info = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            if info is not None:
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            time.sleep(min(delay, remaining))
            delay = min(delay * 2, 0.02)
    finally:
        if pidfd is not None:
            os.close(pidfd)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _remove_tree(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)
    if os.path.exists(path):  # the program may have removed permissions on what it created
        for root, dirs, _ in os.walk(path):
            for name in dirs:
                try:
                    os.chmod(os.path.join(root, name), 0o700)
                except OSError:
                    pass
        shutil.rmtree(path, ignore_errors=True)


def _classify(returncode: int, stderr: str, strict: bool, marker_ok: bool) -> tuple:
    if returncode == 0:
        if strict and not marker_ok:
            return "error", "exited with status 0 before the tests finished"
        return "passed", "exited with status 0"
    if returncode == EXIT_WRONG:
        return "wrong", "AssertionError"
    if returncode == EXIT_MEMORY:
        return "memory", "MemoryError"
    if "MemoryError" in stderr or "Cannot allocate memory" in stderr:
        return "memory", f"exit status {returncode} after a failed allocation"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return "killed", f"terminated by {name}"
    return "error", f"exited with status {returncode}"


def _interpreter_flags() -> list:
    flags = ["-s", "-B"]
    if sys.version_info >= (3, 11):
        flags.append("-P")
    return flags


def _execute(
    source: str,
    *,
    timeout: float,
    limits: Limits,
    stdin: str,
    check: Optional[tuple],
    require_network_isolation: bool,
) -> ExecutionResult:
    if resource is None:  # pragma: no cover - Windows
        raise DareError("the code sandbox needs a POSIX system (the resource module is missing)")
    if not isinstance(source, str):
        raise DareError(f"the program must be a str, got {type(source).__name__}")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise DareError(f"timeout must be a positive number of seconds, got {timeout!r}")
    if not isinstance(limits, Limits):
        raise DareError(f"limits must be a dare_plugin_tasks.sandbox.Limits, got {type(limits).__name__}")
    isolate = network_isolation_available()
    contained = containment_available()
    if require_network_isolation and not isolate:
        raise DareError(
            "network isolation was required but unshare(CLONE_NEWNET) is not permitted here; "
            "run with CAP_SYS_ADMIN or pass require_network_isolation=False"
        )

    workdir = tempfile.mkdtemp(prefix="dare-sandbox-")
    try:
        program = os.path.join(workdir, _PROGRAM)
        harness = os.path.join(workdir, _HARNESS)
        marker = os.path.join(workdir, _MARKER)
        stdin_path = os.path.join(workdir, _STDIN)
        with open(program, "w", encoding="utf-8") as handle:
            handle.write(source)
        with open(harness, "w", encoding="utf-8") as handle:
            handle.write(_HARNESS_SOURCE)
        with open(stdin_path, "w", encoding="utf-8") as handle:
            handle.write(stdin)
        mode_args = ["run"]
        if check is not None:  # (tests, context or None, entry point or None)
            tests, context, entry = check
            mode_args = ["check", os.path.join(workdir, _TESTS), "", entry or ""]
            with open(mode_args[1], "w", encoding="utf-8") as handle:
                handle.write(tests)
            if context is not None:
                mode_args[2] = os.path.join(workdir, _CONTEXT)
                with open(mode_args[2], "w", encoding="utf-8") as handle:
                    handle.write(context)
        token = secrets.token_hex(16).encode()
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": workdir,
            "TMPDIR": workdir,
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONHASHSEED": "0",
            "PYTHONIOENCODING": "utf-8",
        }
        pairs = _rlimits(limits)
        proc = None
        while proc is None:
            read_end, write_end = os.pipe()
            try:
                os.write(write_end, token)
                os.close(write_end)
                write_end = -1
                argv = [
                    sys.executable,
                    *_interpreter_flags(),
                    harness,
                    str(read_end),
                    marker,
                    program,
                    mode_args[0],
                    "1" if contained else "0",
                    *mode_args[1:],
                ]
                with open(stdin_path, "rb") as stdin_file:
                    start = time.monotonic()
                    try:
                        proc = subprocess.Popen(
                            argv,
                            cwd=workdir,
                            env=env,
                            stdin=stdin_file,
                            stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE,
                            pass_fds=(read_end,),
                            start_new_session=True,
                            preexec_fn=_make_preexec(pairs, isolate, _make_contain(workdir) if contained else None),
                        )
                    except subprocess.SubprocessError:
                        if contained:  # a namespace or mount failed in this child although the probe worked
                            contained = False
                            continue
                        if not isolate:
                            raise
                        # unshare failed in this child although the probe succeeded
                        if require_network_isolation:
                            raise DareError("network isolation was required but unshare(CLONE_NEWNET) failed") from None
                        isolate = False
            finally:
                os.close(read_end)
                if write_end >= 0:
                    os.close(write_end)

        out = _Capture(proc.stdout, limits.output_bytes)
        err = _Capture(proc.stderr, limits.output_bytes)
        try:
            exited = _wait_exit(proc, start + float(timeout))
        finally:
            _kill_group(proc.pid)  # the leader is unreaped, so this pgid is still ours
            if proc.poll() is None:
                proc.kill()
            returncode = proc.wait()
        seconds = time.monotonic() - start
        for capture in (out, err):
            capture.thread.join(timeout=2.0)  # a setsid()-escaped descendant may hold the pipe
        proc.stdout.close()
        proc.stderr.close()
        stdout, stderr = out.text(), err.text()
        if not exited:
            status, detail = "timeout", f"wall-clock limit of {float(timeout):g} s exceeded"
        else:
            try:
                with open(marker, "rb") as handle:
                    marker_ok = handle.read() == token
            except OSError:
                marker_ok = False
            status, detail = _classify(returncode, stderr, check is not None, marker_ok)
        return ExecutionResult(
            status=status,
            returncode=returncode,
            stdout=stdout,
            stderr=stderr,
            stdout_truncated=out.truncated,
            stderr_truncated=err.truncated,
            seconds=seconds,
            network_isolated=isolate,
            contained=contained,
            detail=detail,
        )
    finally:
        _remove_tree(workdir)


def run_program(
    source: str,
    *,
    timeout: float = 10.0,
    limits: Limits = Limits(),
    stdin: str = "",
    require_network_isolation: bool = False,
) -> ExecutionResult:
    """Run ``source`` as ``__main__`` in a fresh sandbox; see the module docstring for the rules.

    ``timeout`` is the wall-clock limit in seconds for the whole process group; ``stdin`` is the
    program's standard input. Raises :class:`~dare_core.api.DareError` only for invalid
    arguments or when ``require_network_isolation`` is set and isolation is unavailable; every
    outcome of the program itself is an :class:`ExecutionResult`.
    """
    return _execute(
        source,
        timeout=timeout,
        limits=limits,
        stdin=stdin,
        check=None,
        require_network_isolation=require_network_isolation,
    )


def check_program(
    program: str,
    tests: str,
    entry_point: Optional[str] = None,
    *,
    context: Optional[str] = None,
    timeout: float = 10.0,
    limits: Limits = Limits(),
    stdin: str = "",
    require_network_isolation: bool = False,
) -> ExecutionResult:
    """Grade ``program`` against ``tests``, HumanEval/MBPP style, the tests out of its reach.

    Two processes share the sandbox: the *candidate* (forked before anything secret is read)
    executes ``program`` and then only answers calls, and the *checker*, in which the program
    never runs, executes ``context`` (trusted code such as a HumanEval prompt's helpers), then
    ``tests``, then ``check(<entry_point>)`` when ``entry_point`` is given (HumanEval's test
    strings define ``def check(candidate)``); without it (MBPP's bare ``assert`` lines) every
    function the program defines, except names of builtins, is callable by the tests. A call
    from the tests sends its arguments to the candidate and gets the result back by value:
    ``None``, ``bool``, ``int``, ``float``, ``complex``, ``str``, ``bytes`` and ``list``/
    ``tuple``/``set``/``frozenset``/``dict`` of those (exact types, no subclasses), rebuilt by
    the checker; any other result, e.g. an object with its own ``__eq__``, fails the call with
    ``TypeError``. An exception in the candidate is raised in the checker as the builtin
    exception of the same name (else a generic one). Stdlib modules the program imported under
    their own names (``import math``) are imported afresh in the checker.

    ``passed`` means the tests ran to their end; a failed assertion is ``wrong``; exiting before
    the tests finish (``sys.exit``, ``os._exit``) or an invalid result is ``error``.
    """
    if not isinstance(program, str) or not isinstance(tests, str):
        raise DareError("check_program needs the program and the tests as str")
    if context is not None and not isinstance(context, str):
        raise DareError(f"context must be a str or None, got {type(context).__name__}")
    if entry_point is not None:
        if not isinstance(entry_point, str) or not entry_point.isidentifier():
            raise DareError(f"entry_point must be a Python identifier, got {entry_point!r}")
    return _execute(
        program,
        timeout=timeout,
        limits=limits,
        stdin=stdin,
        check=(tests, context, entry_point),
        require_network_isolation=require_network_isolation,
    )


def run_many(
    jobs: Iterable[Union[str, Job]],
    workers: Optional[int] = None,
    *,
    require_network_isolation: bool = False,
) -> List[ExecutionResult]:
    """Run ``jobs`` (source strings or :class:`Job`) with at most ``workers`` at a time.

    Each job runs in its own sandboxed subprocess; threads only wait on them. Results come back
    in input order. ``workers`` defaults to ``os.cpu_count()``.
    """
    items: Sequence[Union[str, Job]] = list(jobs)
    for index, job in enumerate(items):
        if not isinstance(job, (str, Job)):
            raise DareError(f"run_many job {index} must be a str or a Job, got {type(job).__name__}")
    if workers is None:
        workers = os.cpu_count() or 1
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise DareError(f"workers must be a positive integer, got {workers!r}")
    if not items:
        return []
    network_isolation_available()  # probe once before the threads start
    containment_available()

    def one(job: Union[str, Job]) -> ExecutionResult:
        if isinstance(job, str):
            return run_program(job, require_network_isolation=require_network_isolation)
        if job.tests is not None:
            return check_program(
                job.program,
                job.tests,
                job.entry_point,
                context=job.context,
                timeout=job.timeout,
                limits=job.limits,
                stdin=job.stdin,
                require_network_isolation=require_network_isolation,
            )
        return run_program(
            job.program,
            timeout=job.timeout,
            limits=job.limits,
            stdin=job.stdin,
            require_network_isolation=require_network_isolation,
        )

    with concurrent.futures.ThreadPoolExecutor(max_workers=min(workers, len(items))) as pool:
        return list(pool.map(one, items))
