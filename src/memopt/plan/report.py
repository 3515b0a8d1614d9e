"""`memopt plan`: per technique of a study config, the predicted peak memory against the batch
and the largest batch on a GPU of a given memory, before any GPU runs (memopt.plan.memory).

Speed (tokens/s) is not predicted yet."""

from __future__ import annotations

import re

from memopt.errors import MemoptError
from memopt.plan.memory import MIB, largest_batch, unmodelled

# What a GPU of that name reports (nvidia-smi, MiB).
GPUS = {"H100-80GB": 81_559, "H200": 143_771}
# Not usable by PyTorch's allocator: the CUDA context and kernel modules. On the H100 what a
# search could use (free + its own cache) was 80,302-80,552 MiB of 81,559.
CONTEXT_MIB = 1_130
UNITS = {"gib": 1024.0, "gb": 1e9 / MIB, "mib": 1.0}


def gpu_memory_mib(text: str) -> float:
    """'24GiB', '40GB', '81559MiB' or a name of GPUS -> MiB; MemoptError otherwise."""
    if text in GPUS:
        return float(GPUS[text])
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(GiB|GB|MiB)\s*", text, flags=re.I)
    if not match or float(match[1]) <= 0:
        raise MemoptError(
            f"--gpu-memory: {text!r} is not allowed; allowed: a size such as 24GiB, 40GB or "
            f"81559MiB, or one of {', '.join(GPUS)}"
        )
    return float(match[1]) * UNITS[match[2].lower()]


def plan(cfg: dict, total_mib: float, vocab: int, host_mib: float | None = None) -> dict:
    """Per technique: the line, the largest batch and what limits it, or why none is predicted.

    The budget is what a search may use (memopt.jobs.search): the GPU's memory less the context,
    or search.memory_budget_gib where smaller, less search.headroom_mib and the allocator's
    slack. host_mib: the host's pinned-memory budget for offloaded techniques (None: not
    checked)."""
    search = cfg["search"]
    usable = total_mib - CONTEXT_MIB
    if search["memory_budget_gib"] is not None:
        usable = min(usable, search["memory_budget_gib"] * 1024)
    limit = usable - search["headroom_mib"] - search["allocator_slack_mib"]
    if limit <= 0:
        raise MemoptError(
            f"--gpu-memory: {total_mib:,.0f} MiB leaves nothing to train in after the context "
            f"({CONTEXT_MIB:,} MiB), search.headroom_mib and search.allocator_slack_mib"
        )
    model, rows = cfg["model"], []
    for name, spec in cfg["techniques"].items():
        row = {"technique": name, "missing": unmodelled(spec)}
        if not row["missing"]:
            best, bound, line = largest_batch(
                model, vocab, spec, limit, host_mib, search["max_batch"]
            )
            row.update(line=line, max_batch=best, tokens=best * model["seq_len"], bound=bound)
        rows.append(row)
    return {"limit_mib": limit, "total_mib": total_mib, "rows": rows}


def format_plan(result: dict, batch: int) -> str:
    lines = [
        f"GPU memory {result['total_mib']:,.0f} MiB; a trial's allocated peak may reach "
        f"{result['limit_mib']:,.0f} MiB (less the context, the headroom and the slack)",
        "",
        f"| technique | fixed MiB | MiB/sequence | peak at batch {batch} (MiB) | max batch | "
        "tokens | limit |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in result["rows"]:
        if r["missing"]:
            lines.append(f"| {r['technique']} | not predicted: no measured point for "
                         f"{'; '.join(r['missing'])} | | | | | |")  # fmt: skip
            continue
        line = r["line"]
        lines.append(
            f"| {r['technique']} | {line.fixed_mib:,.0f} | {line.per_sequence_mib:,.1f} | "
            f"{line.at(batch):,.0f} | {r['max_batch']:,} | {r['tokens']:,} | {r['bound']} |"
        )
    return "\n".join(lines)
