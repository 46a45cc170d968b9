"""Score responses in a separate worker process with a per-answer time limit.

A check that raises scores 0 with a warning; a check that exceeds `timeout_s` gets its worker killed
and replaced, scores 0 with a warning, and scoring goes on with the next answer. Model text is only
ever parsed, never executed; the worker process also keeps a pathological parse from stalling training.

Workers are forked from multiprocessing's fork server, a clean process (no torch threads, no CUDA, no engine) started
once per trainer process with the answer parsers already imported (`PRELOAD`): a replacement after a timeout, or the
worker of the next run in the same process, starts in milliseconds instead of a fresh interpreter's import time.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import sys
import traceback
from multiprocessing.connection import Connection

log = logging.getLogger(__name__)

PRELOAD = ["tokenrl.rewards.verifiers", "math_verify"]  # imported once, in the fork server


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
        self._ctx = mp.get_context("forkserver" if "forkserver" in methods else "spawn")
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
        deadlocks once both pipes fill (the worker blocks sending results the trainer is not reading yet, the
        trainer blocks sending items the worker is not reading) — a batch of ~1,000 long responses did."""
        scores = [0.0] * len(items)
        pending = 0
        while pending < len(items):
            if self._proc is None or not self._proc.is_alive():
                self._start()
            sent = pending
            for index in range(pending, len(items)):
                while sent < len(items) and sent - index < self.WINDOW:
                    self._conn.send((sent, *items[sent]))
                    sent += 1
                if not self._conn.poll(self.timeout_s):
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

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.send(None)
            except OSError:
                pass
        self._kill()
