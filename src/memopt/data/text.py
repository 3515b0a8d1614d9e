"""A document's text as the corpus keeps it: one canonical form (NFC, no invisible characters,
single spaces, at most one blank line), cut at a break when a document is too long."""

from __future__ import annotations

import re
import unicodedata

# Invisible characters that only add noise to a tokenizer: soft hyphen, zero-width space, BOM.
_INVISIBLE_CHARS = "\u00ad\u200b\ufeff"
_INVISIBLE = re.compile(f"[{_INVISIBLE_CHARS}]")
_BREAK_CHARS = "\r\u2028\u2029\x85\v\f"
_LINE_BREAKS = re.compile(rf"\r\n|[{_BREAK_CHARS}]")
_ODD_SPACE = re.compile(r"[^\S\n ]")  # whitespace other than a newline or a space (tab, NBSP, ...)
_SPACES = re.compile(" {2,}")
_BLANK_LINES = re.compile(r"\n{3,}")


def normalize_text(text: str) -> str:
    """Canonical form of a document: NFC, no invisible characters, single spaces, <= 1 blank line.

    Each pass runs only where its characters occur (`in` is far cheaper than a regex scan): a
    novel-sized corpus is cleaned in a second rather than ten."""
    if any(c in text for c in _BREAK_CHARS):
        text = _LINE_BREAKS.sub("\n", text)
    if any(c in text for c in _INVISIBLE_CHARS):
        text = _INVISIBLE.sub("", text)
    if not unicodedata.is_normalized("NFC", text):
        text = unicodedata.normalize("NFC", text)
    text = _SPACES.sub(" ", _ODD_SPACE.sub(" ", text))  # any run of horizontal space: one space
    text = text.replace(" \n", "\n")  # (at most one space is left before a line break)
    if "\n\n\n" in text:
        text = _BLANK_LINES.sub("\n\n", text)
    return text.strip()


def truncate(text: str, max_chars: int) -> str:
    """Cut text to at most max_chars, at the last paragraph, line or word break when there is one."""
    head = text[:max_chars]
    for sep in ("\n\n", "\n", " "):
        cut = head.rfind(sep)
        if cut > 0:
            return head[:cut].rstrip()
    return head
