"""Where the repository's Hydra configs live: one place for the entry points (`train`, `eval`) and scripts.

Importing it also sets `TOKENRL_ROOT` (unless set), which `configs/paths/default.yaml` reads as `paths.root_dir`.
"""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONFIG_DIR = str(ROOT / "configs")
os.environ.setdefault("TOKENRL_ROOT", str(ROOT))
