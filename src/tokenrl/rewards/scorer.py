"""Score responses in a worker process with a per-answer time limit (docs/data-and-evaluation.md "Verifiers and the
safety of rewards"); model text is only parsed, never executed.

A check that raises or runs over `timeout_s` scores 0 with a warning (a slow check's worker is replaced) and scoring
goes on. The limit counts the worker's own time, CPU plus sleep (/proc/<pid>/stat every `SLICE` s; wall time elsewhere),
not its wait for a CPU, so a loaded machine does not fail fast checks; `STALL_CAP` × `timeout_s` of wall time bounds a
check in any case. Workers fork from a fork server (no torch threads, no CUDA) with the parsers imported (`PRELOAD`), so
a replacement starts in milliseconds.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import sys
import time
import traceback
from multiprocessing.connection import Connection
from pathlib import Path

log = logging.getLogger(__name__)

PRELOAD = ["tokenrl.rewards.verifiers", "math_verify"]  # imported once, in the fork server
STALL_CAP = 10  # a check's wall time, in units of timeout_s, however long the worker waited for a CPU
SLICE = 0.1  # seconds between two looks at the worker's clock
TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def worker_clock(pid: int) -> tuple[float, bool] | None:
    """(CPU seconds, asleep now) of process `pid` (Linux: /proc/<pid>/stat, fields 3, 14 and 15, proc(5)); None
    where the kernel does not say."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / TICKS, fields[0] in ("S", "D")


def _worker(conn: Connection, sys_path: list[str]) -> None:
    sys.path[:] = sys_path
    from tokenrl.rewards.verifiers import preload, resolve

    preload()
    conn.send("ready")
    while True:
        try:
            job = conn.recv()
        except EOFError:  # the trainer went away
            return
        if job is None:
            return
        index, name, response, answer = job
        try:
            score, error = float(resolve(name)(response, answer)), None
        except BaseException as err:  # a broken verifier must not take the run down
            score, error = 0.0, f"{type(err).__name__}: {err}\n{traceback.format_exc(limit=2)}"
        conn.send((index, score, error))


class SafeScorer:
    """`score([(verifier, response, answer), ...]) -> [float]`, each check limited to `timeout_s` seconds."""

    WINDOW = 16  # checks in flight: their results (≤ ~2 KB each, a traceback included) stay far below a pipe's 64 KB

    def __init__(self, timeout_s: float = 5.0) -> None:
        if timeout_s <= 0:
            raise ValueError(f"reward_timeout_s={timeout_s} must be > 0")  # the top-level key of train.yaml / eval.yaml
        self.timeout_s = timeout_s
        methods = mp.get_all_start_methods()  # no fork server on Windows: a fresh interpreter per worker there
        self._ctx = mp.get_context("forkserver") if "forkserver" in methods else mp.get_context("spawn")
        self._proc: mp.process.BaseProcess | None = None
        self._conn: Connection | None = None

    def _start(self) -> None:
        if mp.get_start_method(allow_none=True) not in (None, *mp.get_all_start_methods()):
            # in a loky worker the global start method is 'loky', which a forked-from-the-server child cannot set
            mp.set_start_method("spawn", force=True)
        if self._ctx.get_start_method() == "forkserver":
            self._ctx.set_forkserver_preload(PRELOAD)  # used when this call starts the server (the first worker)
        parent, child = self._ctx.Pipe()
        self._proc = self._ctx.Process(target=_worker, args=(child, list(sys.path)), daemon=True)
        self._proc.start()
        child.close()
        self._conn = parent
        if not parent.poll(120) or parent.recv() != "ready":
            self._kill()
            raise RuntimeError("the verifier worker did not start within 120 s")

    def _kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.join()
        self._proc = self._conn = None

    def score(self, items: list[tuple[str, str, str]]) -> list[float]:
        """Scores in order. At most `WINDOW` checks are in flight: sending every item before reading any result
        deadlocks once both pipes fill (each side blocks sending what the other is not reading)."""
        scores = [0.0] * len(items)
        pending = 0
        while pending < len(items):
            if self._proc is None or not self._proc.is_alive():
                self._start()
            assert self._proc is not None and self._proc.pid is not None and self._conn is not None  # _start set them
            sent = pending
            for index in range(pending, len(items)):
                while sent < len(items) and sent - index < self.WINDOW:
                    self._conn.send((sent, *items[sent]))
                    sent += 1
                if not self._result_arrives(self._conn, self._proc.pid):
                    log.warning(
                        "verifier %r exceeded %.1fs on sample %d; scored 0", items[index][0], self.timeout_s, index
                    )
                    self._kill()
                    pending = index + 1
                    break
                _, score, error = self._conn.recv()
                if error:
                    log.warning("verifier %r raised on sample %d; scored 0: %s", items[index][0], index, error)
                scores[index] = score
            else:
                pending = len(items)
        return scores

    def _result_arrives(self, conn: Connection, pid: int) -> bool:
        """Whether the worker's next result arrives before it has used `timeout_s` of its own time (the module
        docstring) and within `STALL_CAP` × `timeout_s` of wall time. The worker's clock is read only once a result
        is late: the first slice counts as its own time."""
        slice_s = min(SLICE, self.timeout_s)
        start = time.monotonic()
        if conn.poll(slice_s):
            return True
        last, clock, own = time.monotonic(), worker_clock(pid), slice_s
        while not conn.poll(slice_s):
            now, new = time.monotonic(), worker_clock(pid)
            if clock is None or new is None:
                own = now - start
            else:
                own += new[0] - clock[0] + (now - last if new[1] else 0.0)
            clock, last = new, now
            if own >= self.timeout_s or now - start >= STALL_CAP * self.timeout_s:
                return False
        return True

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.send(None)
            except OSError:
                pass
        self._kill()
