"""The README's "add a selector" recipe works verbatim: its three files (the module, the YAML, the test), written into a
copy of the project, give a selector that composes by name and passes the start-up check (each of its keys ruled),
appears in the configuration reference the docs build, passes its own test, and trains a step with
`python train.py selector=rare`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.helpers.readme import recipe_files


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """A copy of the project's code and configs with the recipe's three files written in."""
    copy = tmp_path_factory.mktemp("project")
    skip = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for folder in ("src", "configs", "scripts"):
        shutil.copytree(ROOT / folder, copy / folder, ignore=skip)
    shutil.copy(ROOT / "train.py", copy / "train.py")
    for path, text in recipe_files().items():
        (copy / path).parent.mkdir(parents=True, exist_ok=True)
        (copy / path).write_text(text, encoding="utf-8")
    return copy


def python(project: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(project / "src"), "TOKENRL_ROOT": str(project)}
    return subprocess.run([sys.executable, *args], cwd=project, env=env, capture_output=True, text=True, timeout=600)


def test_the_recipe_names_a_module_a_yaml_and_a_test():
    assert sorted(recipe_files()) == [
        "configs/selector/rare.yaml",
        "src/tokenrl/selectors/rare.py",
        "tests/selectors/test_rare.py",
    ]


@pytest.mark.slow
def test_the_recipe_passes_its_test_the_start_up_check_and_the_reference(project):
    tested = python(project, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", "tests/selectors/test_rare.py")
    assert tested.returncode == 0 and "1 passed" in tested.stdout, tested.stdout[-3000:] + tested.stderr[-3000:]
    check = (
        "from hydra import compose, initialize_config_dir\n"
        "from hydra.utils import instantiate\n"
        "from tokenrl.config.check import check_config\n"
        "from tokenrl.paths import CONFIG_DIR\n"
        "with initialize_config_dir(config_dir=CONFIG_DIR, version_base='1.3'):\n"
        "    cfg = compose('train', overrides=['selector=rare', 'selector.ratio=0.2', 'paths.output_dir=out'])\n"
        "print(CONFIG_DIR, check_config(cfg, []), type(instantiate(cfg.selector)).__name__)\n"
        "import scripts.config_reference as reference\n"
        "print('`configs/selector/rare.yaml`' in reference.render(reference.files()))\n"
    )
    checked = python(project, "-c", check)
    assert checked.returncode == 0, checked.stderr[-3000:]
    assert checked.stdout.split() == [str(project / "configs"), "[]", "RareSelector", "True"]
    refused = python(project, "-c", check.replace("selector.ratio=0.2", "selector.ratio=2"))
    assert refused.returncode != 0 and "selector.ratio=2" in refused.stderr


@pytest.mark.slow
def test_train_py_trains_a_step_with_the_recipes_selector(project, tmp_path):
    run = python(project, "train.py", "selector=rare", "debug=default", "total_steps=1", f"hydra.run.dir={tmp_path}")
    assert run.returncode == 0, run.stderr[-3000:]
    assert (tmp_path / "summary.json").is_file()
    assert "_target_: tokenrl.selectors.rare.RareSelector" in (tmp_path / ".hydra" / "config.yaml").read_text()
