"""`${tokenrl.run_record:<output dir>,<ckpt_path>}`: `hydra.output_subdir`, where Hydra writes the run's record as a job
starts: `.hydra`, or null (none written) where the folder holds a record and this run continues that run (a resume:
`tokenrl.run.resume.continues_run`), so the record stays the first run's (docs/running.md#resume-and-preemption).
"""

from __future__ import annotations

from pathlib import Path

RESOLVER = "tokenrl.run_record"
RECORD = ".hydra"


def run_record(output_dir: str, ckpt_path: str | None) -> str | None:
    """`.hydra`, or None where `output_dir` holds a record that this run continues."""
    from tokenrl.run.resume import continues_run  # torch: imported when a job starts, not by Hydra's plugin scan

    kept = (Path(output_dir) / RECORD / "config.yaml").is_file() and continues_run(ckpt_path, output_dir)
    return None if kept else RECORD
