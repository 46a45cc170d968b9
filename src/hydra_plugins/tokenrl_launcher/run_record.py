"""`${tokenrl.run_record:<output dir>,<ckpt_path>}`: `hydra.output_subdir`, where Hydra writes the run's record
(config.yaml, hydra.yaml, overrides.yaml) as a job starts: `.hydra`, or null (none written) where the folder already
holds a record and this run continues that run (a resume: `tokenrl.run.resume.continues_run`), so the record stays
the first run's and a resume's own settings go to `.hydra/resume_history.yaml`. Hydra resolves it in the job, once
`hydra.runtime.output_dir` is set.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

RESOLVER = "tokenrl.run_record"
RECORD = ".hydra"


def run_record(output_dir: str, ckpt_path: str | None) -> str | None:
    """`.hydra`, or None where `output_dir` holds a record that this run continues."""
    from tokenrl.run.resume import continues_run  # torch: imported when a job starts, not by Hydra's plugin scan

    kept = (Path(output_dir) / RECORD / "config.yaml").is_file() and continues_run(ckpt_path, output_dir)
    return None if kept else RECORD


def register() -> None:
    """Make `${tokenrl.run_record:...}` resolvable (again: Hydra's plugin scan may execute this package twice)."""
    OmegaConf.register_new_resolver(RESOLVER, run_record, replace=True)
