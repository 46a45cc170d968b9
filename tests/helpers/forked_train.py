"""`python -m tests.helpers.forked_train ROWS.json OUT_DIR`: `python train.py <argv>` for each argv of ROWS.json (a
list of lists), each in a child forked from this one process, which imports tokenrl once (a start-up is mostly
imports: ~17 start-ups cost a minute on 2 cores, one costs seconds). A child runs the CLI's own `main()` with its
argv; its stdout and stderr go to OUT_DIR/<n>.out and <n>.err, its exit status to OUT_DIR/<n>.status."""
import json
import os
import sys
from pathlib import Path

from tokenrl.train import main


def run_child(argv: list[str], out: Path, n: int) -> None:
    """In the forked child: the CLI with `argv`, its output in files; never returns."""
    for fd, suffix in ((1, "out"), (2, "err")):
        os.dup2(os.open(out / f"{n}.{suffix}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
    sys.argv = ["train.py", *argv]
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
    rows, out = json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2])
    for n, argv in enumerate(rows):
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            run_child(argv, out, n)
        (out / f"{n}.status").write_text(str(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])))
