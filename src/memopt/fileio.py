"""Atomic file writes: a crash never leaves a half-written file that Snakemake (or a reader)
would take for a complete result. JSON is strict both ways: a result never holds NaN or infinity
(JSON has none; Python would write them), and a file that does is refused by name on reading."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from memopt.errors import MemoptError


@contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """Yield a temporary path beside `path`; it replaces `path` only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Not mkstemp: its 0600 mode would stick to the output; the pid keeps parallel writers apart.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_text(path: Path, text: str) -> None:
    """Atomically write a UTF-8 text file (parents created)."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8", newline="")


def write_json(path: Path, obj) -> None:
    """Atomically write obj as indented UTF-8 JSON (key order kept: it is the order we wrote);
    a non-finite number is refused (a result records null where it has no number)."""
    try:
        text = json.dumps(obj, indent=2, ensure_ascii=False, allow_nan=False)
    except ValueError as err:
        raise MemoptError(f"refusing to write {path}: {err} (nan or inf in a result)") from None
    write_text(path, text + "\n")


def _no_constant(name: str):
    raise ValueError(f"a non-finite number ({name}), which JSON does not allow")


def ensure_writable(path: Path) -> None:
    """Fail now, not after the work, if `path` cannot be written (its folder is created)."""
    path = Path(path)
    probe = path.with_name(f".{path.name}.{os.getpid()}.probe")
    try:
        if path.is_dir():
            raise IsADirectoryError(21, "it is a folder")
        for parent in path.parents:  # mkdir would say "File exists" of a file on the way
            if parent.exists():
                if not parent.is_dir():
                    raise NotADirectoryError(20, f"{parent} is a file, not a folder")
                break
        path.parent.mkdir(parents=True, exist_ok=True)
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        probe.unlink()
    except OSError as err:
        raise MemoptError(f"cannot write {path}: {err.strerror or err}") from None


def read_json(path: Path):
    """Read a JSON file; a missing, malformed or non-finite one is a MemoptError naming it."""
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"), parse_constant=_no_constant)
    except FileNotFoundError:
        raise MemoptError(f"{path}: file not found") from None
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError is a ValueError
        raise MemoptError(
            f"{path}: not valid JSON ({e}); it is damaged or was edited: delete it and rerun, and "
            "the job that writes it runs again"
        ) from None
