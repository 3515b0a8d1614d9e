"""Secrets never leave in an output: the user:password part of a URL (a corpus mirror such as
https://user:token@host/speakleash/) is replaced by `***` in every message, log line, recorded
result and the paper's config. (A password is better kept out of the URL: requests reads
~/.netrc for the mirror's host.)"""

from __future__ import annotations

import re

# scheme://userinfo@ : up to the last @ before the path (a password may hold an unescaped @).
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s]*@")


def redact(value):
    """`value` with every URL's credentials replaced by ***: text, or the strings of a nested
    dict or list (a config)."""
    if isinstance(value, str):
        return _USERINFO.sub(r"\1***@", value)
    if isinstance(value, dict):
        return {k: redact(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact(v) for v in value]
    return value
