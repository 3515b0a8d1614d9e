"""Benchmark the default model's techniques at one fixed batch on this GPU, one process each.

    python tools/bench_techniques.py [--batch 16] [--steps 50] [--warmup 20] [--out DIR]

Every technique runs through memopt.train.run_cell (the same code as a workflow cell) on random
tokens with the default study's model (config.yaml) and prints one table: step time, tokens/s,
model TFLOP/s, MFU, peak allocated / reserved memory, and the kernel that ran. The table and the
raw cell JSONs go to --out (default $OUT or ./bench). Floors from issue 3 are checked at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

TECHNIQUES = {
    "baseline": {"precision": "fp32", "attention": "math"},
    "tf32": {"precision": "tf32", "attention": "math"},
    "bf16": {"precision": "bf16", "attention": "math"},
    "flash": {"precision": "bf16", "attention": "flash"},
    "cudnn": {"precision": "bf16", "attention": "cudnn"},
    "local128": {"precision": "bf16", "attention": "flex", "window": 128},
    "local256": {"precision": "bf16", "attention": "flex", "window": 256},
    "gradcp": {"precision": "fp32", "attention": "math", "checkpointing": "full"},
    "flash_gradcp": {"precision": "bf16", "attention": "flash", "checkpointing": "full"},
    "flash_selective": {"precision": "bf16", "attention": "flash", "checkpointing": "selective"},
    "flash_compile": {"precision": "bf16", "attention": "flash", "compile": True},
    "flash_chunked": {"precision": "bf16", "attention": "flash", "loss": "chunked"},
    "flash_gradcp_chunked": {
        "precision": "bf16",
        "attention": "flash",
        "checkpointing": "full",
        "loss": "chunked",
    },
    "compiled_chunked": {
        "precision": "bf16",
        "attention": "flash",
        "compile": True,
        "loss": "chunked",
    },
}
# Issue 3's floors on an H100 at batch 16, in model TFLOP/s.
FLOORS = {"flash": 240.0, "flash_compile": 330.0, "baseline": 30.0}


def study(args) -> dict:
    from memopt.config import load_config_file, validate_config

    cfg = load_config_file(ROOT / "config.yaml")
    cfg["device"] = "cuda"
    # A fixed number of timed steps (protocol v2 stops adaptively between min and max).
    cfg["measure"].update(
        warmup_steps=args.warmup, min_timed_steps=args.steps, max_timed_steps=args.steps
    )
    cfg["techniques"] = TECHNIQUES
    return validate_config(cfg)


def random_tokens(directory: Path, vocab: int, n: int = 4_000_000) -> None:
    import numpy as np

    rng = np.random.default_rng(0)
    rng.integers(0, vocab, n).astype(np.uint16).tofile(directory / "train.bin")
    rng.integers(0, vocab, 200_000).astype(np.uint16).tofile(directory / "val.bin")
    meta = {"vocab_size": vocab, "dtype": "uint16"}
    (directory / "meta.json").write_text(json.dumps(meta))


def run_one(args) -> None:
    """Child process: one technique, one cell, JSON to --json."""
    from memopt.data import TokenData
    from memopt.fileio import write_json
    from memopt.train import run_cell

    res = run_cell(
        study(args), args.one, str(args.batch), args.batch, TokenData(args.tokens), "cuda"
    )
    write_json(args.json, res)


def row(name: str, r: dict) -> str:
    if r["status"] != "ok":
        return f"| {name} | {r['kernel']} | OOM | | | | | |"
    t = r["step_time_ms"]
    mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "n/a"
    return (
        f"| {name} | {r['kernel_detail']} | {t['mean']:.1f} ± {t['std']:.1f} | "
        f"{r['tokens_per_s']:,.0f} | {r['model_tflops']:.0f} | {mfu} | "
        f"{r['peak_allocated_mib']:,.0f} | {r['peak_reserved_mib']:,.0f} |"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=50, help="timed steps")
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--only", nargs="*", default=list(TECHNIQUES))
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "bench")))
    p.add_argument("--one", help=argparse.SUPPRESS)
    p.add_argument("--tokens", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--json", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        return run_one(args)
    args.out.mkdir(parents=True, exist_ok=True)
    results = {}
    with tempfile.TemporaryDirectory() as tokens:
        random_tokens(Path(tokens), study(args)["tokenizer"]["vocab_size"])
        for name in args.only:
            out = args.out / f"cell_{name}.json"
            cmd = [
                sys.executable,
                __file__,
                "--one",
                name,
                "--tokens",
                tokens,
                "--json",
                str(out),
                "--batch",
                str(args.batch),
                "--steps",
                str(args.steps),
                "--warmup",
                str(args.warmup),
            ]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                print(f"{name}: FAILED\n{proc.stderr[-3000:]}", flush=True)
                continue
            results[name] = json.loads(out.read_text())
            print(row(name, results[name]), flush=True)
    first = next(iter(results.values()))
    lines = [
        f"Default model (12 x 768, seq 1024, vocab 32,000), batch {args.batch}, "
        f"{args.warmup} warm-up + {args.steps} timed steps, {first['device_name']}, "
        f"torch {first['provenance']['torch']}, CUDA {first['provenance']['cuda']}.",
        "",
        "| technique | kernel | step ms (mean ± sd) | tokens/s | model TFLOP/s | MFU | "
        "peak alloc MiB | peak reserved MiB |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
        *(row(n, r) for n, r in results.items()),
        "",
    ]
    ok = lambda n: n in results and results[n]["status"] == "ok"  # noqa: E731
    for name, floor in FLOORS.items():
        if ok(name):
            got = results[name]["model_tflops"]
            lines.append(
                f"- {name}: {got:.0f} model TFLOP/s (floor {floor:.0f}): "
                + ("ok" if got >= floor else "BELOW")
            )
    if ok("flash") and ok("baseline"):
        ratio = results["flash"]["peak_allocated_mib"] / results["baseline"]["peak_allocated_mib"]
        lines.append(
            f"- flash peak allocated = {ratio:.2f} x baseline's (must be < 0.5): "
            + ("ok" if ratio < 0.5 else "ABOVE")
        )
    table = "\n".join(lines)
    (args.out / "bench.md").write_text(table + "\n")
    print("\n" + table)


if __name__ == "__main__":
    main()
