"""`python -m tests.helpers.forked_cli ENTRY ROWS.json OUT_DIR`: `python ENTRY.py <argv>` (ENTRY: train or eval) for
each argv of ROWS.json (a list of lists), each in a child forked from this one process, which imports the entry point
once (a start-up is mostly imports, ~6 s of CPU: ~17 start-ups cost a minute on 2 cores, one costs seconds). A child
runs the CLI's own Hydra main with its argv; its stdout and stderr go to OUT_DIR/<n>.out and <n>.err, its exit status
to OUT_DIR/<n>.status. `forked_runs` runs a batch from a test and returns each row's `CompletedProcess`."""
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENTRIES = {"train": ("tokenrl.train", "main"), "eval": ("tokenrl.eval", "evaluate_main")}


def forked_runs(entry: str, rows: list[list[str]], out: Path, **kwargs) -> list[subprocess.CompletedProcess]:
    """`python <entry>.py <row>` for each row, forked from one process; `kwargs` go to the launching subprocess.run
    (env=...)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "rows.json").write_text(json.dumps(rows))
    done = subprocess.run([sys.executable, "-m", "tests.helpers.forked_cli", entry, str(out / "rows.json"), str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=900, **kwargs)
    assert done.returncode == 0, done.stderr[-3000:]
    return [subprocess.CompletedProcess([f"{entry}.py", *row], int((out / f"{n}.status").read_text()),
                                        (out / f"{n}.out").read_text(), (out / f"{n}.err").read_text())
            for n, row in enumerate(rows)]


def run_child(main, script: str, argv: list[str], out: Path, n: int) -> None:
    """In the forked child: the CLI with `argv`, its output in files; never returns."""
    for fd, suffix in ((1, "out"), (2, "err")):
        os.dup2(os.open(out / f"{n}.{suffix}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
    sys.argv = [script, *argv]
    status = 0
    try:
        main()
    except SystemExit as stop:
        status = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except BaseException:   # what a real start-up would print before exiting 1
        import traceback
        traceback.print_exc()
        status = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    entry, rows, out = sys.argv[1], json.loads(Path(sys.argv[2]).read_text()), Path(sys.argv[3])
    module, function = ENTRIES[entry]
    main = getattr(importlib.import_module(module), function)
    for n, argv in enumerate(rows):
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            run_child(main, f"{entry}.py", argv, out, n)
        (out / f"{n}.status").write_text(str(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])))
