"""Read a speakleash dataset file (NAME.jsonl.zst: zstd-compressed JSON lines, each an object
with a `text` and an optional `meta`) record by record, with one clear error for each way a
download or a mirror can leave it broken: not zstd (e.g. a server's error page saved under the
file's name), cut off inside its compressed data, a line that is not JSON, a record without text.

speakleash's own reader (lm_dataformat) raises a bare zstd, JSON or KeyError for these, and reads
a truncated file as if it ended early without saying so.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import zstandard

CHUNK = 1 << 20


class BrokenFile(Exception):
    """The file cannot be read as a speakleash dataset: where (e.g. `line 12`) and what."""

    def __init__(self, where: str, what: str):
        super().__init__(f"{where}: {what}")
        self.where, self.what = where, what


def _lines(path: Path) -> Iterator[bytes]:
    """The decompressed lines (without their newline), across zstd frames."""
    pending, dobj, fed = b"", zstandard.ZstdDecompressor().decompressobj(), False
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            while chunk:
                try:
                    out = dobj.decompress(chunk)
                except zstandard.ZstdError as err:
                    where = "its start" if not fed else "its compressed data"
                    raise BrokenFile(
                        where, f"not zstd-compressed data, or corrupt ({err})"
                    ) from None
                fed = True
                chunk = b""
                if dobj.eof:  # a frame ended: what follows is the next frame
                    chunk, dobj, fed = dobj.unused_data, zstandard.ZstdDecompressor().decompressobj(), False  # fmt: skip
                *lines, pending = (pending + out).split(b"\n")
                yield from lines
    if fed:  # bytes of a frame that never ended
        raise BrokenFile(
            "its end", "the compressed data stops inside a frame: the file is truncated"
        )
    if pending.strip():
        yield pending


def records(path: Path) -> Iterator[tuple[str, dict]]:
    """(text, meta) per line, as speakleash's reader gives them (a list of paragraphs joined by a
    blank line; no meta: {}); BrokenFile names the line."""
    n = 0
    for n, raw in enumerate(_lines(Path(path)), 1):
        if not raw.strip():
            continue
        try:
            ob = json.loads(raw)
        except UnicodeDecodeError as err:
            raise BrokenFile(f"line {n}", f"not UTF-8 text ({err.reason})") from None
        except json.JSONDecodeError as err:
            raise BrokenFile(f"line {n}", f"not JSON ({err.msg}): {raw[:60]!r}") from None
        if not isinstance(ob, dict):
            raise BrokenFile(f"line {n}", f"a JSON {type(ob).__name__}, not a record (an object)")
        if "text" not in ob:
            keys = ", ".join(sorted(ob)) or "none"
            raise BrokenFile(f"line {n}", f"a record without a `text` field (its fields: {keys})")
        text = ob["text"]
        if isinstance(text, list) and all(isinstance(p, str) for p in text):
            text = "\n\n".join(text)
        if not isinstance(text, str):
            raise BrokenFile(f"line {n}", f"`text` is a {type(text).__name__}, not a string")
        meta = ob.get("meta")
        yield text, meta if isinstance(meta, dict) else {}
