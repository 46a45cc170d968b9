"""Root entry point: `python eval.py model=... ckpt_path=... benchmark=[gsm8k,math500] eval.n_samples=8`."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "src"))

from tokenrl.run.allocator import reexec_with_tcmalloc  # noqa: E402

if __name__ == "__main__":
    reexec_with_tcmalloc()
    from tokenrl.cli.eval import main

    main()
