"""run/resume.py: which checkpoint a run resumes from (a .ckpt file or a sharded checkpoint's folder; never one a save
left half-written), the run folder it continues in, and the metrics rows it keeps."""

from __future__ import annotations

import csv
import json
import shutil

import pytest
import torch
import yaml
from omegaconf import OmegaConf

from hydra_plugins.tokenrl_launcher.run_record import run_record
from tests.conftest import compose_config
from tests.helpers.forked_cli import forked_python
from tokenrl.config.command_line import run_dir_override
from tokenrl.run.checkpointing import AtomicFSDPStrategy
from tokenrl.run.resume import (
    RUN_CONFIG,
    RunComplete,
    changed_settings,
    check_resume_settings,
    checkpoint_step,
    continues_run,
    kept_metric_rows,
    resolve_checkpoint,
)


def write_checkpoint(path, step):
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"state_dict": {"w": torch.zeros(3)}, "tokenrl": {"rollout_step": step}}, path)
    return path


def test_checkpoint_step_reads_the_rollout_step(tmp_path):
    assert checkpoint_step(write_checkpoint(tmp_path / "a.ckpt", 4)) == 4
    torch.save({"state_dict": {}}, tmp_path / "other.ckpt")
    with pytest.raises(ValueError, match="not a tokenrl checkpoint"):
        checkpoint_step(tmp_path / "other.ckpt")


def test_resolve_checkpoint(tmp_path):
    run = tmp_path / "run"
    assert resolve_checkpoint(None, run, 6) == (None, 0)
    assert resolve_checkpoint("auto", run, 6) == (None, 0)  # nothing yet: a fresh start
    last = write_checkpoint(run / "checkpoints" / "last.ckpt", 2)
    assert resolve_checkpoint("auto", run, 6) == (str(last), 2)
    assert resolve_checkpoint(str(last), tmp_path / "elsewhere", 6) == (str(last), 2)
    with pytest.raises(FileNotFoundError, match=r"ckpt_path=/no/such.ckpt: no such file or folder"):
        resolve_checkpoint("/no/such.ckpt", run, 6)
    with pytest.raises(
        ValueError,
        match=r"holds 2 rollout steps and total_steps=2: nothing is left to train; set "
        r"total_steps above 2",
    ):
        resolve_checkpoint(str(last), run, 2)


def test_auto_on_a_finished_run_says_it_is_complete_and_an_explicit_path_stays_an_error(tmp_path):
    """`ckpt_path=auto` whose own last.ckpt holds total_steps (a finished job of a re-run sweep) raises RunComplete
    with the run's summary; the same checkpoint named explicitly is the user's mistake (ValueError)."""
    run = tmp_path / "run"
    last = write_checkpoint(run / "checkpoints" / "last.ckpt", 3)
    with pytest.raises(
        RunComplete,
        match=r"ckpt_path=auto: the run is already complete, nothing to train \(.*"
        r"last.ckpt holds 3 of total_steps=3 rollout steps; it stopped before "
        r"writing .*summary.json\)",
    ) as stopped:
        resolve_checkpoint("auto", run, 3)
    assert stopped.value.summary == {}
    (run / "summary.json").write_text(json.dumps({"rollout_steps": 3}))
    with pytest.raises(RunComplete, match=rf"its summary: {run / 'summary.json'}") as stopped:
        resolve_checkpoint("auto", run, 2)
    assert stopped.value.summary == {"rollout_steps": 3}
    with pytest.raises(ValueError, match="nothing is left to train"):
        resolve_checkpoint(str(last), run, 3)


def test_auto_needs_checkpoints_and_skips_a_finished_job_whatever_they_are(tmp_path):
    """`ckpt_path=auto` with checkpoints off is refused (a requeued job would start again from step 0 over its folder);
    a finished job (its summary.json there) is complete whatever the checkpoints, unless its last.ckpt is left to
    extend (a larger total_steps)."""
    run = tmp_path / "run"
    with pytest.raises(ValueError, match=r"ckpt_path=auto with checkpoint.enabled=false: a requeued job would find no"):
        resolve_checkpoint("auto", run, 3, checkpoints=False)
    (run / "summary.json").parent.mkdir()
    (run / "summary.json").write_text(json.dumps({"rollout_steps": 3}))
    for checkpoints in (False, True):
        with pytest.raises(RunComplete, match=r"ckpt_path=auto: the run is already complete.*its summary") as done:
            resolve_checkpoint("auto", run, 3, checkpoints=checkpoints)
        assert done.value.summary == {"rollout_steps": 3}
    last = write_checkpoint(run / "checkpoints" / "last.ckpt", 3)
    with pytest.raises(RunComplete):
        resolve_checkpoint("auto", run, 3, checkpoints=False)
    assert resolve_checkpoint("auto", run, 6) == (str(last), 3)


def test_changed_settings_are_the_ones_that_change_training_resolved_here():
    """Free settings (paths, logging, total_steps, checkpoints, samples, validation, ...) may change; every other key is
    compared by its value, interpolations resolved on this machine (a value that moved to another key is no change),
    and a key one side lacks is a change."""
    saved = {
        "seed": 0,
        "total_steps": 3,
        "paths": {"output_dir": "/a"},
        "validation": {"every_n_steps": 10},
        "model": {"lr": 0.001, "source": "${paths.output_dir}/m"},
        "algorithm": {"optimizer": {"lr": "${model.lr}"}},
    }
    moved = {**saved, "model": {"source": "${paths.output_dir}/m"}, "algorithm": {"optimizer": {"lr": 0.001}}}
    assert changed_settings(saved, {**moved, "total_steps": 6, "paths": {"output_dir": "/b"}, "validation": {}}) == {
        "model.lr": "0.001 → (not set)"
    }
    changed = {**saved, "seed": 1, "algorithm": {"optimizer": {"lr": 0.5}}, "trainer": {"precision": "bf16-mixed"}}
    assert changed_settings(saved, changed) == {
        "seed": "0 → 1",
        "algorithm.optimizer.lr": "0.001 → 0.5",
        "trainer.precision": "(not set) → bf16-mixed",
    }


def test_check_resume_settings_refuses_a_change_unless_allowed(tmp_path):
    config = OmegaConf.to_container(compose_config(["debug=default"]))
    path = tmp_path / "last.ckpt"
    torch.save({"tokenrl": {"rollout_step": 2}, RUN_CONFIG: config}, path)
    assert check_resume_settings(path, {**config, "total_steps": 9}, 2, tmp_path) == {}
    changed = {**config, "seed": 1, "ckpt_path": str(path)}
    with pytest.raises(
        ValueError,
        match=rf"^ckpt_path={path}: its run was trained with other settings \(seed: 0 → 1\); resume with those, or "
        rf"add resume.allow_changes=true to train on with these from step 3 \(recorded in "
        rf"{tmp_path}/.hydra/resume_history.yaml\)$",
    ):
        check_resume_settings(path, changed, 2, tmp_path)
    allowed = {**changed, "resume": {"allow_changes": True}}
    assert check_resume_settings(path, allowed, 2, tmp_path) == {"seed": "0 → 1"}
    older = write_checkpoint(tmp_path / "older.ckpt", 2)  # written before checkpoints held their config
    assert check_resume_settings(older, changed, 2, tmp_path) == {}


def test_a_resume_in_its_run_folder_leaves_the_record_to_the_first_run(tmp_path):
    """`hydra.output_subdir` (`${tokenrl.run_record:...}`): `.hydra` for a run that starts a folder, none for one that
    continues the run whose record is there (its own checkpoint, or `auto` where last.ckpt or summary.json is)."""
    run = tmp_path / "run"
    last = run / "checkpoints" / "last.ckpt"
    assert not continues_run(None, run) and not continues_run("auto", run) and not continues_run(str(last), tmp_path)
    write_checkpoint(last, 2)
    assert continues_run("auto", run) and continues_run(str(last), run)
    assert run_record(str(run), str(last)) == ".hydra"  # no record there yet: this run writes it
    (run / ".hydra").mkdir()
    (run / ".hydra" / "config.yaml").write_text("seed: 0\n")
    assert run_record(str(run), str(last)) is None and run_record(str(run), "auto") is None
    assert run_record(str(run), None) == ".hydra"  # a new run over the folder: its own record
    last.unlink()
    assert run_record(str(run), "auto") == ".hydra"  # nothing to resume: a fresh start
    (run / "summary.json").write_text("{}")
    assert run_record(str(run), "auto") is None  # a finished job, skipped


def write_sharded(path, step):
    AtomicFSDPStrategy(state_dict_type="sharded").save_checkpoint(
        {"state_dict": {"policy.w": torch.zeros(3)}, "tokenrl": {"rollout_step": step}}, path
    )
    return path


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_resolve_a_sharded_checkpoint_and_never_a_half_written_one(tmp_path):
    """The step comes from a sharded folder's meta.pt; a folder without it (a save cut short) is refused by name, and
    a save's temporary folder is never taken while the checkpoint it was replacing is complete."""
    run = tmp_path / "run"
    last = write_sharded(run / "checkpoints" / "last.ckpt", 3)
    assert checkpoint_step(last) == 3
    assert resolve_checkpoint("auto", run, 6) == (str(last), 3) == resolve_checkpoint(str(last), tmp_path, 6)
    partial = run / "checkpoints" / ".last.ckpt.k2x9.tmp"  # a later save killed before its meta.pt
    partial.mkdir()
    (partial / "__0_0.distcp").write_bytes(b"\0")
    assert resolve_checkpoint("auto", run, 6) == (str(last), 3)
    with pytest.raises(
        ValueError,
        match=r"ckpt_path=.*k2x9.tmp: a folder without meta.pt, so not a complete sharded "
        r"checkpoint \(a save that was cut short\?\)",
    ):
        resolve_checkpoint(str(partial), run, 6)


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_a_save_killed_while_swapping_its_folder_in_resumes_from_the_new_checkpoint(tmp_path):
    """Where folders cannot be exchanged in one step, the old last.ckpt is removed (meta.pt first) before the new one
    is renamed in: killed in between, `auto` and the explicit path take the complete new one."""
    checkpoints = tmp_path / "run" / "checkpoints"
    pending = write_sharded(checkpoints / ".last.ckpt.a1b2.tmp", 4)
    (checkpoints / "last.ckpt").mkdir()  # the old one, meta.pt already removed
    assert resolve_checkpoint("auto", tmp_path / "run", 6) == (str(pending), 4)
    (checkpoints / "last.ckpt").rmdir()
    assert resolve_checkpoint(str(checkpoints / "last.ckpt"), tmp_path, 6) == (str(pending), 4)


def test_run_dir_override_continues_in_the_checkpoints_run(tmp_path):
    run = tmp_path / "runs" / "t0"
    (run / ".hydra").mkdir(parents=True)
    last = write_checkpoint(run / "checkpoints" / "last.ckpt", 2)
    assert run_dir_override(["seed=1", f"ckpt_path={last}"]) == ["seed=1", f"ckpt_path={last}", f"hydra.run.dir={run}"]
    unchanged = [
        ["seed=1"],
        [f"ckpt_path={last}", "hydra.run.dir=/x"],
        ["-m", f"ckpt_path={last}"],
        ["ckpt_path=auto"],
        ["ckpt_path=null"],
    ]
    for argv in unchanged:
        assert run_dir_override(argv) == argv
    loose = write_checkpoint(tmp_path / "loose.ckpt", 2)  # not inside a run folder
    assert run_dir_override([f"ckpt_path={loose}"]) == [f"ckpt_path={loose}"]


def test_kept_metric_rows_drop_the_steps_the_resume_redoes(tmp_path):
    path = tmp_path / "metrics.csv"
    rows = [
        {"step": 0, "val/at_step": 0.0, "val/pass@1": 0.1},
        {"step": 0, "train/rollout_step": 1.0},
        {"step": 1, "train/rollout_step": 2.0},
        {"step": 2, "val/at_step": 2.0, "val/pass@1": 0.2},
        {"step": 2, "train/rollout_step": 3.0},
    ]
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=sorted({k for row in rows for k in row}))
        writer.writeheader()
        writer.writerows(rows)
    kept = kept_metric_rows(path, steps_done=2)
    assert kept == [
        {"step": "0", "val/at_step": "0.0", "val/pass@1": "0.1"},
        {"step": "0", "train/rollout_step": "1.0"},
        {"step": "1", "train/rollout_step": "2.0"},
    ]
    assert kept_metric_rows(tmp_path / "absent.csv", 2) == []


@pytest.mark.slow
def test_a_rerun_sweep_with_auto_skips_its_finished_jobs_and_finishes_the_others(tmp_path):
    """A 2-job sweep in the default sweep folder, each job in a fresh process (the default launcher): the folder is
    resolved once, both jobs land in it. Job 1's checkpoints and summary removed, as if it had been killed before its
    first save; the same sweep again with `ckpt_path=auto` in that folder (jobs in this process, to be quick: a job's
    end does not depend on the launcher): job 0 says it is complete and trains nothing, job 1 trains, exit status 0."""
    sweep = [
        "train.py",
        "-m",
        "debug=default",
        "seed=0,1",
        "total_steps=1",
        "checkpoint.enabled=true",
        "validation.every_n_steps=0",
        "samples.every_n_steps=0",
        "trainer.enable_progress_bar=false",
        f"paths.log_dir={tmp_path}",
    ]
    first = forked_python(sweep)
    assert first.returncode == 0, first.stderr[-3000:]
    [folder] = (tmp_path / "train" / "multiruns").iterdir()
    assert sorted(p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")) == ["0", "1"]
    shutil.rmtree(folder / "1" / "checkpoints")
    (folder / "1" / "summary.json").unlink()
    done = json.loads((folder / "0" / "summary.json").read_text())
    last = folder / "0" / "checkpoints" / "last.ckpt"
    saved = last.stat().st_mtime_ns

    again = forked_python([*sweep, "ckpt_path=auto", f"hydra.sweep.dir={folder}", "hydra/launcher=basic"])
    assert again.returncode == 0, again.stderr[-3000:]
    assert "ckpt_path=auto: the run is already complete" in (folder / "0" / "train.log").read_text()
    assert last.stat().st_mtime_ns == saved and json.loads((folder / "0" / "summary.json").read_text()) == done
    assert json.loads((folder / "1" / "summary.json").read_text())["rollout_steps"] == 1


@pytest.mark.slow
def test_a_resume_with_changed_settings_is_refused_unless_allowed_and_the_first_record_stays(tmp_path):
    """A 2-step run, then a resume at another learning rate: refused in one line naming the key, old → new, the run
    folder untouched; with resume.allow_changes=true it trains step 3 and appends the change to
    .hydra/resume_history.yaml, and the run's .hydra/config.yaml and overrides.yaml are still the first run's."""
    run = tmp_path / "run"
    common = ["train.py", "debug=default", "checkpoint.enabled=true", "validation.every_n_steps=0"]
    first = forked_python([*common, "total_steps=2", "trainer.enable_progress_bar=false", f"hydra.run.dir={run}"])
    assert first.returncode == 0, first.stderr[-3000:]
    record = {name: (run / ".hydra" / name).read_text() for name in ("config.yaml", "overrides.yaml")}
    resume = [*common, "total_steps=3", "algorithm.optimizer.lr=0.5", f"ckpt_path={run / 'checkpoints' / 'last.ckpt'}"]

    refused = forked_python(resume)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr[-3000:]
    [line] = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert "its run was trained with other settings (algorithm.optimizer.lr: 0.001 → 0.5); " in line
    assert not (run / ".hydra" / "resume_history.yaml").exists()

    allowed = forked_python([*resume, "resume.allow_changes=true"])
    assert allowed.returncode == 0, allowed.stderr[-3000:]
    assert json.loads((run / "summary.json").read_text())["rollout_steps"] == 3
    assert {name: (run / ".hydra" / name).read_text() for name in record} == record
    assert "algorithm.optimizer.lr=0.5" not in record["overrides.yaml"]
    [entry] = yaml.safe_load((run / ".hydra" / "resume_history.yaml").read_text())
    assert entry["from_step"] == 3 and entry["changed"] == {"algorithm.optimizer.lr": "0.001 → 0.5"}
    assert "algorithm.optimizer.lr=0.5" in entry["overrides"] and "resume.allow_changes=true" in entry["overrides"]


@pytest.mark.slow
def test_auto_skips_a_finished_run_without_checkpoints_and_keeps_its_record(tmp_path):
    """debug=default (checkpoints off): the run again with ckpt_path=auto says it is complete and trains nothing; its
    summary and record are the first run's."""
    run = tmp_path / "run"
    command = ["train.py", "debug=default", "total_steps=1", "validation.every_n_steps=0", f"hydra.run.dir={run}"]
    assert forked_python(command).returncode == 0
    kept = {path: path.read_bytes() for path in [run / "summary.json", *(run / ".hydra").iterdir()]}
    again = forked_python([*command, "ckpt_path=auto"])
    assert again.returncode == 0, again.stderr[-3000:]
    assert "ckpt_path=auto: the run is already complete" in (run / "train.log").read_text()
    assert {path: path.read_bytes() for path in kept} == kept
