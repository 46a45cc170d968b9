"""logger=mlflow (configs/logger/mlflow.yaml): a tiny run writes its metrics offline to a SQLite store under the run
folder, which MLflow's own client reads back."""

from __future__ import annotations

import pytest

from tokenrl.run.training import run

pytest.importorskip("mlflow", reason="logger=mlflow needs MLflow: pip install mlflow-skinny sqlalchemy alembic")


def test_a_run_with_logger_mlflow_writes_the_metrics_mlflows_client_reads_back(tiny_cfg, tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.chdir(tmp_path)  # nothing lands in the working directory (mlflow's default: ./mlruns)
    summary = run(tiny_cfg("total_steps=2", "logger=mlflow"))
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    experiment = client.get_experiment_by_name("train")  # task_name
    assert experiment.artifact_location.removeprefix("file://") == str(tmp_path / "mlartifacts")
    [found] = client.search_runs([experiment.experiment_id])
    assert found.info.status == "FINISHED"
    rewards = client.get_metric_history(found.info.run_id, "train/reward")
    assert [metric.step for metric in rewards] == [0, 1] and rewards[-1].value == summary["train/reward"]
    assert found.data.metrics["train/entropy"] == summary["train/entropy"]
    assert not (tmp_path / "mlruns").exists()
