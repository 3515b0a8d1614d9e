"""Compare the batch-size search strategies on this GPU, and check answers independently.

    python tools/bench_search.py [--fit T ...] [--bisect T ...] [--check T ...] [--out DIR]

Each search runs in a fresh process (as a Snakemake job does) on the default study's model
(config.yaml, random tokens): `fit` (the default strategy) and `bisect` (doubling + bisection)
report the maximum batch, trials and seconds. `--check` retrains the found B and B + 1, each in
a process of its own, outside the search, under the same memory limit (the GPU less the
headroom) and the same test: B must fit, B + 1 must run out of memory or pass the allocator's
slack.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_techniques import ROOT, random_tokens

sys.path.insert(0, str(ROOT / "src"))


def study(strategy: str) -> dict:
    from memopt.config import load_config_file, validate_config

    cfg = load_config_file(ROOT / "config.yaml")
    cfg["device"] = "cuda"
    cfg["search"]["strategy"] = strategy
    return validate_config(cfg)


def child(args) -> None:
    """In a fresh process: one search (args.strategy) or one trial at args.batch."""
    from memopt.config import technique_spec
    from memopt.data.tokens import TokenData
    from memopt.fileio import write_json
    from memopt.jobs.pipeline import _setup
    from memopt.jobs.search import _trial, fit_limit_mib, limit_trials, search_max_batch

    cfg = study(args.strategy)
    device = _setup(cfg, None)  # the allocator settings every search and cell uses
    data = TokenData(args.tokens)
    if args.batch:
        spec = technique_spec(cfg, args.technique)
        avail = limit_trials(cfg, device)  # the memory a search's trial may use, as in the search
        limit = fit_limit_mib(cfg, device, avail)
        write_json(args.json, _trial(cfg, spec, data, args.batch, device, limit))
    else:
        write_json(args.json, search_max_batch(cfg, args.technique, data, device))


def spawn(tokens, out: Path, technique: str, strategy: str = "fit", batch: int = 0) -> dict:
    cmd = [
        sys.executable,
        __file__,
        "--child",
        "--tokens",
        tokens,
        "--json",
        str(out),
        "--technique",
        technique,
        "--strategy",
        strategy,
        "--batch",
        str(batch),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{technique} {strategy} {batch}: failed\n{proc.stderr[-3000:]}")
    return json.loads(out.read_text())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    default = list(study("fit")["techniques"])
    p.add_argument("--fit", nargs="*", default=default)
    p.add_argument("--bisect", nargs="*", default=["baseline", "flash", "local128"])
    p.add_argument("--check", nargs="*", default=["baseline", "flash"])
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "bench-search")))
    for name in ("--tokens", "--json", "--technique", "--strategy"):
        p.add_argument(name, help=argparse.SUPPRESS)
    p.add_argument("--batch", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args)
    args.out.mkdir(parents=True, exist_ok=True)
    lines = [
        "| technique | strategy | max batch | trials | seconds | predicted | fixed MiB | "
        "per-sample MiB | status |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    found = {}
    with tempfile.TemporaryDirectory() as tokens:
        random_tokens(Path(tokens), study("fit")["tokenizer"]["vocab_size"], n=20_000_000)
        for strategy, names in (("fit", args.fit), ("bisect", args.bisect)):
            for name in names:
                r = spawn(tokens, args.out / f"search_{strategy}_{name}.json", name, strategy)
                found.setdefault(name, r["max_batch"])
                fit = r["fit"] or {}
                lines.append(
                    f"| {name} | {strategy} | {r['max_batch']} | {len(r['trials'])} | "
                    f"{r['seconds']:.1f} | {r['predicted_batch']} | "
                    f"{fit.get('fixed_mib', float('nan')):,.0f} | "
                    f"{fit.get('per_sample_mib', float('nan')):,.1f} | {r['status']} |"
                )
                print(lines[-1], flush=True)
        lines.append("")
        for name in args.check:
            b = found[name]
            at_b = spawn(tokens, args.out / f"check_{name}_{b}.json", name, batch=b)
            above = spawn(tokens, args.out / f"check_{name}_{b + 1}.json", name, batch=b + 1)
            verdict = "ok" if at_b["fits"] and not above["fits"] else "WRONG"
            lines.append(
                f"- {name}: batch {b} fits={at_b['fits']} "
                f"(peak {at_b['peak_mib']:,.0f} MiB), batch {b + 1} "
                f"fits={above['fits']}: {verdict}"
            )
            print(lines[-1], flush=True)
    (args.out / "search.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
