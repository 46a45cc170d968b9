"""The README's "add a selector" recipe works verbatim: its three files (the module, the YAML, the test), written into a
copy of the project, give a selector that composes by name and passes the start-up check (each of its keys ruled),
appears in the configuration reference the docs build, passes its own test, and trains a step with
`python train.py selector=rare`. One fresh interpreter in the copy does all of it (a process forked from this one would
import tokenrl from the checkout, not from the copy)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.helpers.readme import recipe_files

# run in the copy: the recipe's test, the start-up check (a value its rule accepts, one it refuses), the reference
# page, and `python train.py selector=rare` for one step (train.py as `__main__`, as the shell runs it)
SCRIPT = """
import json, runpy, sys
import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from tokenrl.config.check import check_config
from tokenrl.paths import CONFIG_DIR
import scripts.config_reference as reference

def composed(ratio):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base='1.3'):
        return compose('train', overrides=['selector=rare', f'selector.ratio={ratio}', 'paths.output_dir=out'])

out = {'config_dir': CONFIG_DIR, 'tested': int(pytest.main(['-q', '-p', 'no:cacheprovider', '-n', '0',
                                                            'tests/selectors/test_rare.py']))}
cfg = composed(0.2)
out['warnings'] = check_config(cfg, [])
out['selector'] = type(instantiate(cfg.selector)).__name__
try:
    check_config(composed(2), [])
    out['refused'] = ''
except ValueError as err:
    out['refused'] = str(err)
out['on_the_reference'] = '`configs/selector/rare.yaml`' in reference.render(reference.files())
print('RESULT ' + json.dumps(out), flush=True)
sys.argv = ['train.py', 'selector=rare', 'debug=default', 'total_steps=1', 'hydra.run.dir=run']
runpy.run_path('train.py', run_name='__main__')
"""


def test_the_recipe_names_a_module_a_yaml_and_a_test():
    assert sorted(recipe_files()) == [
        "configs/selector/rare.yaml",
        "src/tokenrl/selectors/rare.py",
        "tests/selectors/test_rare.py",
    ]


@pytest.mark.slow
def test_the_recipe_written_into_a_copy_passes_its_test_the_check_the_reference_and_trains(tmp_path):
    skip = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for folder in ("src", "configs", "scripts"):
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=skip)
    shutil.copy(ROOT / "train.py", tmp_path / "train.py")
    for path, text in recipe_files().items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "src"), "TOKENRL_ROOT": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))[7:])
    assert result["config_dir"] == str(tmp_path / "configs") and result["tested"] == 0
    assert result["warnings"] == [] and result["selector"] == "RareSelector" and result["on_the_reference"]
    assert "selector.ratio=2" in result["refused"]
    assert (tmp_path / "run" / "summary.json").is_file()
    assert "_target_: tokenrl.selectors.rare.RareSelector" in (tmp_path / "run" / ".hydra" / "config.yaml").read_text()
