"""`memopt plan`: per technique of a study config, the predicted peak memory against the batch
and the largest batch on a GPU of a given memory (memopt.plan.memory), and the tokens/s there
with an interval (memopt.plan.speed), before any GPU runs."""

from __future__ import annotations

import re

from memopt.errors import MemoptError
from memopt.plan import speed
from memopt.plan.memory import CALIBRATED, CALIBRATION, MIB, largest_batch, unmodelled

# What a GPU of that name reports (nvidia-smi, MiB), and the name its cells record.
GPUS = {"H100-80GB": 81_559, "H200": 143_771}
DEVICE_NAMES = {"H100-80GB": "NVIDIA H100 80GB HBM3", "H200": "NVIDIA H200"}
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


def memory_basis(line) -> str:
    """What a line's per-sequence term rests on beyond the counted bytes."""
    kind = line.kind
    return f"counted + fitted {CALIBRATED[kind]}" if kind in CALIBRATED else "counted"


def plan(cfg: dict, total_mib: float | None, vocab: int, host_mib: float | None = None,
         gpu: str = "H100-80GB", points: list | None = None) -> dict:  # fmt: skip
    """Per technique: the line, the largest batch and what limits it, the tokens/s there as the
    cells of `gpu` (a name of GPUS) imply (points: memopt.plan.speed's, the shipped ones when
    None), or why none is predicted.

    The budget is what a search may use (memopt.jobs.search): the GPU's memory less the context,
    or search.memory_budget_gib where smaller, less search.headroom_mib and the allocator's
    slack; total_mib None: a CPU search's, search.cpu_memory_budget_gib of tracked tensors (no
    tokens/s: no CPU cell is shipped). host_mib: the host's pinned-memory budget for offloaded
    techniques (None: not checked)."""
    search, device = cfg["search"], "cuda" if total_mib is not None else "cpu"
    if device == "cpu":
        if search["cpu_memory_budget_gib"] is None:
            raise MemoptError(
                "--cpu: search.cpu_memory_budget_gib is null in this config: a CPU search has no "
                "memory budget to predict against; set it (the smoke study's is 0.0625)"
            )
        limit = search["cpu_memory_budget_gib"] * 1024
    else:
        usable = total_mib - CONTEXT_MIB
        if search["memory_budget_gib"] is not None:
            usable = min(usable, search["memory_budget_gib"] * 1024)
        limit = usable - search["headroom_mib"] - search["allocator_slack_mib"]
    if limit <= 0:
        raise MemoptError(
            f"--gpu-memory: {total_mib:,.0f} MiB leaves nothing to train in after the context "
            f"({CONTEXT_MIB:,} MiB), search.headroom_mib and search.allocator_slack_mib"
        )
    points = (speed.load_points() if points is None else points) if device == "cuda" else []
    factors = speed.band(points, DEVICE_NAMES[gpu])
    model, rows = cfg["model"], []
    for name, spec in cfg["techniques"].items():
        row = {"technique": name, "missing": unmodelled(spec, device)}
        if not row["missing"]:
            best, bound, line = largest_batch(model, vocab, spec, limit, host_mib,
                                              search["max_batch"], CALIBRATION, device)  # fmt: skip
            pace = None if best < 1 else speed.predict(points, model, vocab, spec, best,
                                                       DEVICE_NAMES[gpu], factors)  # fmt: skip
            row.update(line=line, max_batch=best, tokens=best * model["seq_len"], bound=bound,
                       speed=pace)  # fmt: skip
        rows.append(row)
    return {"limit_mib": limit, "total_mib": total_mib, "rows": rows, "band": factors,
            "gpu": gpu if device == "cuda" else "CPU"}  # fmt: skip


def format_plan(result: dict, batch: int) -> str:
    gpu = result["gpu"] != "CPU"
    head = ("| technique | fixed MiB | MiB/sequence | peak at batch {batch} (MiB) | max batch | "
            "tokens | limit | memory from |").format(batch=batch)  # fmt: skip
    lines = [
        f"GPU memory {result['total_mib']:,.0f} MiB; a trial's allocated peak may reach "
        f"{result['limit_mib']:,.0f} MiB (less the context, the headroom and the slack)"
        if gpu else
        f"On a CPU: a trial's tracked tensors may reach {result['limit_mib']:,.1f} MiB "
        "(search.cpu_memory_budget_gib)",
        "",
        head + (f" tokens/s at the max ({result['gpu']}) | 80% interval | speed leans on |"
                if gpu else ""),
        "|---|---:|---:|---:|---:|---:|---|---|" + ("---:|---|---|" if gpu else ""),
    ]  # fmt: skip
    for r in result["rows"]:
        if r["missing"]:
            lines.append(f"| {r['technique']} | not predicted: no measured point for "
                         f"{'; '.join(r['missing'])} |" + " |" * (9 if gpu else 6))  # fmt: skip
            continue
        line, s = r["line"], r["speed"]
        pace = ("" if not gpu else " not one sequence fits | | |" if r["max_batch"] < 1 else
                " no measured cell of these knobs on this GPU | | |" if s is None else
                f" {s['tokens_per_s']:,.0f} | {_interval(s)} | {s['leans_on']} |")  # fmt: skip
        bound = r["bound"] if gpu or r["bound"] != "gpu" else "memory"
        lines.append(
            f"| {r['technique']} | {line.fixed_mib:,.1f} | {line.per_sequence_mib:,.2f} | "
            f"{line.at(batch):,.0f} | {r['max_batch']:,} | {r['tokens']:,} | {bound} | "
            f"{memory_basis(line)} |{pace}"
        )
    band = result["band"]
    if gpu:
        lines += ["", "tokens/s: this model's FLOPs a token against the model FLOP/s of the "
                  f"nearest measured cell with the same knobs on a {result['gpu']} "
                  "(memopt.plan.speed)" + (
                      f"; the interval: measured over predicted in 80% of the {band['n']} "
                      f"configurations checked leave-one-out on this GPU ({band['low']:.2f} to "
                      f"{band['high']:.2f} times), given where the prediction leans no farther "
                      "than those checks did (tools/plan_check.py)"
                      if band else "; no interval: too few configurations checked on this "
                      "GPU")]  # fmt: skip
    return "\n".join(lines)


def _interval(s: dict) -> str:
    return "n/a" if s["low"] is None else f"{s['low']:,.0f}-{s['high']:,.0f}"
