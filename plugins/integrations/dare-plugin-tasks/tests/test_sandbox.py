"""The code-execution sandbox: outcomes, limits, cleanup of processes and files, isolation, pool."""

from __future__ import annotations

import os
import socket
import sys
import tempfile
import time
import uuid

import pytest

from dare_core.errors import DareError
from dare_plugin_tasks import sandbox
from dare_plugin_tasks.sandbox import (
    EXIT_WRONG,
    ExecutionResult,
    Job,
    Limits,
    check_program,
    containment_available,
    network_isolation_available,
    run_many,
    run_program,
)

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox tests use /proc")

HUMANEVAL_PROMPT = '''def add(a: int, b: int) -> int:
    """Return the sum of a and b.
    >>> add(2, 3)
    5
    """
'''
HUMANEVAL_TESTS = """METADATA = {}


def check(candidate):
    assert candidate(2, 3) == 5
    assert candidate(-1, 1) == 0
    assert candidate(10, 0) == 10
"""


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a live (non-zombie) process; reaping of orphans is up to PID 1."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            state = handle.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def _wait_dead(pid: int, seconds: float = 2.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.02)
    return not _alive(pid)


# ----------------------------------------------------------------------------------------- outcomes
def test_passed_captures_stdout_and_stdin():
    result = run_program("import sys\nprint(sys.stdin.read().upper(), end='')\n", stdin="hello")
    assert isinstance(result, ExecutionResult)
    assert result.status == "passed" and result.passed
    assert result.returncode == 0
    assert result.stdout == "HELLO"
    assert not result.stdout_truncated and not result.stderr_truncated
    assert 0 < result.seconds < 10


def test_assertion_failure_is_wrong():
    result = run_program("x = 1\nassert x == 2, 'nope'\n")
    assert result.status == "wrong"
    assert result.returncode == EXIT_WRONG
    assert "AssertionError: nope" in result.stderr
    assert "_dare_harness" not in result.stderr  # the harness frame is cut from the traceback


def test_other_exception_and_nonzero_exit_are_error():
    result = run_program("raise ValueError('bad value')\n")
    assert result.status == "error" and result.returncode == 1
    assert "ValueError: bad value" in result.stderr
    exited = run_program("import sys\nsys.exit(3)\n")
    assert exited.status == "error" and exited.returncode == 3


def test_syntax_error_is_error():
    result = run_program("def f(:\n    pass\n")
    assert result.status == "error"
    assert "SyntaxError" in result.stderr


def test_sys_exit_zero_passes_a_plain_program():
    assert run_program("import sys\nprint('x')\nsys.exit(0)\n").status == "passed"


# ---------------------------------------------------------------------------------------- timeouts
@pytest.mark.parametrize("body", ["while True:\n    pass\n", "import time\ntime.sleep(100)\n"])
def test_wall_clock_timeout(body):
    start = time.monotonic()
    result = run_program(body, timeout=1.0)
    elapsed = time.monotonic() - start
    assert result.status == "timeout"
    assert result.returncode == -9
    assert 0.9 <= result.seconds < 4 and elapsed < 5


# A descendant reports its pid as the host sees it: /proc is the host's, also inside the sandbox's
# PID namespace, so /proc/self names the host pid. It sends the pid up a pipe to the program, which
# prints it, so the pid is on stdout before the program goes on.
_REPORT_PID = (
    "import os, sys, time\n"
    "def spawn(escape=False):\n"
    "    r, w = os.pipe()\n"
    "    if os.fork() == 0:\n"
    "        if escape:\n"
    "            os.setsid()\n"
    "        os.write(w, os.readlink('/proc/self').encode())\n"
    "        time.sleep(100)\n"
    "        os._exit(0)\n"
    "    print(os.read(r, 32).decode(), flush=True)\n"
)


def _assert_all_dead(pids):
    assert pids
    for pid in pids:
        assert _wait_dead(pid), f"descendant {pid} survived"


@pytest.mark.parametrize(
    "tail,timeout,status",
    [
        ("time.sleep(100)\n", 1.0, "timeout"),  # killed by the timeout
        ("", 10.0, "passed"),  # the leader exits at once; its grandchild must not outlive the run
    ],
)
def test_process_group_is_killed(tail, timeout, status):
    start = time.monotonic()
    result = run_program(_REPORT_PID + "spawn()\n" + tail, timeout=timeout)
    assert result.status == status, result
    assert time.monotonic() - start < 5
    _assert_all_dead([int(line) for line in result.stdout.split()])


def _need_containment():
    if not containment_available():
        pytest.skip(
            "new PID and mount namespaces are not permitted here (unshare(CLONE_NEWPID|"
            "CLONE_NEWNS) and mount need CAP_SYS_ADMIN); the sandbox runs uncontained"
        )


@pytest.mark.parametrize(
    "tail,timeout,status",
    [
        ("time.sleep(100)\n", 1.0, "timeout"),
        ("", 10.0, "passed"),
    ],
)
def test_setsid_escape_is_killed_with_the_pid_namespace(tail, timeout, status):
    _need_containment()
    result = run_program(_REPORT_PID + "spawn(escape=True)\nspawn(escape=True)\n" + tail, timeout=timeout)
    assert result.status == status and result.contained, result
    _assert_all_dead([int(line) for line in result.stdout.split()])


def test_fork_bomb_is_contained():
    # Doubling ten times: 1024 processes, most of them asleep when the timeout kills them. The
    # doubling is bounded, not `while True: os.fork()`, so that a host without containment (or a
    # slow one) is not harmed; each process prints its host pid, and none may survive the run.
    body = (
        "import os, time\n"
        "for _ in range(10):\n"
        "    try:\n"
        "        os.fork()\n"
        "    except OSError:\n"
        "        break\n"
        "print(os.readlink('/proc/self'), flush=True)\n"
        "time.sleep(100)\n"
    )
    result = run_program(body, timeout=3.0, limits=Limits(processes=4096))
    assert result.status == "timeout", result
    pids = [int(line) for line in result.stdout.split()]
    assert len(pids) > 1
    _assert_all_dead(pids)
    assert run_program("print('after')").stdout == "after\n"


def test_sigterm_ignored_is_killed_at_the_timeout():
    body = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nwhile True:\n    time.sleep(0.01)\n"
    result = run_program(body, timeout=1.0)
    assert result.status == "timeout" and result.returncode == -9, result


def test_killing_the_parent_does_not_hurt_the_grader():
    # Without containment the program's parent is the grader process itself, so the test needs it.
    _need_containment()
    body = "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nos.killpg(0, signal.SIGKILL)\nprint('alive')\n"
    result = run_program(body, timeout=5.0)
    assert result.status in ("killed", "passed") and result.contained, result
    assert check_program("def f():\n    return 1\n", "assert f() == 1\n").passed


def test_write_outside_the_workdir_fails():
    _need_containment()
    target = os.path.join(tempfile.gettempdir(), f"outside-{uuid.uuid4().hex}")
    body = f"open({target!r}, 'w').write('x')\nopen('inside.txt', 'w').write('x')\n"
    try:
        result = run_program(body)
        assert result.status == "error" and "Read-only file system" in result.stderr, result
        assert not os.path.exists(target)
    finally:
        if os.path.exists(target):
            os.unlink(target)
    assert run_program("open('inside.txt', 'w').write('x')\nprint(open('inside.txt').read())\n").stdout == "x\n"


# ------------------------------------------------------------------------------------------ limits
def test_memory_hog_is_memory():
    body = "chunks = []\nwhile True:\n    chunks.append(bytearray(64 * 1024 * 1024))\n"
    result = run_program(body, limits=Limits(address_space=512 * 1024**2), timeout=20)
    assert result.status == "memory", result


def test_cpu_limit_kills():
    start = time.monotonic()
    result = run_program("while True:\n    pass\n", limits=Limits(cpu_seconds=1), timeout=20)
    assert result.status == "killed", result
    assert result.returncode in (-24, -9)  # SIGXCPU, or SIGKILL at the hard limit
    assert time.monotonic() - start < 8


def test_file_size_limit(tmp_path):
    body = "with open('big.bin', 'wb') as handle:\n    handle.write(b'x' * (2 * 1024 * 1024))\n"
    limited = run_program(body, limits=Limits(file_size=1024 * 1024))
    assert limited.status == "error"
    assert "File too large" in limited.stderr
    assert run_program(body, limits=Limits(file_size=4 * 1024 * 1024)).status == "passed"


def test_output_is_capped_without_deadlock():
    body = "import sys\nsys.stdout.write('x' * 10_000_000)\nsys.stderr.write('e' * 300_000)\n"
    start = time.monotonic()
    result = run_program(body, limits=Limits(output_bytes=64 * 1024), timeout=20)
    assert time.monotonic() - start < 10
    assert result.status == "passed"
    assert result.stdout == "x" * 65536 and result.stdout_truncated
    assert result.stderr == "e" * 65536 and result.stderr_truncated
    small = run_program("print('ok')")
    assert small.stdout == "ok\n" and not small.stdout_truncated


def test_limits_are_validated():
    with pytest.raises(DareError, match="cpu_seconds"):
        Limits(cpu_seconds=0)
    with pytest.raises(DareError, match="output_bytes"):
        Limits(output_bytes=None)
    with pytest.raises(DareError, match="timeout"):
        run_program("pass", timeout=0)
    assert Limits(address_space=None).address_space is None


# -------------------------------------------------------------------------------- files and env
def test_workdir_is_fresh_and_removed():
    body = "import os\nprint(os.getcwd())\nprint(os.environ['HOME'])\nopen('left.txt', 'w').write('x')\n"
    result = run_program(body)
    assert result.status == "passed"
    cwd, home = result.stdout.split()
    assert cwd == home
    assert os.path.basename(cwd).startswith("dare-sandbox-")
    assert os.path.realpath(os.path.dirname(cwd)) == os.path.realpath(tempfile.gettempdir())
    assert not os.path.exists(cwd)


def test_workdir_removed_after_timeout():
    result = run_program("import os, time\nprint(os.getcwd(), flush=True)\ntime.sleep(100)\n", timeout=1.0)
    assert result.status == "timeout"
    assert result.stdout.strip().startswith(tempfile.gettempdir())
    assert not os.path.exists(result.stdout.strip())


def test_environment_is_scrubbed(monkeypatch):
    monkeypatch.setenv("DARE_SECRET_TEST", "hunter2")
    body = "import os\nprint(repr(os.environ.get('DARE_SECRET_TEST')))\nprint(os.environ.get('PYTHONHASHSEED'))\n"
    result = run_program(body)
    assert result.status == "passed"
    assert result.stdout.split() == ["None", "0"]
    assert "hunter2" not in result.stdout


# ----------------------------------------------------------------------------------- check_program
def test_check_program_humaneval_passed_and_wrong():
    good = check_program(HUMANEVAL_PROMPT + "    return a + b\n", HUMANEVAL_TESTS, "add")
    assert good.status == "passed", good
    bad = check_program(HUMANEVAL_PROMPT + "    return a - b\n", HUMANEVAL_TESTS, "add")
    assert bad.status == "wrong", bad


def test_check_program_mbpp_style_and_errors():
    tests = "assert square(3) == 9\nassert square(-2) == 4\n"
    assert check_program("def square(x):\n    return x * x\n", tests).status == "passed"
    assert check_program("def square(x):\n    return x + x\n", tests).status == "wrong"
    assert check_program("def square(x):\n    return x.foo\n", tests).status == "error"
    with pytest.raises(DareError, match="entry_point"):
        check_program("pass", "pass", "not an identifier")


def test_check_program_results_cross_by_value_and_type():
    program = (
        "def values(x, *, scale=1):\n"
        "    return [None, True, 3 * scale, 0.1 + 0.2, 1 + 2j, 'é', b'\\x00', (1, [2]), {3}, frozenset({4}),\n"
        "            {'k': (x,)}]\n"
        "def fails(kind):\n"
        "    raise {'value': ValueError, 'mine': type('Mine', (Exception,), {})}[kind]('no')\n"
    )
    tests = (
        "out = values([1.5], scale=2)\n"
        "assert out == [None, True, 6, 0.1 + 0.2, 1 + 2j, 'é', b'\\x00', (1, [2]), {3}, frozenset({4}),\n"
        "               {'k': ([1.5],)}]\n"
        "assert [type(v) for v in out] == [type(None), bool, int, float, complex, str, bytes, tuple, set,\n"
        "                                  frozenset, dict]\n"
        "try:\n    fails('value')\nexcept ValueError as exc:\n    assert str(exc) == 'no'\n"
        "try:\n    fails('mine')\nexcept Exception as exc:\n    assert 'Mine: no' in str(exc)\n"
    )
    assert check_program(program, tests).status == "passed"
    # a result that is not a plain value fails the call
    assert check_program("def f():\n    return object()\n", "f()\n").status == "error"
    assert check_program("def f():\n    return [len]\n", "f()\n").status == "error"


def test_check_program_candidate_process_endings():
    kill = "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n"
    assert check_program(kill, "pass").status == "killed"  # while loading
    assert check_program("def f():\n    " + kill.replace("\n", "\n    "), "f()").status == "killed"
    assert check_program("def f():\n    import os\n    os._exit(0)\n", "f()").status == "error"
    assert check_program("assert False\n", "pass").status == "wrong"


def test_check_program_context_is_the_checkers():
    # the checker runs the trusted context, not the program's redefinition of its helpers
    context = "def helper(x):\n    return x + 1\n\ndef f(x):\n    pass\n"
    tests = "def check(candidate):\n    assert helper(candidate(1)) == 3\n"
    program = "def helper(x):\n    return 3\n\ndef f(x):\n    return 0\n"
    assert check_program(program, tests, "f").status == "error"  # no helper in the checker
    assert check_program(program, tests, "f", context=context).status == "wrong"
    assert check_program(program.replace("return 0", "return 2"), tests, "f", context=context).status == "passed"


@pytest.mark.parametrize("escape", ["import sys\nsys.exit(0)", "import os\nos._exit(0)", "quit()"])
def test_check_program_early_exit_is_not_a_pass(escape):
    program = HUMANEVAL_PROMPT + "    return 0\n" + escape + "\n"
    result = check_program(program, HUMANEVAL_TESTS, "add")
    assert result.status == "error", result
    # the same program is a clean exit when it is not being graded
    assert run_program(program).status == "passed"


# ---------------------------------------------------------------------------------------- run_many
def test_run_many_order_and_parallelism():
    jobs = [f"import time\ntime.sleep(1)\nprint({i})\n" for i in range(4)]
    start = time.monotonic()
    results = run_many(jobs, workers=2)
    elapsed = time.monotonic() - start
    assert [r.stdout.strip() for r in results] == ["0", "1", "2", "3"]
    assert all(r.status == "passed" for r in results)
    assert elapsed < 3.5  # serial would take >= 4 s


def test_run_many_mixed_jobs():
    jobs = [
        Job(HUMANEVAL_PROMPT + "    return a + b\n", tests=HUMANEVAL_TESTS, entry_point="add"),
        "assert False\n",
        Job("print(input())", stdin="hi\n"),
        Job("while True:\n    pass\n", timeout=0.5),
    ]
    results = run_many(jobs, workers=2)
    assert [r.status for r in results] == ["passed", "wrong", "passed", "timeout"]
    assert results[2].stdout == "hi\n"
    assert run_many([]) == []
    with pytest.raises(DareError, match="workers"):
        run_many(["pass"], workers=0)


# ----------------------------------------------------------------------------------------- network
_CONNECT = (
    "import socket\n"
    "try:\n"
    "    socket.create_connection(('127.0.0.1', {port}), timeout=2).close()\n"
    "except OSError as exc:\n"
    "    print('blocked', exc)\n"
    "else:\n"
    "    print('connected')\n"
)


@pytest.fixture
def listener():
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    yield server.getsockname()[1]
    server.close()


def test_network_is_isolated(listener):
    if not network_isolation_available():
        pytest.skip(
            "unshare(CLONE_NEWNET) is not permitted here (needs CAP_SYS_ADMIN); the sandbox runs with the host network"
        )
    result = run_program(_CONNECT.format(port=listener), require_network_isolation=True)
    assert result.network_isolated
    assert result.stdout.startswith("blocked"), result


def test_without_isolation_the_network_is_reachable(listener, monkeypatch):
    # the control for the test above: the same probe program connects when isolation is off
    monkeypatch.setattr(sandbox, "_probe_result", False)
    result = run_program(_CONNECT.format(port=listener))
    assert not result.network_isolated
    assert result.stdout.strip() == "connected", result
    with pytest.raises(DareError, match="network isolation"):
        run_program("pass", require_network_isolation=True)
