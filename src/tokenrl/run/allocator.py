"""Re-run the current command with tcmalloc preloaded (CPU steps faster and steadier than with glibc malloc: the
measurement is in docs/offline.md). Only when the library is installed; `TOKENRL_MALLOC=system` turns it off.
Deliberately free of heavy imports: it runs before torch is loaded."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

TCMALLOC = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"


def with_tcmalloc(environ: Mapping[str, str]) -> dict[str, str] | None:
    """`environ` with tcmalloc first in LD_PRELOAD; None where nothing is to change: it is preloaded already,
    `TOKENRL_MALLOC` turns it off, or the library is not installed."""
    preload = environ.get("LD_PRELOAD", "")
    if environ.get("TOKENRL_MALLOC", "tcmalloc") != "tcmalloc" or "tcmalloc" in preload or not os.path.exists(TCMALLOC):
        return None
    return {**environ, "LD_PRELOAD": f"{TCMALLOC} {preload}".strip()}


def reexec_with_tcmalloc() -> None:
    """This process again, with tcmalloc preloaded (`with_tcmalloc`); returns where nothing is to change."""
    environ = with_tcmalloc(os.environ)
    if environ is not None:
        os.execve(sys.executable, [sys.executable, *sys.argv], environ)
