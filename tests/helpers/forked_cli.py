"""A fork server for the tests' command-line runs: `forked_python(["train.py", ...])` is `python train.py ...`, run as
a child forked from one process per test worker that has imported tokenrl's entry points once. A start-up is mostly
imports (~6 s of CPU, and the suite runs dozens of CLI invocations); a forked child starts in a fraction of a second.

The child is the command as a fresh interpreter runs it, not a call into a function: it takes the request's working
directory and environment, its script runs as `__main__` (runpy) with its own `sys.argv` and the script's folder first
on `sys.path`, so Lightning's launchers, Hydra and multiprocessing see what `python SCRIPT ARGS` shows them; `-m MODULE`
and `-c CODE` work as in python. Its stdout and stderr come back in a `CompletedProcess`, its exit status as
`subprocess.run` reports it (a signal: negative).

Not for what only a fresh interpreter shows (an environment variable read at import time, which modules a start-up
imports, a PYTHONPATH of its own) or a process read while it runs: those tests start `python` themselves.

Protocol (`python -m tests.helpers.forked_cli`): a JSON request per line on stdin {argv, env, cwd, stdout, stderr};
per request two JSON lines back, {"pid": ...} when the child is forked and {"status": ...} when it has exited."""

from __future__ import annotations

import atexit
import importlib
import json
import os
import runpy
import select
import signal
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRELOAD = ("tokenrl.run.training", "tokenrl.cli.eval")


class _Server:
    """The worker's server process, its log and what it has replied but not yet been read."""

    def __init__(self) -> None:
        log, self.log = tempfile.mkstemp(prefix="forked-cli-server-", suffix=".log")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.helpers.forked_cli"],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            bufsize=0,
        )
        os.close(log)
        self.pending = b""
        atexit.register(os.unlink, self.log)
        atexit.register(self.process.stdin.close)  # first at exit: end of input, the server exits

    def request(self, request: dict) -> None:
        self.process.stdin.write(json.dumps(request).encode() + b"\n")

    def reply(self, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while b"\n" not in self.pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([self.process.stdout], [], [], remaining)[0]:
                raise TimeoutError
            chunk = os.read(self.process.stdout.fileno(), 65536)
            if not chunk:
                raise RuntimeError(f"the fork server exited: {Path(self.log).read_text()[-3000:]}")
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        return json.loads(line)


_server: _Server | None = None


def forked_python(
    argv: list[str], *, env: dict[str, str] | None = None, cwd: Path = ROOT, timeout: float = 600
) -> subprocess.CompletedProcess:
    """`python *argv` forked from this worker's server (started on first use): what `subprocess.run(...,
    capture_output=True, text=True, timeout=timeout)` returns, and its `TimeoutExpired` (the child killed) past it."""
    global _server
    if _server is None or _server.process.poll() is not None:
        _server = _Server()
    with tempfile.TemporaryDirectory(prefix="forked-cli-") as folder:
        out, err = Path(folder) / "stdout", Path(folder) / "stderr"
        _server.request(
            {
                "argv": [str(arg) for arg in argv],
                "env": dict(os.environ if env is None else env),
                "cwd": str(cwd),
                "stdout": str(out),
                "stderr": str(err),
            }
        )
        try:
            pid = _server.reply(60)["pid"]
        except TimeoutError:
            _server.process.kill()  # its late reply would answer the next request: a fresh server next time
            raise
        try:
            status = _server.reply(timeout)["status"]
        except TimeoutError:
            os.kill(pid, signal.SIGKILL)
            _server.reply(60)
            raise subprocess.TimeoutExpired(argv, timeout, out.read_text(), err.read_text()) from None
        return subprocess.CompletedProcess(list(argv), status, out.read_text(), err.read_text())


SPAWN = """import importlib, json, sys
import torch.multiprocessing as mp
module, name, args, nprocs = json.loads(sys.argv[1])
mp.start_processes(getattr(importlib.import_module(module), name), args=tuple(args), nprocs=nprocs, start_method="fork")
"""


def forked_spawn(function, args: tuple, nprocs: int) -> None:
    """`torch.multiprocessing.spawn(function, args, nprocs)` with the processes forked, not started fresh: a child of
    the server (which has run no torch op and touched no GPU: fork is safe there) starts them. `function` is a module
    attribute, imported there by name; `args` go through JSON."""
    done = forked_python(["-c", SPAWN, json.dumps([function.__module__, function.__name__, list(args), nprocs])])
    assert done.returncode == 0, done.stderr[-3000:]


def _run_child(request: dict) -> None:
    """In the forked child: the request's command, as `python` would run it; never returns."""
    status = 1
    try:
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
        argv = request["argv"]
        if argv[0] == "-m":
            sys.argv = argv[1:]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        elif argv[0] == "-c":
            sys.argv = ["-c", *argv[2:]]
            sys.path.insert(0, "")
            sys.modules["__main__"] = main = types.ModuleType("__main__")
            exec(compile(argv[1], "<string>", "exec"), main.__dict__)
        else:
            sys.argv = argv
            sys.path.insert(0, str(Path(argv[0]).resolve().parent))
            runpy.run_path(argv[0], run_name="__main__")
        status = 0
    except SystemExit as stop:  # sys.exit(message) prints it and exits 1, as python does
        if stop.code is None or isinstance(stop.code, int):
            status = stop.code or 0
        else:
            print(stop.code, file=sys.stderr)
    except BaseException:  # what a real start-up prints before exiting 1
        import traceback

        traceback.print_exc()
    finally:  # what the interpreter's exit does: the exit handlers, then the streams flushed (unless closed)
        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            if not stream.closed:
                stream.flush()
        os._exit(status)


def serve() -> None:
    """The server: preload the entry points, then fork a child per request and report its pid and exit status."""
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # stray prints of an import go to the log, not into the replies
    for module in PRELOAD:
        importlib.import_module(module)
    for line in sys.stdin:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            replies.close()
            _run_child(request)
        replies.write(json.dumps({"pid": pid}) + "\n")
        replies.flush()
        status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        replies.write(json.dumps({"status": status}) + "\n")
        replies.flush()


if __name__ == "__main__":
    serve()
