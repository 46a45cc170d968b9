"""logger=mlflow (configs/logger/mlflow.yaml, observe/mlflow_logger.py): metric names as the other loggers write them
as far as MLflow allows, the run's config as its parameters, and a tiny run writing both offline to a SQLite store
under the run folder, which MLflow's own client reads back (where MLflow is installed)."""

from __future__ import annotations

import re

import pytest
from lightning.pytorch.loggers import MLFlowLogger
from omegaconf import OmegaConf

from tests.conftest import compose_config
from tokenrl.observe.mlflow_logger import MLflowLogger, config_params, mlflow_name
from tokenrl.run.training import run

MLFLOW_NAMES = re.compile(r"[/\w.\- ]*")  # what MLflow accepts in a name (mlflow/utils/validation.py)


def test_metric_names_keep_pass_at_k_as_mlflow_allows(monkeypatch):
    """Lightning drops the `@` MLflow refuses (`val/pass@4` became `val/pass4`); the logger spells it `_at_`."""
    assert mlflow_name("val/pass@4") == "val/pass_at_4"
    assert mlflow_name("val/math500/pass@1") == "val/math500/pass_at_1"
    assert mlflow_name("train/reward") == "train/reward" and mlflow_name("a:b(c)") == "a_b_c_"
    passed = {}
    monkeypatch.setattr(MLFlowLogger, "log_metrics", lambda self, metrics, step=None: passed.update(metrics))
    MLflowLogger.log_metrics(object.__new__(MLflowLogger), {"val/pass@4": 0.5, "train/loss": 1.0}, step=3)
    assert passed == {"val/pass_at_4": 0.5, "train/loss": 1.0}


def test_the_parameters_are_the_resolved_config_one_per_setting():
    config = OmegaConf.to_container(compose_config(["selector=ict"], output_dir="/tmp/run"), resolve=True)
    params = config_params(config)
    assert params["algorithm.optimizer.lr"] == config["algorithm"]["optimizer"]["lr"]
    assert params["selector._target_"] == config["selector"]["_target_"] and params["selector_ratio"] == 0.1
    assert params["validation.ks"] == [1, 4] and params["paths.output_dir"] == "/tmp/run"
    assert all(MLFLOW_NAMES.fullmatch(name) for name in params) and len(params) > 100


def test_a_run_with_logger_mlflow_writes_the_metrics_mlflows_client_reads_back(tiny_cfg, tmp_path, monkeypatch):
    pytest.importorskip("mlflow", reason="logger=mlflow needs MLflow: pip install mlflow-skinny sqlalchemy alembic")
    from mlflow.tracking import MlflowClient

    monkeypatch.chdir(tmp_path)  # nothing lands in the working directory (mlflow's default: ./mlruns)
    cfg = tiny_cfg("total_steps=2", "logger=mlflow", "validation.every_n_steps=2", "validation.ks=[1]")
    summary = run(cfg)
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    experiment = client.get_experiment_by_name("train")  # task_name
    assert experiment.artifact_location.removeprefix("file://") == str(tmp_path / "mlartifacts")
    [found] = client.search_runs([experiment.experiment_id])
    assert found.info.status == "FINISHED"
    rewards = client.get_metric_history(found.info.run_id, "train/reward")
    assert [metric.step for metric in rewards] == [0, 1] and rewards[-1].value == summary["train/reward"]
    assert found.data.metrics["train/entropy"] == summary["train/entropy"]
    assert found.data.metrics["val/pass_at_1"] == summary["val/pass@1"]
    assert found.data.params["algorithm.group_size"] == str(cfg.algorithm.group_size)
    assert found.data.params["model.name"] == "tiny" and found.data.params["total_steps"] == "2"
    assert not (tmp_path / "mlruns").exists()
