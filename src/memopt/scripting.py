"""What every workflow script shares: the rule's log gets a copy of everything printed (progress
bars included), and a user error prints its message alone instead of a traceback."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

from memopt.errors import exit_on_user_error


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
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    with (
        open(log_path, "w", encoding="utf-8") as log,
        contextlib.redirect_stdout(_Tee(sys.stdout, log)),
        contextlib.redirect_stderr(_Tee(sys.stderr, log)),
        exit_on_user_error(),
    ):
        yield


def code_files(*modules: str) -> list[Path]:
    """Source files of library modules: a rule that lists them as inputs reruns when they change.

    Relative to the working directory, so the set of inputs Snakemake records does not change when
    the checkout moves (e.g. results carried to another machine)."""
    return [Path(os.path.relpath(Path(__file__).parent / f"{m}.py")) for m in modules]


def worker_settings(config: dict) -> dict:
    """The study's `worker` section with defaults. Read from the workflow's config, not passed as a
    rule parameter: how jobs are run must not rerun them."""
    from memopt.config import validate_config

    return validate_config(config)["worker"]
