"""One training run from a composed config: check it, build the policy, the data and the trainer, check the memory
plan, fit (resuming where asked), write the summary and export the policy. `cli/train.py` is its command line."""

from __future__ import annotations

import json
import logging
import os
import resource
import signal
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import torch
from hydra.utils import instantiate
from lightning.pytorch.loggers import CSVLogger
from omegaconf import DictConfig

from tokenrl.config.check import RunSettings, checked_settings
from tokenrl.data.datamodule import RolloutDataModule
from tokenrl.data.dataset_task import DatasetTask
from tokenrl.data.prompts import PromptFormatter
from tokenrl.export.hf_folder import export_run
from tokenrl.models import build_tokenizer
from tokenrl.observe.mlflow_logger import MLflowLogger, config_params
from tokenrl.records.settings import ModelSettings
from tokenrl.run.checkpointing import AtomicCheckpointIO, CheckpointWriteError, RunCheckpoint, remove_stale_temporaries
from tokenrl.run.devices import narrow_to_trainer_gpu
from tokenrl.run.memory_plan import MemoryPlan, architecture_shape, device_capacity_gib, memory_refusal, plan_memory
from tokenrl.run.module import GRPOModule
from tokenrl.run.module_spec import ModuleSpec
from tokenrl.run.preemption import Preempted, PreemptionWatch
from tokenrl.run.progress import ProgressLog, RolloutProgressBar
from tokenrl.run.resume import (
    RunComplete,
    RunConfigRecord,
    check_checkpoint_matches,
    check_resume_settings,
    kept_metric_rows,
    record_resume,
    resolve_checkpoint,
)
from tokenrl.utils import as_dict

log = logging.getLogger(__name__)
# checkpoints hold the state after step k's update, which is exactly what a resumed run continues from
warnings.filterwarnings("ignore", message="Using ModelCheckpoint with manual optimization")
# errors of the user's settings, files or disk: one line on the console, the traceback in train.log
USER_ERRORS = (ValueError, FileNotFoundError, PermissionError, CheckpointWriteError)


def build_components(
    cfg: DictConfig, settings: RunSettings | None = None
) -> tuple[GRPOModule, RolloutDataModule, L.Trainer]:
    """The module, data module and trainer that `cfg` describes, its setting nodes read as `settings` (None: read
    now, unchecked); the module and the data module share the task, the tokenizer and the prompt formatter."""
    settings = settings or RunSettings.of(cfg)
    tokenizer = build_tokenizer(settings.model)
    task = instantiate(cfg.task)
    first_round = "gen_prompts_per_step" if cfg.algorithm.filter_groups else "prompts_per_step"  # dynamic sampling
    datamodule = RolloutDataModule(
        task,
        prompts_per_step=cfg.algorithm[first_round],
        total_steps=cfg.total_steps,
        seed=cfg.seed,
        size_field=f"algorithm.{first_round}",
    )
    formatter = PromptFormatter(tokenizer, cfg.model.chat_template)
    datamodule.attach_formatter(formatter, cfg.rollout.max_prompt_length)
    module = GRPOModule(ModuleSpec.of(cfg, settings, task, tokenizer, formatter))
    return module, datamodule, build_trainer(cfg, module.preemption)


def build_trainer(cfg: DictConfig, preemption: PreemptionWatch) -> L.Trainer:
    """The Lightning trainer with the run's loggers and callbacks (progress, checkpoints, the preemption watch)."""
    loggers = [instantiate(node) for node in (cfg.logger or {}).values()]
    record = RunConfigRecord(as_dict(cfg, resolve=False))
    callbacks: list[L.Callback] = [ProgressLog(cfg.total_steps), preemption, record]
    if cfg.trainer.get("enable_progress_bar", True):
        callbacks.append(RolloutProgressBar(cfg.total_steps))
    saving = cfg.checkpoint
    if saving.enabled:
        folder = Path(cfg.paths.output_dir) / "checkpoints"
        callbacks.append(RunCheckpoint(folder, saving.every_n_steps, saving.monitor, saving.mode, saving.keep_last_k))
    # max_epochs=-1: the module stops the fit after one pass over the remaining prompt schedule (run/module.py)
    return instantiate(
        cfg.trainer,
        max_epochs=-1,
        logger=loggers or False,
        callbacks=callbacks,
        enable_checkpointing=bool(cfg.checkpoint.enabled),
        plugins=[AtomicCheckpointIO()],
    )


def check_memory(cfg: DictConfig, datamodule: RolloutDataModule, trainer: L.Trainer) -> MemoryPlan:
    """The memory plan of this run on its device (run/memory_plan.py), logged before the model loads; a run that cannot
    fit stops here with the table and what it can change (`memory_refusal`)."""
    datamodule.setup("fit")  # the prompts: the plan's prompt length is the longest one's
    device = str(trainer.strategy.root_device)
    container = as_dict(cfg)
    shape = architecture_shape(ModelSettings.of(container["model"]))
    longest = max(map(len, datamodule.train.prompt_ids))
    plan = plan_memory(container, shape, device, device_capacity_gib(device), prompt_tokens=longest)
    if not plan.fits():
        raise ValueError(memory_refusal(plan, container))  # the table once, in the error
    if trainer.is_global_zero:
        log.info(
            "memory plan per process (worst case: every response runs to rollout.max_new_tokens):\n%s", plan.table()
        )
    return plan


def data_rows(datamodule: RolloutDataModule, announce: bool) -> dict[str, int]:
    """Own data (task=dataset): how many rows the run trains on (those within rollout.max_prompt_length) and holds
    out, for summary.json, and in one log line where `announce`; {} for the other tasks."""
    task = datamodule.task
    if not isinstance(task, DatasetTask):
        return {}
    train, held_out = len(datamodule.train.problems), len(task.problems("test"))
    if announce:
        split = f"task.test_fraction={task.test_fraction} of its rows, task.split_seed={task.split_seed}"
        if task.test_split:
            split = f"task.test_split={task.test_split}"
        log.info("task.source=%s: training on %d rows, %d held out (%s)", task.source, train, held_out, split)
    return {"data_train_rows": train, "data_held_out_rows": held_out}


def peak_memory_gib(device: torch.device) -> dict[str, float]:
    """This process's peak resident host memory (ru_maxrss, KiB on Linux) and, on a GPU, PyTorch's peak allocation."""
    peaks = {"peak_host_memory_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}
    if device.type == "cuda":
        peaks["peak_gpu_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    return peaks


def run(cfg: DictConfig, overrides: list[str] | tuple[str, ...] = ()) -> dict[str, Any]:
    """Check the config and train; returns (and writes to summary.json) the final metrics and the mean reward of the
    first and last 5 rollout steps. `overrides`: the command line's, to find keys `+` added. A preemption signal ends it
    with SystemExit(128 + the signal's number) once last.ckpt is written."""
    narrow_to_trainer_gpu(cfg)  # first: CUDA reads CUDA_VISIBLE_DEVICES once, when it starts
    settings = checked_settings(cfg, overrides)
    for warning in settings.warnings:
        log.warning(warning)
    output_dir = Path(cfg.paths.output_dir)
    try:
        ckpt_path, steps_done = resolve_checkpoint(
            cfg.ckpt_path, output_dir, cfg.total_steps, bool(cfg.checkpoint.enabled)
        )
    except RunComplete as done:  # ckpt_path=auto in a finished run (a re-run sweep's finished job): nothing to do
        log.info("%s", done)
        return done.summary
    kept_rows = []
    if ckpt_path is not None:
        changed = check_resume_settings(ckpt_path, as_dict(cfg, resolve=False), steps_done, output_dir)
        check_checkpoint_matches(ckpt_path, settings.model)  # before any load
        remove_stale_temporaries(output_dir / "checkpoints")
        kept_rows = kept_metric_rows(output_dir / "csv" / "metrics.csv", steps_done)
        record_resume(output_dir, ckpt_path, steps_done, list(overrides), changed)
    L.seed_everything(cfg.seed, workers=True)
    if "CUDA_VISIBLE_DEVICES" in os.environ:
        log.info("CUDA_VISIBLE_DEVICES=%s", os.environ["CUDA_VISIBLE_DEVICES"])
    log.info(
        "loading the model (%s, init=%s), the tokenizer and the task's data",
        cfg.model.get("source", "?"),
        cfg.model.init,
    )
    module, datamodule, trainer = build_components(cfg, settings)
    plan = check_memory(cfg, datamodule, trainer)
    rows = data_rows(datamodule, announce=trainer.is_global_zero)
    for logger in trainer.loggers:
        if isinstance(logger, MLflowLogger):  # the run's settings as the MLflow run's parameters
            logger.log_hyperparams(config_params(as_dict(cfg)))
        if isinstance(logger, CSVLogger) and kept_rows:  # its first save rewrites metrics.csv: the kept rows first
            logger.experiment.metrics[:0] = kept_rows
    try:
        trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path)
    except Preempted as stop:
        saved = module.preemption.saved
        if trainer.is_global_zero:
            log.warning(
                "stopped by %s after %d of %d rollout steps; %s",
                signal.Signals(stop.signum).name,
                module.run_state.rollout_step,
                cfg.total_steps,
                f"resume with the same overrides and ckpt_path={saved}" if saved else "checkpointing was off",
            )
        raise SystemExit(128 + stop.signum) from None
    history = module.run_state.reward_history
    summary = {
        "rollout_steps": module.run_state.rollout_step,
        "optimizer_steps": module.run_state.optimizer_steps,
        "reward_first5": sum(history[:5]) / max(len(history[:5]), 1),
        "reward_last5": sum(history[-5:]) / max(len(history[-5:]), 1),
        **{k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith(("train/", "select/", "forks/"))},
        **{k: v for k, v in module.last_validation.items() if k.startswith("val/")},
        **peak_memory_gib(module.device),
        "memory_plan_peak_gib": plan.peak()[1],
        **rows,
    }
    if trainer.is_global_zero:
        output_dir.mkdir(parents=True, exist_ok=True)
        (output_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        log.info("run finished: %s", json.dumps(summary))
    export_run(cfg, module, trainer, summary)  # <run>/model/: the policy as a Hugging Face folder (every rank: FSDP)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()  # no rank leaves (closing its gloo pairs) while rank 0 still writes
        torch.distributed.destroy_process_group()  # a clean exit: no gloo/NCCL threads left at shutdown
    return summary
