"""Atomic file writes: a crash never leaves a half-written file that Snakemake (or a reader)
would take for a complete result."""

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
    """Atomically write obj as indented UTF-8 JSON (key order kept: it is the order we wrote)."""
    write_text(path, json.dumps(obj, indent=2, ensure_ascii=False) + "\n")


def read_json(path: Path):
    """Read a JSON file; a missing or malformed file is a MemoptError naming the path."""
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise MemoptError(f"{path}: file not found") from None
    except json.JSONDecodeError as e:
        raise MemoptError(f"{path}: not valid JSON ({e})") from None
