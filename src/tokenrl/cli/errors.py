"""The entry points' contract for a user's error (docs/errors.md): one line on stderr starting `error:`, exit status
2, the traceback in the run's log file."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import NoReturn

log = logging.getLogger(__name__)
DEBUG_ENV = "TOKENRL_DEBUG"  # =1: the traceback of a user error on the console too


def report_user_error(err: BaseException) -> None:
    """One line on the console naming what to fix; the traceback in the run's log files, where there are any (and on
    the console with TOKENRL_DEBUG=1)."""
    debug = os.environ.get(DEBUG_ENV) == "1"
    files = [h for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)]
    record = logging.LogRecord(log.name, logging.ERROR, __file__, 0, "%s", (err,), (type(err), err, err.__traceback__))
    for handler in files:
        handler.handle(record)
    where = files[0].baseFilename if files else None
    hint = "" if debug or where is None else f"\n(the traceback is in {where}; TOKENRL_DEBUG=1 prints it here)"
    print(f"error: {err}{hint}", file=sys.stderr)
    if debug:
        import traceback

        traceback.print_exception(err)


class OneLineParser(argparse.ArgumentParser):
    """argparse's parser whose bad command line is one `error:` line and exit status 2, as every bad input is
    (docs/errors.md), not argparse's usage block."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {self.prog}: {message} ({self.prog} --help lists the options)\n")
