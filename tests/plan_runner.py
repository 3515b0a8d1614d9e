"""Many Snakemake dry runs of one study in one process (a dry run costs ~0.4 s here against ~3 s
for a fresh `snakemake -n`, most of it importing Snakemake): for tests/test_rebuild.py.

    python tests/plan_runner.py REQUESTS.json      (in the study's folder)

REQUESTS.json is a list of {"args": [...], "append": "src/memopt/x.py" or null}; each dry run
gets the args (the study's --cores, --resources and --configfile are added), with a comment
appended to the file for its duration. Prints one JSON list: the jobs each would run, per rule.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import sys
from pathlib import Path

STUDY = ["--cores", "2", "--resources", "gpu=1", "--configfile", "study.yaml"]


def parse_plan(text: str) -> dict[str, int]:
    """Jobs a dry run's output says it would run, per rule (empty when there is nothing to do)."""
    if "Nothing to be done" in text:
        return {}
    if "Job stats:" not in text:
        raise RuntimeError(f"not a dry run's output:\n{text[-3000:]}")
    table = text.split("Job stats:", 1)[1]
    jobs = dict(re.findall(r"^(\w+)\s+(\d+)\s*$", table, re.M))
    jobs.pop("total", None)
    return {k: int(v) for k, v in jobs.items()}


def dry_run(args: list[str]) -> dict[str, int]:
    from snakemake.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            main(["-n", *args, *STUDY])
        except SystemExit as end:
            if end.code not in (0, None):
                text = out.getvalue()[-3000:]
                raise RuntimeError(f"snakemake -n {args} failed:\n{text}") from None
    return parse_plan(out.getvalue())


def main() -> None:
    plans = []
    for request in json.loads(Path(sys.argv[1]).read_text()):
        path = Path(request["append"]) if request.get("append") else None
        saved = path.read_bytes() if path else None
        if path:
            path.write_bytes(saved + b"\n# edited\n")
        try:
            plans.append(dry_run(request["args"]))
        finally:
            if path:
                path.write_bytes(saved)
    print(json.dumps(plans))


if __name__ == "__main__":
    main()
