"""`logger=mlflow`: Lightning's MLflow logger with the run's resolved config as its parameters and the metric names the
other loggers write. MLflow refuses `@` (mlflow/utils/validation.py), which Lightning drops (`val/pass4`); here it is
spelled `_at_`, as MLflow's own autologging spells it (`val/pass_at_4`)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from lightning.pytorch.loggers import MLFlowLogger

REFUSED = re.compile(r"[^\w/.\- ]")  # a character MLflow refuses in a metric or parameter name


def mlflow_name(name: str) -> str:
    """`name` as MLflow takes it: `@` spelled `_at_`, another character it refuses spelled `_`."""
    return REFUSED.sub("_", name.replace("@", "_at_"))


def config_params(config: Mapping[str, Any]) -> dict[str, Any]:
    """A resolved config flattened to MLflow parameters, one per setting, named as on the command line
    (`algorithm.optimizer.lr`); a list or an empty node is one value."""
    params: dict[str, Any] = {}
    for key, value in config.items():
        name = mlflow_name(str(key))
        if isinstance(value, Mapping) and value:
            params.update({f"{name}.{inner}": leaf for inner, leaf in config_params(value).items()})
        else:
            params[name] = value
    return params


class MLflowLogger(MLFlowLogger):
    """`MLFlowLogger` whose metric names keep `@` as `_at_`; the run logs `config_params` (run/training.py)."""

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        super().log_metrics({mlflow_name(name): value for name, value in metrics.items()}, step)
