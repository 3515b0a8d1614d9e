"""The synthetic study the unit tests share: cells, searches, quality and exactness runs of a
made-up study (`write_study`), and how a test renders its paper and reads its tables (`render`,
`md_table`). A helper module, not a test module; the session fixture `paper_study` (conftest.py)
holds one aggregated copy with its figures."""

import math
import shutil
from pathlib import Path

from memopt.report.figures import make_figures
from memopt.report.paper import render_paper
from memopt.report.results import aggregate, write_json
from memopt.report.verdicts import aggregate_quality
from memopt.runtime.functions import function_of

TEMPLATES = Path(__file__).resolve().parents[1] / "paper" / "templates"

# Not alphabetical, so the tests see that rows keep the techniques' input order.
TECHNIQUES = {
    "baseline": {"precision": "fp32", "attention": "math", "window": None, "checkpointing": "none"},
    "flash_gradcp": {
        "precision": "bf16",
        "attention": "flash",
        "window": None,
        "checkpointing": "full",
    },
    "local128": {"precision": "bf16", "attention": "flex", "window": 128, "checkpointing": "none"},
}
SAME_BATCH = 8
MAX_BATCH = {"baseline": 8, "flash_gradcp": 64, "local128": 24}
OOM = {("flash_gradcp", "max")}  # the search's maximum did not survive the full run


def make_cell(technique: str, entry: str, batch_size: int, status: str = "ok") -> dict:
    """One cell JSON as the training step writes it, with distinct, awkward numbers per cell."""
    k = list(TECHNIQUES).index(technique) + 1 + (0.5 if entry == "max" else 0)
    ok = status == "ok"
    spec = {**TECHNIQUES[technique], "checkpoint_every": 2, "compile": False}
    step = {
        "mean": 101.234 * k,
        "median": 100.9 * k,
        "std": 3.456 * k,
        "p10": 98.0 * k,
        "p90": 104.5 * k,
        "ci95_half": 1.234 * k,
        "rel_ci95": 1.234 / 101.234,
    }
    return {
        "technique": technique,
        "batch_entry": entry,
        "batch_size": batch_size,
        "status": status,
        "spec": spec,
        "function": function_of(spec),
        "kernel": spec["attention"],
        "kernel_detail": spec["attention"] if ok else None,
        "device": "cuda",
        "device_name": "NVIDIA H100 80GB HBM3",
        "steps": 12,
        "warmup_steps": 2,
        "timed_steps": 10,
        "seq_len": 64,
        "tokens_per_step": batch_size * 64,
        "step_time_ms": step if ok else None,
        # local128 at its maximum warms up: its first steps are slow (memopt.report.steady flags it).
        "step_times_ms": [
            100.9
            * k
            * (1.4 if technique == "local128" and entry == "max" and i < 3 else 1 + 0.001 * (i % 5))
            for i in range(30)
        ]
        if ok
        else None,  # fmt: skip
        "timed_s": 1.01234 * k if ok else None,
        "warmup_s": 0.25 * k if ok else None,
        "allocator_events": (
            {
                "alloc_retries": 2 if technique == "local128" else 0,
                "ooms": 0,
                "device_allocs": 3,
                "device_frees": 1,
            }
            if ok
            else None
        ),
        "tokens_per_s": 12345.678 / k if ok else None,
        "model_tflops": 123.4 / k if ok else None,
        "mfu": 0.1248 / k if ok else None,
        "phase_memory": {
            f"{w}_{p}_mib": 1000.0 * k + i
            for i, (w, p) in enumerate(
                (w, p) for p in ("forward", "backward", "optimizer") for w in ("after", "peak")
            )
        }
        if ok
        else None,
        "memory_breakdown": {
            f"{n}_mib": 10.5 * k + i
            for i, n in enumerate(
                ("weights", "gradients", "optimizer_state", "activations", "logits", "logits_grad")
            )
        }
        if ok
        else None,
        "wall_s": 3.21 * k if ok else None,
        "peak_allocated_mib": 23456.789 / k if ok else None,
        "peak_reserved_mib": 24000.5 / k if ok else None,
        "loss_curve": [8.0 - 0.2 * i - 0.05 * k for i in range(12)] if ok else [],
        "error": None if ok else "CUDA out of memory. Tried to allocate 2.00 GiB",
        "provenance": {
            "torch": "2.5.1",
            "python": "3.11.2",
            "cuda": "12.4",
            "gpu": "H100",
            "git_commit": "abc123",
            "config_hash": "cfg_0001",
            "memopt": "0.1.0",
        },
    }


def make_search(technique: str) -> dict:
    top = MAX_BATCH[technique]
    trials = [
        {"batch": b, "fits": True, "peak_mib": 100.0 * b, "seconds": 0.5} for b in (1, 2, 4, 8)
    ]
    trials = [t for t in trials if t["batch"] <= top] + [
        {"batch": top, "fits": True, "peak_mib": 100.0 * top, "seconds": 0.5},
        {"batch": top * 2, "fits": False, "peak_mib": None, "seconds": 0.2},
    ]
    return {
        "technique": technique,
        "status": "ok",
        "max_batch": top,
        "cap": 1024,
        "budget_mib": 81559.0,
        "device": "cuda",
        "seconds": 4.25,
        "trials": trials,
    }


STATS = {
    "dataset": "eltec_pol_mini",
    "source": "mirror",
    "documents_in": 5,
    "train": {"documents": 4, "characters": 480_000, "words": 80_000},
    "val": {"documents": 1, "characters": 120_000, "words": 20_000},
    "license": "public domain texts; ELTeC encoding CC BY 4.0",
    "description": (
        "ELTeC-pol v1.0.0 (COST Action CA16204), DOI 10.5281/zenodo.4662725; "
        "100% Polish & more: powieści, zażółć"
    ),
}
META = {
    "vocab_size": 512,
    "dtype": "uint16",
    "eos_id": 1,
    "train_tokens": 160_000,
    "val_tokens": 40_000,
    "tokenizer_sha256": "f" * 64,
}
CONFIG = {
    "device": "cuda",
    "model": {
        "n_layers": 2,
        "d_model": 64,
        "n_heads": 4,
        "d_ff": 256,
        "seq_len": 64,
        "dropout": 0.1,
    },
    "train": {
        "lr": 0.0005,
        "warmup_steps": 2,
        "weight_decay": 0.1,
        "grad_clip": 1.0,
        "seed": 1234,
        "eval_sequences": 8,
        "eval_batch_size": 4,
    },
    "measure": {
        "warmup_steps": 2,
        "target_rel_ci": 0.01,
        "min_timed_steps": 10,
        "max_timed_steps": 100,
    },
    "quality": {"tokens": 40_960, "batch": 32, "seeds": 2, "margin": 0.02},
    "worker": {"enabled": True, "idle_s": 60},
    "exactness": {"steps": 5, "batch": 4, "tolerance": {"fp32": 0.01, "tf32": 0.02, "bf16": 0.05}},
    "search": {
        "memory_budget_gib": None,
        "max_batch": 1024,
        "trial_steps": 2,
        "granularity": 1,
        "strategy": "fit",
    },
    "baseline": "baseline",
    "batch_sizes": ["same", "max"],
    "techniques": {
        name: {k: v for k, v in spec.items() if v is not None} for name, spec in TECHNIQUES.items()
    },
}


SEEDS = (1234, 1235)
# Validation loss per function and seed: bf16's paired differences from fp32 (0.01, 0.02) have a
# 95% interval that holds 0 and reaches past the margin (inconclusive); the window's (0.20, 0.21)
# lies above 0 (worse).
QUALITY_LOSS = {"fp32": (5.40, 5.44), "bf16": (5.41, 5.46), "bf16_w128": (5.60, 5.65)}


def make_quality(function: str, seed: int) -> dict:
    loss = QUALITY_LOSS[function][SEEDS.index(seed)]
    precision, _, window = function.partition("_w")
    spec = {
        "precision": precision,
        "attention": "auto",
        "window": int(window) if window else None,
        "checkpointing": "none",
        "checkpoint_every": 2,
        "compile": False,
    }
    return {
        "function": function,
        "seed": seed,
        "status": "ok",
        "spec": spec,
        "kernel": "efficient" if precision == "fp32" else ("flex" if window else "cudnn"),
        "batch_size": 32,
        "tokens_per_step": 2048,
        "steps": 20,
        "tokens": 40_960,
        "loss_curve": [8.0 - 0.1 * i - (seed - 1234) * 0.01 for i in range(20)],
        "train_s": 2.5 + (seed - 1234),
        "eval_s": 0.1,
        "wall_s": 3.0,
        "val_loss": loss,
        "val_ppl": math.exp(loss),
        "error": None,
        "provenance": {"gpu": "H100", "gpu_uuid": "GPU-1", "host": "h", "git_commit": "abc123"},
    }


def make_exactness(technique: str) -> dict:
    # flash_gradcp is checked against nothing of its own function here: one member each, so each
    # technique is its own reference.
    return {
        "technique": technique,
        "function": function_of(TECHNIQUES[technique]),
        "batch_size": 4,
        "steps": 5,
        "losses": [7.0 - 0.1 * i for i in range(5)],
        "seconds": 0.5,
    }


def write_study(root: Path) -> dict:
    """Write a whole synthetic study under root; return its input paths (cells in config order,
    but `max` before `same`, so sorting entries is exercised)."""
    cells = []
    for technique in TECHNIQUES:
        for entry, batch in (("max", MAX_BATCH[technique]), ("same", SAME_BATCH)):
            status = "oom" if (technique, entry) in OOM else "ok"
            path = root / "results" / "cells" / technique / f"{entry}.json"
            write_json(path, make_cell(technique, entry, batch, status))
            cells.append(path)
    searches = []
    for technique in TECHNIQUES:
        path = root / "results" / "search" / f"{technique}.json"
        write_json(path, make_search(technique))
        searches.append(path)
    quality = []
    for function in QUALITY_LOSS:
        for seed in SEEDS:
            path = root / "results" / "quality" / function / f"{seed}.json"
            write_json(path, make_quality(function, seed))
            quality.append(path)
    aggregate_quality(quality, root / "results" / "quality.csv")
    exact = []
    for technique in TECHNIQUES:
        path = root / "results" / "exactness" / f"{technique}.json"
        write_json(path, make_exactness(technique))
        exact.append(path)
    write_json(root / "data" / "corpus" / "stats.json", STATS)
    write_json(root / "data" / "tokens" / "meta.json", META)
    return {
        "cells": cells,
        "searches": searches,
        "quality": quality,
        "quality_csv": root / "results" / "quality.csv",
        "exactness": exact,
        "stats": root / "data/corpus/stats.json",
        "meta": root / "data/tokens/meta.json",
        "summary": root / "results" / "summary.csv",
    }


def render(study, templates=TEMPLATES, name="paper", searches=None, **options):
    out_md, out_tex = (
        study["root"] / "paper" / f"{name}.md",
        study["root"] / "paper" / f"{name}.tex",
    )
    render_paper(
        study["summary"],
        study["searches"] if searches is None else searches,
        study["stats"],
        study["meta"],
        CONFIG,
        study["figures"],
        templates,
        out_md,
        out_tex,
        **{"quality_csv": study["quality_csv"], "exactness_paths": study["exactness"], **options},
    )
    return out_md, out_tex


def md_table(text: str, column: str) -> list[dict]:
    """Parse the Markdown table whose header row has this column into one dict per row."""
    lines = text.splitlines()
    start = next(
        i for i, line in enumerate(lines) if line.startswith("|") and f"| {column} |" in line
    )
    header = [h.strip() for h in lines[start].strip("|").split("|")]
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append(dict(zip(header, (c.strip() for c in line.strip("|").split(" | ")))))
    return rows


def render_cells(study, tmp_path, cells: list[dict], draw: bool = False):
    """Write these cell dicts, aggregate and render a paper from them (the study's searches and
    data; the study's figures unless `draw` draws them from these cells); return the .md and .tex
    paths."""
    paths = []
    for cell in cells:
        paths.append(tmp_path / "cells" / cell["technique"] / f"{cell['batch_entry']}.json")
        write_json(paths[-1], cell)
    aggregate(paths, tmp_path / "summary.csv")
    if draw:
        make_figures(tmp_path / "summary.csv", tmp_path / "paper" / "figures")
    else:  # the text does not depend on them (drawing takes seconds)
        shutil.copytree(study["figures"], tmp_path / "paper" / "figures")
    out_md, out_tex = tmp_path / "paper" / "paper.md", tmp_path / "paper" / "paper.tex"
    render_paper(
        tmp_path / "summary.csv",
        study["searches"],
        study["stats"],
        study["meta"],
        CONFIG,
        tmp_path / "paper" / "figures",
        TEMPLATES,
        out_md,
        out_tex,
    )
    return out_md, out_tex
