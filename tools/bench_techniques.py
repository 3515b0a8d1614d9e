"""Benchmark the default model's techniques on this GPU, one process per technique and batch.

    python tools/bench_techniques.py [--batch 16 64 max] [--only NAME ...] [--steps 50]
                                     [--warmup 20] [--cap 4096] [--out DIR]

Every technique runs through memopt.jobs.cell.run_cell (the same code as a workflow cell) on random
tokens with the default study's model (config.yaml), at each batch of --batch; `max` first
searches the technique's largest batch (memopt.jobs.search, capped at --cap) and runs the cell there.
One table: batch, step time, tokens/s, model TFLOP/s, MFU, peak allocated / reserved memory and
the kernel that ran. The table and the raw JSONs go to --out (default $OUT or ./bench). Floors
from issue 3 and the goals of issue 12 are checked at the end.
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
    "cudnn_compile": {"precision": "bf16", "attention": "cudnn", "compile": True},
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
    "cudnn_compiled_chunked": {
        "precision": "bf16",
        "attention": "cudnn",
        "compile": True,
        "loss": "chunked",
    },
    "compiled_budget": {
        "precision": "bf16",
        "attention": "flash",
        "compile": True,
        "compile_memory_budget": 0.5,
    },
    "flash_liger": {"precision": "bf16", "attention": "flash", "loss": "liger"},
    "flash_cce": {"precision": "bf16", "attention": "flash", "loss": "cce"},
    "compiled_liger": {"precision": "bf16", "attention": "cudnn", "compile": True, "loss": "liger"},
    "compiled_cce": {"precision": "bf16", "attention": "cudnn", "compile": True, "loss": "cce"},
    "fp16_flash": {"precision": "fp16", "attention": "flash"},
    "fp8_flash": {"precision": "fp8", "attention": "flash"},
    "fp8_compiled": {"precision": "fp8", "attention": "cudnn", "compile": True, "loss": "chunked"},
    "adamw8bit": {"precision": "bf16", "attention": "flash", "optimizer": "adamw8bit"},
    "adamw4bit": {"precision": "bf16", "attention": "flash", "optimizer": "adamw4bit"},
    "adafactor": {"precision": "bf16", "attention": "flash", "optimizer": "adafactor"},
    "flash_in_backward": {"precision": "bf16", "attention": "flash", "optimizer_in_backward": True},
    "flash_offload": {"precision": "bf16", "attention": "flash", "offload": "activations"},
    "flash_gradcp_chunked_offload": {
        "precision": "bf16",
        "attention": "flash",
        "checkpointing": "full",
        "loss": "chunked",
        "offload": "activations",
    },
    "flash_accum4": {"precision": "bf16", "attention": "flash", "grad_accum": 4},
}
# Issue 12's goals on an H100: the most frugal exact technique trains at least this many
# sequences; the fastest exact technique reaches this many model TFLOP/s at its best batch.
GOAL_SEQUENCES, GOAL_TFLOPS = 1400, 400.0
# Techniques that do not compute the default function (quality changes): not "exact".
INEXACT = ("fp16", "fp8", "adamw8bit", "adamw4bit", "adafactor")
# Issue 3's floors on an H100 at batch 16, in model TFLOP/s.
FLOORS = {"flash": 240.0, "flash_compile": 330.0, "baseline": 30.0}


def study(args, name: str | None = None) -> dict:
    """The default study's config with one technique (all of them without `name`)."""
    from memopt.config import load_config_file, validate_config

    cfg = load_config_file(ROOT / "config.yaml")
    cfg["device"] = "cuda"
    # A fixed number of timed steps (protocol v2 stops adaptively between min and max).
    cfg["measure"].update(
        warmup_steps=args.warmup, min_timed_steps=args.steps, max_timed_steps=args.steps
    )
    cfg["search"]["max_batch"] = getattr(args, "cap", 4096)
    techniques = TECHNIQUES if name is None else {name: TECHNIQUES[name]}
    cfg["techniques"] = techniques
    cfg["baseline"] = next(iter(techniques))
    if any(t.get("optimizer_in_backward") for t in techniques.values()):
        cfg["train"]["grad_clip"] = 0.0  # in-backward updates cannot clip globally
    return validate_config(cfg)


def random_tokens(directory: Path, vocab: int, n: int = 8_000_000) -> None:
    import numpy as np

    rng = np.random.default_rng(0)
    rng.integers(0, vocab, n).astype(np.uint16).tofile(directory / "train.bin")
    rng.integers(0, vocab, 200_000).astype(np.uint16).tofile(directory / "val.bin")
    meta = {"vocab_size": vocab, "dtype": "uint16", "train_tokens": n, "val_tokens": 200_000}
    (directory / "meta.json").write_text(json.dumps(meta))


def run_one(args) -> None:
    """Child process: one technique at one batch (`max`: searched first), JSON to --json."""
    from memopt.data.tokens import TokenData
    from memopt.fileio import write_json
    from memopt.jobs.cell import run_cell
    from memopt.jobs.search import search_max_batch
    from memopt.runtime.step import free_memory

    cfg, data = study(args, args.one), TokenData(args.tokens)
    search = None
    if args.entry == "max":
        search = search_max_batch(cfg, args.one, data, "cuda")
        free_memory("cuda")
        batch = search["max_batch"]
    else:
        batch = int(args.entry)
    res = run_cell(cfg, args.one, args.entry, batch, data, "cuda")
    res["search"] = search and {k: v for k, v in search.items() if k != "trials"}
    write_json(args.json, res)


def row(name: str, r: dict) -> str:
    batch = f"{r['batch_size']}" + (
        f" × {r['spec']['grad_accum']}" if r["spec"]["grad_accum"] > 1 else ""
    )
    if r["batch_entry"] == "max":
        batch += " (max" + (", capped)" if r["search"]["status"] == "capped" else ")")
    if r["status"] != "ok":
        return f"| {name} | {batch} | {r['kernel']} | OOM | | | | | |"
    t = r["step_time_ms"]
    mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "n/a"
    return (
        f"| {name} | {batch} | {r['kernel_detail']} | {t['mean']:.1f} ± {t['std']:.1f} | "
        f"{r['tokens_per_s']:,.0f} | {r['model_tflops']:.0f} | {mfu} | "
        f"{r['peak_allocated_mib']:,.0f} | {r['peak_reserved_mib']:,.0f} |"
    )


def goals(results: dict) -> list[str]:
    """Issue 12's goals, over the exact techniques that ran."""
    exact = {
        key: r
        for key, r in results.items()
        if r["status"] == "ok"
        and not any(r["spec"][k] in INEXACT for k in ("precision", "optimizer"))
    }
    lines = []
    if exact:
        # Sequences in memory at once: accumulating micro-batches would reach any number.
        key, r = max(exact.items(), key=lambda kv: kv[1]["batch_size"])
        lines.append(
            f"- largest exact batch: {key[0]} trains {r['batch_size']:,} sequences of "
            f"{r['seq_len']:,} tokens at once (goal >= {GOAL_SEQUENCES:,}): "
            + ("ok" if r["batch_size"] >= GOAL_SEQUENCES else "BELOW")
        )
        key, r = max(exact.items(), key=lambda kv: kv[1]["model_tflops"])
        lines.append(
            f"- fastest exact: {key[0]} at batch {r['batch_size']}: {r['model_tflops']:.0f} model "
            f"TFLOP/s (goal >= {GOAL_TFLOPS:.0f}): "
            + ("ok" if r["model_tflops"] >= GOAL_TFLOPS else "BELOW")
        )
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--batch", nargs="+", default=["16"], help="sequences per step, or max")
    p.add_argument("--steps", type=int, default=50, help="timed steps")
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--only", nargs="*", default=list(TECHNIQUES), choices=list(TECHNIQUES))
    p.add_argument("--cap", type=int, default=4096, help="the largest batch `max` searches")
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "bench")))
    p.add_argument("--one", help=argparse.SUPPRESS)
    p.add_argument("--tokens", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--json", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--entry", help=argparse.SUPPRESS)
    args = p.parse_args()
    for entry in args.batch:
        if entry != "max" and not (entry.isdigit() and int(entry) > 0):
            p.error(f"--batch: {entry!r} is not allowed; allowed: a positive integer or max")
    if args.one:
        return run_one(args)
    args.out.mkdir(parents=True, exist_ok=True)
    results = {}
    with tempfile.TemporaryDirectory() as tokens:
        random_tokens(Path(tokens), study(args)["tokenizer"]["vocab_size"])
        for name in args.only:
            for entry in args.batch:
                out = args.out / f"cell_{name}_{entry}.json"
                cmd = [sys.executable, __file__, "--one", name, "--entry", entry]
                cmd += ["--tokens", tokens, "--json", str(out), "--cap", str(args.cap)]
                cmd += ["--steps", str(args.steps), "--warmup", str(args.warmup)]
                proc = subprocess.run(cmd, capture_output=True, text=True)
                if proc.returncode != 0:
                    print(f"{name} at {entry}: FAILED\n{proc.stderr[-3000:]}", flush=True)
                    continue
                results[name, entry] = json.loads(out.read_text())
                print(row(name, results[name, entry]), flush=True)
    if not results:
        sys.exit("no technique ran")
    first = next(iter(results.values()))
    lines = [
        f"Default model (12 x 768, seq 1024, vocab 32,000), "
        f"{args.warmup} warm-up + {args.steps} timed steps, {first['device_name']}, "
        f"torch {first['provenance']['torch']}, CUDA {first['provenance']['cuda']}.",
        "",
        "| technique | batch | kernel | step ms (mean ± sd) | tokens/s | model TFLOP/s | MFU | "
        "peak alloc MiB | peak reserved MiB |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|",
        *(row(n, r) for (n, _), r in results.items()),
        "",
    ]
    at16 = {n: r for (n, e), r in results.items() if e == "16" and r["status"] == "ok"}
    for name, floor in FLOORS.items():
        if name in at16:
            got = at16[name]["model_tflops"]
            lines.append(
                f"- {name}: {got:.0f} model TFLOP/s (floor {floor:.0f}): "
                + ("ok" if got >= floor else "BELOW")
            )
    if "flash" in at16 and "baseline" in at16:
        ratio = at16["flash"]["peak_allocated_mib"] / at16["baseline"]["peak_allocated_mib"]
        lines.append(
            f"- flash peak allocated = {ratio:.2f} x baseline's (must be < 0.5): "
            + ("ok" if ratio < 0.5 else "ABOVE")
        )
    lines += goals(results)
    table = "\n".join(lines)
    (args.out / "bench.md").write_text(table + "\n")
    print("\n" + table)


if __name__ == "__main__":
    main()
