"""Leave-one-out check of `memopt plan`'s predicted maxima against measured searches.

    python tools/plan_check.py [--study DIR ...] [--map-state TAR|DIR|none] [--out FILE]
                               [--summary FILE] [--figure PNG] [--write-points FILE]

Each study folder holds config.yaml and results/search/*.json (the published studies by
default); --map-state is a map study's saved state (studies/h100-map-pieces/state.tar.gz) or,
once published, its folder (studies/h100-map, the default then), read with config/map.yaml.
Every configuration is predicted from constants fitted on the others
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
from memopt.plan.calibrate import leave_one_out as memory_loo  # noqa: E402
from memopt.plan.calibrate import point  # noqa: E402
from memopt.plan.speed import leave_one_out, ratio, speed_point  # noqa: E402

STUDIES = ("h100-default", "h200-default", "h100-protocol-v2")
SPEED_STUDIES = (*STUDIES, "h200x2-parallel")  # its single-GPU cells
MAP_STATE = ROOT / "studies" / "h100-map-pieces" / "state.tar.gz"
MAP_STUDY = ROOT / "studies" / "h100-map"  # once published, read instead of the pieces' state


def _results(folder: Path, config: Path, label: str, kind: str, pattern: str):
    """(JSON, model, vocabulary, where) of each search or cell of a study or map state."""
    cfg = validate_config(yaml.safe_load(config.read_text()))
    models = {"": cfg["model"]} if not cfg["map"] else map_points(cfg)
    for name, model in models.items():
        where = folder / "results" / (kind if not name else f"map/{name}/{kind}")
        for path in sorted(where.glob(pattern)):
            label_ = f"{label}{'/' + name if name else ''}"
            yield json.loads(path.read_text()), model, cfg["tokenizer"]["vocab_size"], label_


def study_points(folder: Path, config: Path, label: str) -> list[dict]:
    out = []
    for search, model, vocab, where in _results(folder, config, label, "search", "*.json"):
        p = point(search, model, vocab)
        if p is not None:
            out.append({**p, "where": where})
    return out


def study_speed_points(folder: Path, config: Path, label: str) -> list[dict]:
    found = (speed_point(c, m, v, w) for c, m, v, w in _results(folder, config, label,
                                                                 "cells", "*/*.json"))  # fmt: skip
    # one point a cell: `same` and `max` at one batch are the same configuration twice
    return list({p["where"]: p for p in found if p is not None}.values())


def speed_errors(points: list[dict]) -> dict[str, list[tuple[float, str]]]:
    """Per GPU: the tokens/s rule's leave-one-out error of each configuration (the median over
    its cells of predicted / measured - 1, as memopt.plan.speed.band weighs them)."""
    by = {}
    for p, q in leave_one_out(points):
        by.setdefault(p["gpu"], {}).setdefault(p["config"], []).append(
            (1 / ratio(p, q) - 1, f"{p['where']} from {q['where']}"))  # fmt: skip
    return {gpu: [sorted(v)[len(v) // 2] for v in configs.values()] for gpu, configs in by.items()}


def speed_points(map_dir: Path | None) -> list[dict]:
    points = []
    for name in SPEED_STUDIES:
        folder = ROOT / "studies" / name
        points += study_speed_points(folder, folder / "config.yaml", name)
    if map_dir:
        points += study_speed_points(map_dir, ROOT / "config" / "map.yaml", "map")
    return points


def memory_table(points: list[dict], rows: list[dict]) -> str:
    lines = ["| where | technique | class | measured | predicted | error |",
             "|---|---|---|---:|---:|---:|"]  # fmt: skip
    for p, r in zip(points, rows):
        err = "capped" if r["status"] == "capped" else (
            "n/a" if r["error"] is None else f"{100 * r['error']:+.1f}%")  # fmt: skip
        lines.append(f"| {p['where']} | {r['technique']} | {r['kind']} | {r['measured']:,} | "
                     f"{r['predicted']:,} | {err} |")  # fmt: skip
    return "\n".join(lines)


def _stats(errors: list[tuple[float, str]]) -> str:
    """'| n | median |e| | worst (where) |' of (relative error, label) pairs."""
    worst = max(errors, key=lambda e: abs(e[0]))
    median = statistics.median(abs(e) for e, _ in errors)
    return f"| {len(errors)} | {100 * median:.1f}% | {100 * worst[0]:+.1f}% ({worst[1]}) |"


def summary(points: list[dict], rows: list[dict], speed: list[dict]) -> str:
    """The README's table: per group of studies, the maxima's and the peaks' leave-one-out errors;
    the tokens/s rule's over every single-GPU cell."""
    lines = ["| predicted | measured in | n | median abs. error | worst |",
             "|---|---|---:|---:|---|"]  # fmt: skip
    groups = {}
    for p, r in zip(points, rows):
        groups.setdefault("map" if p["where"].startswith("map") else "studies", []).append((p, r))
    names = {"studies": ", ".join(dict.fromkeys(p["where"] for p, _ in groups.get("studies", []))),
             "map": f"the map so far ({len({p['where'] for p, _ in groups.get('map', [])})} "
                    "points of config/map.yaml)"}  # fmt: skip
    for group, pairs in groups.items():
        maxima = [(r["error"], f"{p['where']} {r['technique']}: {r['predicted']:,} against "
                   f"{r['measured']:,}") for p, r in pairs
                  if r["status"] == "ok" and r["error"] is not None]  # fmt: skip
        peaks = [((pred - meas) / meas, f"{p['where']} {r['technique']} at {b:,}")
                 for p, r in pairs for b, meas, pred in r["peaks"]
                 if 2 * b >= r["measured"]]  # fmt: skip
        lines.append(f"| maximum batch | {names[group]} {_stats(maxima)}")
        lines.append(f"| peak at half the maximum or more | {names[group]} {_stats(peaks)}")
    for gpu, errors in speed_errors(speed).items():
        lines.append(f"| tokens/s, one per configuration | {gpu}: single-GPU cells "
                     f"{_stats(errors)}")  # fmt: skip
    return "\n".join(lines)


def figure(points, rows, speed, path: Path) -> None:
    """Leave-one-out residuals: the maxima's, the peaks', the tokens/s'."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    pairs = leave_one_out(speed)
    scored = [
        (p, r) for p, r in zip(points, rows) if r["status"] == "ok" and r["error"] is not None
    ]
    for ax, (title, xs, ys, labels) in zip(axes, (
        ("maximum batch", [r["measured"] for _, r in scored],
         [100 * r["error"] for _, r in scored], [p["where"] for p, _ in scored]),
        ("peak of a fitting trial", [m for _, r in zip(points, rows) for _, m, _ in r["peaks"]],
         [100 * (pr - m) / m for _, r in zip(points, rows) for _, m, pr in r["peaks"]],
         [p["where"] for p, r in zip(points, rows) for _ in r["peaks"]]),
        ("tokens/s", [p["tokens_per_s"] for p, _ in pairs],
         [100 * (1 / ratio(p, q) - 1) for p, q in pairs], [p["where"] for p, _ in pairs]),
    )):  # fmt: skip
        colors = ["tab:orange" if w.startswith("map") else "tab:blue" for w in labels]
        ax.scatter(xs, ys, s=14, c=colors)
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("measured" + (" (MiB)" if "peak" in title else ""))
    axes[0].set_ylabel("predicted - measured (% of measured)")
    fig.suptitle("memopt plan, leave-one-out (blue: GPT-2 studies, orange: the map)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=130)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--study", nargs="*", type=Path,
                    default=[ROOT / "studies" / s for s in STUDIES])  # fmt: skip
    ap.add_argument("--map-state", type=Path,
                    default=MAP_STUDY if (MAP_STUDY / "results" / "map").is_dir() else MAP_STATE,
                    help="a map study's saved state (.tar.gz) or published folder; 'none': "
                    "without the map")  # fmt: skip
    ap.add_argument("--out", type=Path, default=None, help="also write the table here")
    ap.add_argument(
        "--summary",
        type=Path,
        default=None,
        help="write the README's summary table here (with the map and tokens/s)",
    )
    ap.add_argument("--figure", type=Path, default=None, help="draw the residuals here (PNG)")
    ap.add_argument("--write-points", type=Path, default=None,
                    help="write the tokens/s points of the published studies and the map "
                    "state here and stop")  # fmt: skip
    args = ap.parse_args()
    map_state = None if str(args.map_state) == "none" else args.map_state
    with tempfile.TemporaryDirectory() as tmp:
        map_dir = None
        if map_state and map_state.is_dir():  # a published map study
            map_dir = map_state
        elif map_state:
            with tarfile.open(map_state) as tar:
                tar.extractall(tmp, filter="data")
            map_dir = Path(tmp)
        run(args, map_dir)


def run(args, map_dir: Path | None) -> None:
    # the tokens/s points, read once for --write-points, --summary and --figure
    speed = speed_points(map_dir) if args.write_points or args.summary or args.figure else None
    if args.write_points:
        args.write_points.write_text(json.dumps({"points": speed}, indent=1) + "\n")
        errors = speed_errors(speed)
        print(
            f"{args.write_points}: {len(speed)} tokens/s points; leave-one-out, per "
            f"configuration: " + "; ".join(f"{gpu} {_stats(e)}" for gpu, e in errors.items())
        )
        if not (args.out or args.summary or args.figure):  # else those too, in the same call
            return
    points = []
    for folder in args.study:
        points += study_points(folder, folder / "config.yaml", folder.name)
    if map_dir:
        points += study_points(map_dir, ROOT / "config" / "map.yaml", "map")
    rows = memory_loo(points)
    scored = [abs(r["error"]) for r in rows if r["status"] == "ok" and r["error"] is not None]
    worst = max(zip(scored, (r for r in rows if r["status"] == "ok" and r["error"] is not None)),
                key=lambda x: x[0])  # fmt: skip
    text = memory_table(points, rows) + (
        f"\n\n{len(scored)} proven maxima (of {len(rows)} searches): median absolute error "
        f"{100 * statistics.median(scored):.1f}%, worst {100 * worst[0]:.1f}% "
        f"({worst[1]['technique']}, {worst[1]['predicted']:,} against "
        f"{worst[1]['measured']:,})")  # fmt: skip
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    if args.summary:
        args.summary.write_text(summary(points, rows, speed) + "\n")
    if args.figure:
        figure(points, rows, speed, args.figure)


if __name__ == "__main__":
    main()
