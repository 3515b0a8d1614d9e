"""What every workflow script shares: the rule's log gets a copy of everything printed (progress
bars included), a user error prints its message alone instead of a traceback, and the job stops
when the Snakemake process that started it dies (memopt.run.processes)."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

from memopt.errors import exit_on_user_error
from memopt.run.processes import stop_with_snakemake


class _Tee:
    def __init__(self, *streams):
        self.streams = streams

    def write(self, text):
        for s in self.streams:
            s.write(text)
        return len(text)

    def flush(self):
        for s in self.streams:
            s.flush()

    def isatty(self):
        return self.streams[0].isatty()


@contextlib.contextmanager
def logged(log_path: str | Path):
    stop_with_snakemake()
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    with (
        open(log_path, "w", encoding="utf-8") as log,
        contextlib.redirect_stdout(_Tee(sys.stdout, log)),
        contextlib.redirect_stderr(_Tee(sys.stderr, log)),
        exit_on_user_error(),
    ):
        yield
