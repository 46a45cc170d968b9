"""tests/helpers/forked_cli.py: a command forked from the worker's server behaves as `python` started fresh would: its
argv, `__main__`, environment, working directory, output and exit status (an exit code, a message, an exception, a
signal), and a timeout kills it and raises as `subprocess.run` does."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.helpers.forked_cli import forked_python

pytestmark = pytest.mark.slow  # starts the worker's fork server (one start-up)

SCRIPT = """import os, sys
print("argv", sys.argv, "main", __name__, "cwd", os.getcwd(), "value", os.environ.get("FORKED_VALUE"))
print("first on sys.path", sys.path[0])
sys.exit(int(sys.argv[1]))
"""


def test_a_script_runs_as_main_with_its_argv_environment_and_folder(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    done = forked_python([str(script), "3", "x"], env={**os.environ, "FORKED_VALUE": "7"}, cwd=tmp_path)
    assert done.returncode == 3
    assert done.stdout.splitlines() == [
        f"argv ['{script}', '3', 'x'] main __main__ cwd {tmp_path} value 7",
        f"first on sys.path {tmp_path}",
    ]
    assert "FORKED_VALUE" not in os.environ  # the child's environment is its own


@pytest.mark.parametrize(
    "code,status,stderr",
    [
        ("import sys; print('out'); print('err', file=sys.stderr)", 0, "err\n"),
        ("import sys; sys.exit('a message')", 1, "a message\n"),
        ("raise ValueError('boom')", 1, "ValueError: boom"),
        ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", -9, ""),
    ],
)
def test_exit_status_and_output_are_what_python_gives(code, status, stderr):
    done = forked_python(["-c", code])
    fresh = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == fresh.returncode == status
    assert stderr in done.stderr and done.stdout == fresh.stdout


def test_a_module_runs_as_main_with_dash_m(tmp_path):
    (tmp_path / "in.json").write_text('{"b": [1, 2], "a": null}')
    argv = ["-m", "json.tool", "--sort-keys", str(tmp_path / "in.json")]
    done = forked_python(argv)
    assert (
        done.returncode == 0
        and done.stdout == subprocess.run([sys.executable, *argv], capture_output=True, text=True).stdout
    )
    assert done.stdout.startswith('{\n    "a": null,')


def test_past_its_timeout_the_child_is_killed_and_the_server_serves_on():
    with pytest.raises(subprocess.TimeoutExpired):
        forked_python(["-c", "import time; print('started', flush=True); time.sleep(60)"], timeout=2)
    assert forked_python(["-c", "print('next')"]).stdout == "next\n"
