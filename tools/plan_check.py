"""Leave-one-out check of `memopt plan`'s predicted maxima against measured searches.

    python tools/plan_check.py [--study DIR ...] [--map-state TAR] [--out FILE]

Each study folder holds config.yaml and results/search/*.json (the published studies by
default); --map-state is a map study's saved state (studies/h100-map-pieces/state.tar.gz, read
with config/map.yaml). Every configuration is predicted from constants fitted on the others
(memopt.plan.calibrate) at its own search's limit; capped searches are listed, not scored (their
maximum is a lower bound). Prints a Markdown table and the median and worst absolute errors.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tarfile
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from memopt.config import validate_config  # noqa: E402
from memopt.map_points import map_points  # noqa: E402
from memopt.plan.calibrate import leave_one_out, point  # noqa: E402

STUDIES = ("h100-default", "h200-default", "h100-protocol-v2")


def study_points(folder: Path, config: Path, label: str) -> list[dict]:
    cfg = validate_config(yaml.safe_load(config.read_text()))
    vocab = cfg["tokenizer"]["vocab_size"]
    models = {"": cfg["model"]} if not cfg["map"] else map_points(cfg)
    out = []
    for name, model in models.items():
        where = folder / "results" / ("search" if not name else f"map/{name}/search")
        for path in sorted(where.glob("*.json")):
            p = point(json.loads(path.read_text()), model, vocab)
            if p is not None:
                out.append({**p, "where": f"{label}{'/' + name if name else ''}"})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--study", nargs="*", type=Path,
                    default=[ROOT / "studies" / s for s in STUDIES])  # fmt: skip
    ap.add_argument("--map-state", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=None, help="also write the table here")
    args = ap.parse_args()
    points = []
    for folder in args.study:
        points += study_points(folder, folder / "config.yaml", folder.name)
    with tempfile.TemporaryDirectory() as tmp:
        if args.map_state:
            with tarfile.open(args.map_state) as tar:
                tar.extractall(tmp, filter="data")
            points += study_points(Path(tmp), ROOT / "config" / "map.yaml", "map")
    rows = leave_one_out(points)
    lines = ["| where | technique | class | measured | predicted | error |",
             "|---|---|---|---:|---:|---:|"]  # fmt: skip
    for p, r in zip(points, rows):
        err = "capped" if r["status"] == "capped" else (
            "n/a" if r["error"] is None else f"{100 * r['error']:+.1f}%")  # fmt: skip
        lines.append(f"| {p['where']} | {r['technique']} | {r['kind']} | {r['measured']:,} | "
                     f"{r['predicted']:,} | {err} |")  # fmt: skip
    scored = [abs(r["error"]) for r in rows if r["status"] == "ok" and r["error"] is not None]
    worst = max(zip(scored, (r for r in rows if r["status"] == "ok" and r["error"] is not None)),
                key=lambda x: x[0])  # fmt: skip
    lines += ["", f"{len(scored)} proven maxima (of {len(rows)} searches): median absolute error "
              f"{100 * statistics.median(scored):.1f}%, worst {100 * worst[0]:.1f}% "
              f"({worst[1]['technique']}, {worst[1]['predicted']:,} against "
              f"{worst[1]['measured']:,})"]  # fmt: skip
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
