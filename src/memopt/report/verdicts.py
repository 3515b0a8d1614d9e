"""What the protocol's three kinds of job conclude, for the paper: the quality of each function
over its seeds (and its paired verdict against the reference's), the exactness check of each
technique against its function's reference, the throughput-optimal batch of each technique, and
how much of the study's job time was measurement. Torch-free."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pandas as pd

from memopt.errors import MemoptError
from memopt.fileio import read_json, write_text
from memopt.report.paired import paired_differences, paired_verdict
from memopt.runtime.functions import function_of, functions, quality_spec, reference_technique

QUALITY_COLUMNS = (
    "function seed status precision window kernel batch_size steps tokens train_s eval_s wall_s "
    "val_loss val_ppl final_train_loss error diverged_step provenance_gpu provenance_gpu_uuid provenance_host "
    "provenance_git_commit val_positions"
).split()


def read_quality(path: Path) -> dict:
    run = read_json(path)
    for key in ("function", "seed", "status", "spec", "loss_curve", "val_loss"):
        if key not in run:
            raise MemoptError(f"{path}: quality run JSON lacks required key '{key}'")
    return run


def quality_row(run: dict) -> dict:
    prov = run.get("provenance") or {}
    curve = run["loss_curve"] or []
    row = {k: run.get(k) for k in QUALITY_COLUMNS}
    row.update(precision=run["spec"]["precision"], window=run["spec"]["window"])
    row["final_train_loss"] = curve[-1] if curve else None
    for key in ("gpu", "gpu_uuid", "host", "git_commit"):
        row[f"provenance_{key}"] = prov.get(key)
    # loss by position bucket, as JSON in one column (runs from before it was recorded: empty)
    row["val_positions"] = json.dumps(run["val_positions"]) if run.get("val_positions") else None
    return row


def aggregate_quality(paths: list[Path], out_csv: Path) -> pd.DataFrame:
    """One row per quality run (function, seed) -> out_csv, in the order given."""
    frame = pd.DataFrame(
        [quality_row(read_quality(Path(p))) for p in paths], columns=QUALITY_COLUMNS
    )
    for col in ("seed", "window", "batch_size", "steps", "tokens", "diverged_step"):
        frame[col] = frame[col].astype("Int64")
    write_text(out_csv, frame.to_csv(index=False))
    return frame


def _spread(values: list[float]) -> dict:
    return {
        "n": len(values),
        "mean": statistics.fmean(values) if values else None,
        "sd": statistics.stdev(values) if len(values) > 1 else None,
        "min": min(values) if values else None,
        "max": max(values) if values else None,
    }


def quality_table(
    runs: list[dict], techniques: dict[str, dict], reference: str, margin: float = 0.02
) -> dict:
    """Per function: the techniques sharing it, the kernel its runs used, validation loss and
    perplexity over the seeds (mean, sd, range), and the comparison with the reference's function
    (the baseline's): paired by seed (memopt.report.paired), a 95% interval of the difference
    and a verdict against the equivalence margin (`quality.margin`, nats): equivalent, worse,
    better or inconclusive, with the minimum detectable difference of the seeds run."""
    by_function: dict[str, list[dict]] = {}
    for run in runs:
        by_function.setdefault(run["function"], []).append(run)
    ref_function = function_of(techniques[reference]) if reference in techniques else None
    rows = []
    for function, members in functions(techniques).items():
        done = [r for r in by_function.get(function, []) if r["status"] == "ok"]
        loss = _spread([r["val_loss"] for r in done])
        ppl = _spread([r["val_ppl"] for r in done])
        rows.append(
            {
                "function": function,
                "techniques": members,
                "kernel": ", ".join(sorted({r["kernel"] for r in done})) or None,
                "seeds": sorted(r["seed"] for r in done),
                # Runs that did not finish: out of memory, or diverged at a step.
                "failed": sorted(
                    (
                        {"seed": r["seed"], "status": r["status"], "step": r.get("diverged_step")}
                        for r in by_function.get(function, [])
                        if r["status"] != "ok"
                    ),
                    key=lambda f: f["seed"],
                ),
                "tokens": done[0]["tokens"] if done else None,
                "val_loss": loss,
                "val_ppl": ppl,
            }
        )
    for row in rows:
        row["diverged_seeds"] = [f["seed"] for f in row["failed"] if f["status"] == "diverged"]
        done = [r for r in by_function.get(row["function"], []) if r["status"] == "ok"]
        row["positions"] = _positions(done)
    for row in rows:  # a positive control (another learning rate): a known harm to detect;
        spec = quality_spec(techniques, row["function"])  # another block: another model
        row["control"] = spec.get("lr_scale", 1.0) != 1.0
        row["another_model"] = spec.get("block") is not None
    ref = next((r for r in rows if r["function"] == ref_function), None)
    for row in rows:
        row["delta_val_loss"] = row["verdict"] = row["paired"] = None
        row["position_deltas"] = []
        if row["diverged_seeds"]:  # its finite seeds alone would flatter it: no comparison
            row["verdict"] = "diverged (seed " + ", ".join(map(str, row["diverged_seeds"])) + ")"
            continue
        if ref is not None and ref["diverged_seeds"] and row is not ref:
            row["verdict"] = "n/a: the reference diverged"  # nothing fair to compare with
            continue
        if ref is None or row is ref or not row["val_loss"]["n"] or not ref["val_loss"]["n"]:
            continue
        diffs = paired_differences(runs, row["function"], ref_function)
        if not diffs:
            row["verdict"] = "n/a: no seed in common with the reference"
            continue
        row["paired"] = paired_verdict(diffs, margin)
        row["delta_val_loss"] = row["paired"]["mean"]
        row["verdict"] = row["paired"]["verdict"]
        if row["positions"] and ref["positions"]:
            row["position_deltas"] = _position_deltas(runs, row["function"], ref_function, margin)
    return {"reference_function": ref_function, "rows": rows, "margin": margin}


def _position_deltas(runs: list[dict], function: str, reference: str, margin: float) -> list:
    """Per position bucket, the paired difference from the reference (seed by seed) with its 95%
    interval: what a function gives up, or gains, at those positions."""

    def by_seed(f):
        return {r["seed"]: r["val_positions"] for r in runs
                if r["function"] == f and r["status"] == "ok" and r.get("val_positions")}  # fmt: skip

    mine, ref = by_seed(function), by_seed(reference)
    seeds = sorted(mine.keys() & ref.keys())
    if not seeds:
        return []
    return [
        {"first": b["first"], "last": b["last"],
         **paired_verdict([mine[s][i]["loss"] - ref[s][i]["loss"] for s in seeds], margin)}
        for i, b in enumerate(ref[seeds[0]])
    ]  # fmt: skip


def _positions(runs: list[dict]) -> list[dict] | None:
    """Loss by position bucket over a function's seeds: per bucket the mean of the runs' losses
    and the mean of their standard errors (over sequences); None unless every run recorded it."""
    recorded = [r.get("val_positions") for r in runs]
    if not recorded or not all(recorded):
        return None
    out = []
    for i, bucket in enumerate(recorded[0]):
        ses = [p[i]["se"] for p in recorded if p[i]["se"] is not None]
        out.append({"first": bucket["first"], "last": bucket["last"],
                    "loss": statistics.fmean(p[i]["loss"] for p in recorded),
                    "se": statistics.fmean(ses) if ses else None})  # fmt: skip
    return out


def _diff(a: float | None, b: float | None, signed: bool = False) -> float:
    """a - b (or |a - b|) of two exactness losses; a non-finite one (null in the JSON) gives
    inf (NaN signed), so the comparison fails."""
    if a is None or b is None:
        return math.nan if signed else math.inf
    return a - b if signed else abs(a - b)


# How each exactness.floor reruns a function's reference (the paper's words).
FLOOR_HOW = {
    "kernel": "a second exact attention kernel",
    "compile": "the model under torch.compile",
}
# The smallest tolerance a measured floor gives: float32's resolution at a loss of ~10 nats.
FLOOR_MIN = 1e-6


def noise_floor(record: dict | None) -> float | None:
    """A reference's noise floor (exactness.floor kernel or compile): the largest per-step
    difference between its exactness run and its floor run; None where it has none."""
    floor = (record or {}).get("floor") or {}
    if not floor.get("losses") or len(floor["losses"]) != len(record["losses"]):
        return None
    largest = max(_diff(a, b) for a, b in zip(record["losses"], floor["losses"]))
    return largest if math.isfinite(largest) else None  # a diverged run measures no floor


def exactness(
    records: list[dict],
    techniques: dict[str, dict],
    tolerance: dict,
    floor_factor: float | None = None,
    floor_run: str = "kernel",
) -> dict:
    """Each technique's loss trajectory against its function's reference's (same batch, steps,
    initialization and batches): the largest per-step difference must be within the tolerance:
    with floor_factor, floor_factor times the reference's measured noise floor where it has one
    (exactness.floor: `floor_run`), else the tolerance of the precision. A technique that is its own
    reference is listed as such."""
    by_name = {r["technique"]: r for r in records}
    rows = []
    for name in techniques:
        if name not in by_name:
            continue
        ref = reference_technique(techniques, name)
        reference = by_name.get(ref)
        mine, theirs = by_name[name]["losses"], (reference or {}).get("losses")
        floor = noise_floor(reference) if floor_factor else None
        floor_record = (reference or {}).get("floor") or {}  # the reference's floor run
        tol = tolerance[techniques[name]["precision"]]
        if floor is not None:
            tol = max(floor_factor * floor, FLOOR_MIN)
        row = {
            "technique": name,
            "function": function_of(techniques[name]),
            "reference": ref,
            "tolerance": tol,
            "tolerance_from": "precision" if floor is None else "floor",
            "floor": floor,
            "floor_kernels": floor_record.get("kernel"),
            "floor_against": floor_record.get("against"),
            "floor_reason": floor_record.get("reason"),
            "steps": len(mine),
            "max_abs_diff": None,
            "final_diff": None,
        }
        if ref == name:
            row["ok"] = None  # the reference itself
        elif theirs is None or len(theirs) != len(mine):
            raise MemoptError(
                f"exactness: {name!r} is checked against {ref!r}, whose exactness run is missing "
                "or has another number of steps; rerun both searches"
            )
        else:
            diffs = [_diff(a, b) for a, b in zip(mine, theirs)]
            finite = all(math.isfinite(d) for d in diffs)
            row.update(
                max_abs_diff=max(diffs) if finite else math.inf,
                final_diff=_diff(mine[-1], theirs[-1], signed=True),
                ok=finite and max(diffs) <= tol,
            )
        rows.append(row)
    checked = [r for r in rows if r["ok"] is not None]
    first = next(iter(by_name.values()), None)
    return {
        "controls": _controls(rows, by_name, techniques),
        "rows": rows,
        "batch_size": first["batch_size"] if first else None,
        "steps": first["steps"] if first else None,
        "floor_factor": floor_factor,
        "floor_how": FLOOR_HOW.get(floor_run),
        "holds": all(r["ok"] for r in checked),
        "failed": [r["technique"] for r in checked if not r["ok"]],
    }


def _controls(rows: list[dict], by_name: dict, techniques: dict) -> list[dict]:
    """For scale: each function's reference against the first reference of another function in
    the same precision (same initialization and batches), within that one's tolerance (as if it
    claimed to be its function). Where such a pair stays within it, the check cannot tell another
    function from the same one at this length."""
    refs = [r for r in rows if r["ok"] is None]
    # the precision, and the block: another block's model starts from other weights
    precision = {r["technique"]: (techniques[r["technique"]]["precision"],
                                  techniques[r["technique"]].get("block")) for r in refs}  # fmt: skip
    out = []
    for i, r in enumerate(refs):
        other = next(
            (
                o
                for o in refs[:i]
                if o["function"] != r["function"]
                and precision[o["technique"]] == precision[r["technique"]]
            ),
            None,
        )
        if other is None:
            continue
        mine, theirs = by_name[r["technique"]]["losses"], by_name[other["technique"]]["losses"]
        if len(mine) != len(theirs):
            continue
        diff = max(_diff(a, b) for a, b in zip(mine, theirs))
        out.append(
            {"technique": r["technique"], "against": other["technique"], "max_abs_diff": diff,
             "tolerance": other["tolerance"], "within": diff <= other["tolerance"]}
        )  # fmt: skip
    return out


def throughput_optimal(cells: list[dict], searches: list[dict], seq_len: int) -> list[dict]:
    """Per technique, the batch with the highest tokens/s: among its timed cells, and among its
    search trials that fit (one synchronized step each: rougher). `best` is the overall one."""
    out = []
    for s in searches:
        name = s["technique"]
        ok = [c for c in cells if c["technique"] == name and c["status"] == "ok"]
        cell = max(ok, key=lambda c: c["tokens_per_s"], default=None)
        k = (s.get("spec") or {}).get("grad_accum", 1)  # a trial's step trains k micro-batches
        trials = [
            (t["batch"], t["batch"] * k * seq_len / (t["last_step_ms"] / 1e3))
            for t in s.get("trials", [])
            if t["fits"] and t.get("last_step_ms")
        ]
        trial = max(trials, key=lambda t: t[1], default=None)
        best = None
        if cell is not None:
            best = {
                "batch": cell["batch_size"],
                "tokens_per_s": cell["tokens_per_s"],
                "from": "cell",
            }
        if trial is not None and (best is None or trial[1] > best["tokens_per_s"]):
            best = {"batch": trial[0], "tokens_per_s": trial[1], "from": "search trial"}
        out.append(
            {
                "technique": name,
                "max_batch": s["max_batch"],
                "cell": None
                if cell is None
                else {
                    "batch": cell["batch_size"],
                    "entry": cell["batch_entry"],
                    "tokens_per_s": cell["tokens_per_s"],
                },
                "trial": None if trial is None else {"batch": trial[0], "tokens_per_s": trial[1]},
                "best": best,
            }
        )
    return out


def measurement_share(stages: dict, cells: list[dict], runs: list[dict]) -> dict | None:
    """How the study's job time splits: timed steps of the cells, training steps of the quality
    runs, and everything else (data, searches and exactness runs, process starts, warm-up,
    compilation, evaluation, the paper)."""
    total = stages.get("total_s")
    if not total:
        return None
    timed = math.fsum(
        c["timed_s"] for c in cells if c.get("timed_s") is not None and c.get("measured_as") is None
    )
    quality = math.fsum(r["train_s"] for r in runs if r.get("train_s") is not None)
    other = total - timed - quality
    return {
        "total_s": total,
        "timed_s": timed,
        "quality_s": quality,
        "other_s": other,
        "other_pct": 100 * other / total,
    }
