"""The paper's references: `cite(...)` for the prose from paper/literature.yaml, and the entries
cited, in the order first cited. Torch-free."""

from __future__ import annotations

from pathlib import Path

import yaml

from memopt.errors import MemoptError


def citations(path: Path) -> tuple:
    """`cite("key", ...)` for the prose, "(Dao et al., 2022; Dao, 2023)" from paper/literature.yaml
    at `path`, and the list it fills with the cited entries ({"id", "cite", "text"}), in the
    order first cited: the References. A key the file lacks is an error naming the file."""
    literature = yaml.safe_load(path.read_text()) if path.exists() else {}
    cited: list[dict] = []

    def cite(*keys: str) -> str:
        for key in keys:
            if key not in literature:
                has = f"it has: {', '.join(literature)}" if literature else "the file is missing"
                raise MemoptError(f"{path}: no entry {key!r} for the paper's cite(); {has}")
            if all(c["id"] != key for c in cited):
                cited.append({"id": key, **literature[key]})
        return "(" + "; ".join(literature[k]["cite"] for k in keys) + ")"

    return cite, cited
