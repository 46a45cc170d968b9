"""config/command_line.py: what a command line gets before Hydra composes it.

The headline command means what it says (issue #35 §6): `python train.py selector=ict model=qwen1.5b` composes the
GPU trainer (bf16-mixed), vLLM's GPU preset (or the hf engine without vLLM) and the paper's task for Qwen2.5 (GSM8K)
on a machine with a GPU; on a CPU machine the CPU trainer and the hf engine with the paper's task. What the command
names itself, an experiment and sweeps are left alone. The GPU and vLLM are mocked; the composition is Hydra's."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from tests.conftest import compose_config
from tokenrl.config.command_line import composition_problem, machine_overrides, run_dir_override, with_machine_defaults

HEADLINE = ["selector=ict", "model=qwen1.5b"]


@pytest.mark.parametrize(
    "gpu,vllm,trainer,precision,engine,rollout_dtype",
    [
        (True, True, "gpu", "bf16-mixed", "vllm", "bfloat16"),
        (True, False, "gpu", "bf16-mixed", "hf", None),
        (False, True, "cpu", "32-true", "hf", None),
    ],
)
def test_the_headline_command_composes_what_the_machine_supports_best(
    monkeypatch, gpu, vllm, trainer, precision, engine, rollout_dtype
):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu)
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: (object() if vllm else None) if name == "vllm" else real_find_spec(name, *a),
    )
    cfg = compose_config(with_machine_defaults(list(HEADLINE))[len(HEADLINE) :] + HEADLINE)
    assert (cfg.trainer.accelerator, cfg.trainer.precision, cfg.rollout.engine) == (trainer, precision, engine)
    assert rollout_dtype is None or cfg.rollout.dtype == rollout_dtype
    assert (cfg.task.train, cfg.task.test, cfg.model.name, cfg.selector._target_) == (
        "gsm8k_train",
        "gsm8k",
        "qwen1.5b",
        "tokenrl.selectors.ICTSelector",
    )


@pytest.mark.parametrize(
    "argv,added",
    [
        (["trainer=cpu", "model=qwen1.5b"], ["rollout=vllm_gpu", "task=gsm8k"]),  # the command's own choice stays
        (["model=qwen1.5b", "task=arithmetic", "rollout=hf"], ["trainer=gpu"]),
        (["experiment=ict_gsm8k_qwen1.5b"], []),  # an experiment names its own
        (["-m", "model=qwen1.5b", "seed=0,1"], []),  # sweep jobs may run elsewhere
        (["model=smollm2_135m"], ["trainer=gpu", "rollout=vllm_gpu"]),  # no paper task: the default task
    ],
)
def test_what_the_command_names_is_kept(argv, added):
    assert machine_overrides(argv, gpu=True, vllm=True) == added


def test_a_cpu_machine_is_told_what_it_gets(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert with_machine_defaults(list(HEADLINE)) == [*HEADLINE, "task=gsm8k"]
    assert "this machine has no GPU (trainer=cpu, rollout=hf); added task=gsm8k" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv,config,words",
    [
        (["selector=nosuch"], "train", ["selector=nosuch: no such preset (the selector presets: archer,", "uniform)"]),
        (["selector=ict_complment"], "train", ["did you mean selector=ict_complement?"]),
        (["seed=[1,"], "train", ["seed=[1,: not a valid override"]),
        (
            ["selector=uniform", "selector.ratio=0"],
            "train",
            ["selector=uniform has no setting 'ratio' (its settings: normalizer)", "presets that have it: clip_cov,"],
        ),
        (
            ["totl_steps=5"],
            "train",
            ["totl_steps=5: the config has no setting 'totl_steps'", "did you mean total_steps?"],
        ),
        (["eval.n_sample=4"], "eval", ["eval has no setting 'n_sample'", "did you mean eval.n_samples?"]),
        (["model=nosuch"], "eval", ["model=nosuch: no such preset (the model presets: forks_tiny,"]),
    ],
)
def test_a_command_line_hydra_cannot_compose_is_one_line_naming_the_fix(argv, config, words):
    problem = composition_problem(argv, config)
    assert problem is not None and "\n" not in problem
    assert all(word in problem for word in words), problem


@pytest.mark.parametrize(
    "argv",
    [["selector=ict", "selector_ratio=0.2"], ["selector=entropy20", "selector.ratio=0.3"], ["-m", "seed=0,1"], []],
)
def test_a_command_line_that_composes_or_a_sweep_is_left_to_hydra(argv):
    assert composition_problem(argv) is None


@pytest.mark.parametrize(
    "argv,problem",
    [
        (["selector=ict", "selector.ratio=0.2"], "selector.ratio=0.2: selector=ict takes it from selector_ratio"),
        (["selector=random", "selector.warmup_steps=5"], "selector=random takes it from selector_warmup_steps"),
        (["task=forks", "task.seed=3"], None),  # the forks task file is global: its seed is the task's own key
        (["selector=ict", "selector.seed=3"], "selector=ict has no setting 'seed'"),  # no seed: no such key
    ],
)
def test_a_key_a_preset_takes_from_another_setting_has_that_ones_name(argv, problem):
    """One name per setting (issue #49): ICT, ict_complement and random take their ratio and warm-up from the run's
    `selector_ratio` / `selector_warmup_steps` (one knob, so the random control matches ICT); typing the selector's
    own key stops in one line naming the knob."""
    found = composition_problem(argv)
    assert (found is None) if problem is None else (problem in found and "\n" not in found)


def _run_train_main(monkeypatch, capsys, argv: list[str], gpu: bool) -> str:
    """`python train.py <argv>` in this process on a machine with or without a GPU (vLLM installed): its stdout."""
    from tokenrl.cli import train as train_cli

    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu)
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: object() if name == "vllm" else real_find_spec(name, *a)
    )
    monkeypatch.setattr(train_cli, "reexec_with_tcmalloc", lambda: None)
    monkeypatch.setattr("sys.argv", ["train.py", *argv])
    train_cli.main()
    return capsys.readouterr().out


@pytest.mark.parametrize("gpu", [True, False], ids=["gpu", "cpu"])
@pytest.mark.parametrize(
    "flags,shows",
    [(["--cfg", "job"], "config"), (["--cfg", "job", "--resolve"], "config"), (["--info", "defaults"], "defaults")],
)
def test_hydras_flags_get_the_machines_overrides_where_hydra_reads_them(monkeypatch, capsys, gpu, flags, shows):
    """Break 3 of issue #46: the added overrides went after the flags (`... --cfg job trainer=gpu`), which Hydra's
    parser refuses. Now `python train.py selector=ict model=qwen1.5b <flags>` composes what the machine adds, whichever
    side of the overrides the flags stand."""
    for argv in ([*HEADLINE, *flags], [*flags, *HEADLINE]):
        out = _run_train_main(monkeypatch, capsys, argv, gpu)
        added = machine_overrides(argv, gpu=gpu, vllm=True)
        expected = {"trainer": "gpu" if "trainer=gpu" in added else "cpu"}
        expected["rollout"] = "vllm_gpu" if "rollout=vllm_gpu" in added else "hf"
        expected["task"] = "gsm8k" if "task=gsm8k" in added else "arithmetic"
        if shows == "defaults":  # Hydra's defaults list: one row per chosen preset, `group/preset`
            assert all(f"{group}/{preset} " in out for group, preset in expected.items()), out
        else:
            import yaml

            cfg = yaml.safe_load(out)
            assert cfg["trainer"]["accelerator"] == expected["trainer"]
            assert cfg["rollout"]["engine"] == ("vllm" if expected["rollout"] == "vllm_gpu" else "hf")
            assert cfg["task"]["test"] == ("gsm8k" if expected["task"] == "gsm8k" else cfg["task"]["test"])
            assert cfg["model"]["name"] == "qwen1.5b"


@pytest.mark.parametrize("gpu", [True, False], ids=["gpu", "cpu"])
def test_a_sweep_is_handed_to_hydra_as_typed(monkeypatch, gpu):
    """`-m` (Hydra refuses it beside --cfg / --info): its jobs may run on other machines, so nothing is added."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu)
    for argv in (["-m", *HEADLINE, "seed=0,1"], [*HEADLINE, "seed=0,1", "--multirun"]):
        assert with_machine_defaults(list(argv)) == argv


def test_a_resume_run_folder_stands_beside_the_overrides(tmp_path):
    """`hydra.run.dir=` (a resume into its run) goes with the overrides, not after a flag."""
    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    (run / "checkpoints").mkdir()
    last = run / "checkpoints" / "last.ckpt"
    last.touch()
    argv = [f"ckpt_path={last}", "--cfg", "job"]
    assert run_dir_override(argv) == [f"ckpt_path={last}", f"hydra.run.dir={run}", "--cfg", "job"]


def test_no_setting_has_two_names():
    """Issue #49: a preset's key whose value is another setting (`ratio: ${selector_ratio}`) is no second name: typing
    it stops in one line naming that setting; and no preset sets a renamed key (`model.lr`, ...)."""
    from pathlib import Path

    import yaml

    from tokenrl.config.known_settings import RENAMED
    from tokenrl.config.presets import WIRED
    from tokenrl.paths import CONFIG_DIR

    wired = 0
    for path in sorted(Path(CONFIG_DIR).glob("*/*.yaml")):
        group, text = path.parent.name, path.read_text()
        if group in ("base", "batch", "hydra", "experiment") or text.startswith("# @package _global_"):
            continue  # not a group=preset choice whose keys sit under the group's node
        for key, value in (yaml.safe_load(text) or {}).items():
            found = WIRED.fullmatch(value) if isinstance(value, str) else None
            if found and found[1].startswith(f"{group}."):  # a default following its own node's setting: its own
                assert composition_problem([f"{group}={path.stem}", f"{group}.{key}=7"]) is None, (path, key)
            elif found:
                wired += 1
                problem = composition_problem([f"{group}={path.stem}", f"{group}.{key}=7"])
                assert problem is not None and f"write {found[1]}=7" in problem, (path, key, problem)
        assert not {f"{group}.{key}" for key in yaml.safe_load(text) or {}} & set(RENAMED), path
    assert wired >= 6  # ict, ict_complement, random: ratio and warm-up


def test_bad_settings_stop_before_hydra_makes_the_run_folder(monkeypatch, capsys, tmp_path):
    """Issue #50 §11: a setting the start-up check refuses (here after composition: a ratio out of range) stops in the
    command line's process, before Hydra makes the run folder and the training stack runs: one `error:` block, exit 2,
    no folder left behind."""
    import logging

    monkeypatch.setattr(logging.getLogger(), "handlers", [])  # not the handlers an earlier in-process Hydra run left
    argv = ["selector=entropy20", "selector.ratio=2", f"paths.log_dir={tmp_path}"]
    with pytest.raises(SystemExit) as stopped:
        _run_train_main(monkeypatch, capsys, argv, gpu=False)
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and "selector.ratio=2: must be a number in (0, 1]" in err
    assert "Traceback" not in err and not list(tmp_path.iterdir())
