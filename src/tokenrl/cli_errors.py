"""The entry points' contract for a user's error (docs/errors.md): one line on stderr starting `error:`, exit status
2, the traceback in the run's log file; and the messages several entry points share."""
from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Mapping, Sequence

log = logging.getLogger(__name__)
DEBUG_ENV = "TOKENRL_DEBUG"   # =1: the traceback of a user error on the console too


def report_user_error(err: BaseException) -> None:
    """One line on the console naming what to fix; the traceback in the run's log files (and on the console with
    TOKENRL_DEBUG=1)."""
    debug = os.environ.get(DEBUG_ENV) == "1"
    files = [h for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)]
    record = logging.LogRecord(log.name, logging.ERROR, __file__, 0, "%s", (err,), (type(err), err, err.__traceback__))
    for handler in files:
        handler.handle(record)
    where = f"in {files[0].baseFilename}; " if files else ""
    hint = "" if debug else f"\n(the traceback is {where}TOKENRL_DEBUG=1 prints it here)"
    print(f"error: {err}{hint}", file=sys.stderr)
    if debug:
        import traceback
        traceback.print_exception(err)


def checkpoint_mismatch(path: str | Path, saved: Mapping[str, Sequence[int]], built: Mapping[str, Sequence[int]],
                        fix: str, complete: bool = True) -> ValueError | None:
    """The error of a checkpoint whose weights' shapes (`saved`, by name) are not those of the model built here
    (`built`), or None when they are. `complete`: the checkpoint holds every weight, so one it lacks differs too (a
    LoRA checkpoint holds its adapters alone). `fix` ends the message."""
    names = sorted(set(saved) | (set(built) if complete else set()))
    differ = [name for name in names
              if name not in saved or name not in built or list(saved[name]) != list(built[name])]
    if not differ:
        return None

    def shape(value: Sequence[int] | None) -> str:
        return "absent" if value is None else str(list(value))
    first = differ[0]
    return ValueError(f"ckpt_path={path}: a checkpoint of another model ({len(differ)} of {len(names)} weights differ "
                      f"in shape, e.g. `{first}` {shape(saved.get(first))} in the checkpoint vs "
                      f"{shape(built.get(first))} here): {fix}")
