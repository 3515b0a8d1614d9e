"""Calibrate exactness.floor on this GPU: the default study's exactness runs with measured floors.

    python tools/bench_floor.py [--tokens data/tokens] [--only T ...] [--factors 1.5 2 3]
                                [--floor kernel|compile] [--out F]

Each technique (default: flash, compiled, local128 and, for FP32, baseline and tf32) trains its
exactness run (config.yaml: 50 steps at batch 8 from train.seed) on the study's tokens; each
function's reference also trains it with a second exact attention kernel (--floor kernel) or under
torch.compile (--floor compile): memopt.jobs.quality.add_floor. Printed: each function's floor, each technique's largest difference
from its reference, and the controls (the references of two functions in one precision), judged
at each factor: a factor that passes every same-function technique and fails every control tells
functions apart at this length. The records go to --out (JSON).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

DEFAULT = ["baseline", "tf32", "flash", "compiled", "local128"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", default="data/tokens")
    ap.add_argument("--only", nargs="+", default=DEFAULT)
    ap.add_argument("--factors", nargs="+", type=float, default=[1.5, 2.0, 3.0])
    ap.add_argument(
        "--floor",
        choices=["kernel", "compile"],
        default="kernel",
        help="how each reference reruns its function (exactness.floor)",
    )
    ap.add_argument("--out", default=None)
    ap.add_argument("--device", default=None, help="default: the config's (cuda)")
    ap.add_argument("--steps", type=int, default=None, help="default: exactness.steps (50)")
    args = ap.parse_args()

    from memopt.config import load_config_file, validate_config
    from memopt.data.tokens import TokenData
    from memopt.jobs.quality import add_floor, run_exactness
    from memopt.report.verdicts import exactness
    from memopt.runtime.functions import reference_technique
    from memopt.runtime.techniques import resolve_device

    cfg = load_config_file(ROOT / "config.yaml")
    cfg["techniques"] = {t: cfg["techniques"][t] for t in args.only}
    cfg["exactness"]["floor"] = args.floor
    cfg["device"] = args.device or cfg["device"]
    if args.steps:
        cfg["exactness"]["steps"] = args.steps
    cfg = validate_config(cfg)
    device = resolve_device(cfg["device"])
    data = TokenData(Path(args.tokens))
    records = []
    for name in cfg["techniques"]:
        record = run_exactness(cfg, name, data, device)
        if reference_technique(cfg["techniques"], name) == name:
            record = add_floor(cfg, record, data, device)
        records.append(record)
    if args.out:
        Path(args.out).write_text(json.dumps(records, indent=1))
    tol = cfg["exactness"]["tolerance"]
    for factor in args.factors:
        check = exactness(records, cfg["techniques"], tol, factor, args.floor)
        print(f"== floor_factor {factor}: holds {check['holds']}, failed {check['failed']}")
        for r in check["rows"]:
            if r["ok"] is None:
                print(
                    f"  {r['technique']:10s} reference; floor {r['floor']} ({r['floor_kernels']})"
                )
            else:
                print(f"  {r['technique']:10s} vs {r['reference']:10s} max {r['max_abs_diff']:.4f}"
                      f" tolerance {r['tolerance']:.4f} ({r['tolerance_from']}) ok {r['ok']}")  # fmt: skip
        for c in check["controls"]:
            print(f"  control {c['technique']} vs {c['against']}: {c['max_abs_diff']:.4f}"
                  f" tolerance {c['tolerance']:.4f} -> {'within' if c['within'] else 'told apart'}")  # fmt: skip


if __name__ == "__main__":
    main()
