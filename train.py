"""Root entry point: `python train.py selector=ict model=qwen1.5b` from the repository root."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "src"))

from tokenrl.cli.train import main  # noqa: E402  (light: the training stack loads once Hydra has a config)

if __name__ == "__main__":
    main()
