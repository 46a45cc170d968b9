"""Root entry point: `python train.py selector=ict model=qwen1.5b` from the repository root."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "src"))

from tokenrl.allocator import reexec_with_tcmalloc  # noqa: E402

if __name__ == "__main__":
    reexec_with_tcmalloc()
    from tokenrl.train import main

    main()
