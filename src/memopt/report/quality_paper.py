"""The paper of a study whose question is quality (config `paper.focus: quality`, e.g.
config/quality.yaml): rendered by render_paper from the same context as the default paper, but
led by the paired verdicts. Its templates are paper/templates/quality.{md,tex}.j2 and its prose
paper/templates/quality/; its tables are the default paper's quality, positions and exactness
tables (renumbered) and what the runs took; its figures the loss curves and loss by position.
The timing cells such a study runs (one per technique, for the pipeline's sake) are not its
question and are left out."""

from __future__ import annotations

import statistics
from dataclasses import replace

from memopt.report.paper_format import num
from memopt.report.tables import Table, table_numbers

SECTIONS = ("title", "abstract", "introduction", "method", "findings", "limitations", "conclusion")
FIGURES = ("loss", "positions")
# Its numbered tables in the order the paper shows them; those it has are numbered 1, 2, ...
ORDER = ("functions", "quality", "positions", "exactness", "cost")


def figure_names(ctx: dict) -> tuple[str, ...]:
    """The loss curves, and the loss by position where the runs recorded it."""
    return FIGURES if ctx["tables"].get("positions") else FIGURES[:1]


def quality_focus(config: dict) -> bool:
    return (config.get("paper") or {}).get("focus") == "quality"


def _cost(ctx: dict) -> tuple[list[dict], Table | None]:
    """Per function: its finished runs' mean training seconds and tokens/s (each run synchronized
    over its whole training), and the GPU-hours of all its runs (finished or not: training and
    evaluation, as each run's wall clock)."""
    by_function: dict[str, list[dict]] = {}
    for run in ctx["quality_runs"]:
        by_function.setdefault(run["function"], []).append(run)
    order = [r["function"] for r in ctx["quality"]["rows"]]
    rows = []
    for function in [f for f in order if f in by_function]:
        runs = by_function[function]
        done = [r for r in runs if r["status"] == "ok" and r.get("train_s")]
        rows.append({
            "function": function, "runs": len(runs), "finished": len(done),
            "train_s": statistics.fmean(r["train_s"] for r in done) if done else None,
            "tokens_per_s": statistics.fmean(r["tokens"] / r["train_s"] for r in done) if done else None,
            "gpu_hours": sum(r.get("wall_s") or 0 for r in runs) / 3600,
        })  # fmt: skip
    if not rows:
        return rows, None
    body = [[r["function"], f"{r['finished']} of {r['runs']}" if r["finished"] != r["runs"]
             else str(r["runs"]), num(r["train_s"], 0), num(r["tokens_per_s"], 0),
             num(r["gpu_hours"], 2)] for r in rows]  # fmt: skip
    caption = (
        "what the quality runs took: training seconds per finished run and training tokens per "
        "second (means over the finished seeds; each run\nsynchronized over its whole training, at "
        f"batch {ctx['config']['quality']['batch']}), and the GPU-hours of all its runs, "
        "evaluation included. The runs shared a machine with\nothers (one per GPU), so these are "
        "costs, not a comparison of speed."
    )
    columns = ["function", "runs", "train s per run", "tokens/s", "GPU-hours"]
    return rows, Table(columns, "lrrrr", body, caption, None, "cost")


def _gpus(ctx: dict) -> list[dict]:
    """The GPUs the quality runs ran on, with how many runs each: [{model, uuid, runs}]."""
    gpus: dict[str, dict] = {}
    for run in ctx["quality_runs"]:
        uuid = run.get("provenance_gpu_uuid") or ""
        g = gpus.setdefault(uuid, {"model": run.get("provenance_gpu"), "uuid": uuid, "runs": 0})
        g["runs"] += 1
    return sorted(gpus.values(), key=lambda g: -g["runs"])


def _positions(ctx: dict) -> dict:
    """The reference's loss by position (does the model use long context: the fall from the first
    bucket, and from the second-to-last to the last) and, per other function, the buckets where
    its paired difference is largest and smallest."""
    rows = [r for r in ctx["quality"]["rows"] if r.get("positions")]
    ref = next((r for r in rows if r["function"] == ctx["quality"]["reference_function"]), None)
    if ref is None or len(ref["positions"]) < 2:
        return {}
    p = ref["positions"]
    out = {"reference": p, "fall": p[0]["loss"] - p[-1]["loss"],
           "last_gain": p[-2]["loss"] - p[-1]["loss"], "functions": []}  # fmt: skip
    for r in rows:
        deltas = [d for d in r.get("position_deltas") or [] if d["lo"] is not None]
        if r is ref or not deltas:
            continue
        shown = [d for d in deltas if d["lo"] > 0 or d["hi"] < 0]  # the interval excludes 0
        big = max(deltas, key=lambda d: abs(d["mean"]))
        small = min(deltas, key=lambda d: abs(d["mean"]))
        out["functions"].append({"function": r["function"], "largest": big, "smallest": small,
                                 "shown": shown, "all": len(shown) == len(deltas)})  # fmt: skip
    return out


PRECISIONS = {
    "fp32": "FP32 (TF32 off)", "tf32": "TF32 matmuls", "bf16": "BF16 autocast, FP32 master weights",
    "fp16": "FP16 autocast, FP32 master weights, dynamic loss scaling",
    "fp8": "the blocks' linear layers in FP8 (torchao's float8 training), BF16 autocast",
}  # fmt: skip


def _changes(spec: dict, ref: dict) -> list[str]:
    """What a function's knobs change against the reference's, in words."""
    out = []
    if spec["precision"] != ref["precision"]:
        out.append(PRECISIONS.get(spec["precision"], spec["precision"]))
    if spec.get("window") != ref.get("window"):
        out.append(f"a sliding window of {spec['window']} tokens" if spec.get("window")
                   else "full attention")  # fmt: skip
    if spec.get("optimizer", "adamw") != ref.get("optimizer", "adamw"):
        out.append({"adamw8bit": "8-bit AdamW (torchao: both moments in 8 bits, blockwise)"}.get(
            spec["optimizer"], spec["optimizer"]))  # fmt: skip
    if spec.get("lr_scale", 1.0) != ref.get("lr_scale", 1.0):
        out.append(f"the learning rate × {spec['lr_scale']:g}")
    if spec.get("block") and spec.get("block") != ref.get("block"):
        out.append({"llama": "the Llama block (RMSNorm, rotary positions, a SwiGLU MLP, no "
                             "biases), from its own initial weights"}.get(spec["block"], spec["block"]))  # fmt: skip
    return out


def _functions(ctx: dict) -> list[dict]:
    """Each function with its techniques and what it changes against the reference's."""
    specs = ctx["config"]["techniques"]
    rows = ctx["quality"]["rows"]
    first = {r["function"]: specs[r["techniques"][0]] for r in rows if r["techniques"]}
    ref = first.get(ctx["quality"]["reference_function"])
    return [{"function": r["function"], "techniques": r["techniques"], "control": r["control"],
             "another_model": r["another_model"],
             "changes": _changes(first[r["function"]], ref) if ref else []}
            for r in rows if r["function"] in first]  # fmt: skip


def _functions_table(functions: list[dict], reference: str) -> Table:
    def what(f):
        if f["function"] == reference:
            return "the reference"
        notes = ["the positive control: a known harm"] * f["control"]
        notes += ["another model: judged, never recommended"] * f["another_model"]
        return "; ".join(f["changes"] or ["the reference's knobs"]) + "".join(
            f" ({n})" for n in notes
        )

    body = [[f"`{f['function']}`", ", ".join(f"`{t}`" for t in f["techniques"]), what(f)]
            for f in functions]  # fmt: skip
    caption = (f"the functions: what each computes differently from the reference `{reference}` "
               "(a function's techniques share its runs).")  # fmt: skip
    return Table(
        ["function", "techniques", "what it changes"],
        "lll",
        body,
        caption,
        1,
        "functions",
        colspec="llp{0.55\\linewidth}",
    )


def _control_twins(ctx: dict) -> list[dict]:
    """Each positive control against its one-knob twin (the function of the same knobs at the
    configured learning rate), paired seed by seed as the verdicts are: the harm the learning
    rate alone does, where the reference differs in more than it."""
    from memopt.report.paired import paired_differences, paired_verdict
    from memopt.runtime.functions import function_of

    specs = ctx["config"]["techniques"]
    runs = [r for r in ctx["quality_runs"] if r["status"] == "ok"]
    diverged = {r["function"] for r in ctx["quality_runs"] if r["status"] == "diverged"}
    out = []
    for r in ctx["quality"]["rows"]:
        if not r["control"] or not r["techniques"]:
            continue
        twin = function_of({**specs[r["techniques"][0]], "lr_scale": 1.0})
        diffs = paired_differences(runs, r["function"], twin)
        if twin != r["function"] and diffs and not {twin, r["function"]} & diverged:
            out.append({"function": r["function"], "twin": twin,
                        **paired_verdict(diffs, ctx["quality"]["margin"])})  # fmt: skip
    return out


def _family(ctx: dict) -> dict:
    """The verdicts again with a Bonferroni correction for the comparisons made (each interval at
    1 - 0.05 / m): the ones that change, a check on reading the per-comparison 95% verdicts as a
    family (m functions judged, one of them a false verdict by chance is not rare); and `narrow`,
    the better or worse verdict that stays but whose corrected interval comes within the margin
    of 0 (the nearest such), or None."""
    from memopt.report.paired import paired_differences, paired_verdict

    rows = [r for r in ctx["quality"]["rows"] if r["paired"] and r["paired"]["lo"] is not None]
    margin = ctx["quality"]["margin"]
    level = 1 - 0.05 / len(rows) if rows else None
    changed, kept = [], []
    for r in rows:
        diffs = paired_differences(
            ctx["quality_runs"], r["function"], ctx["quality"]["reference_function"]
        )
        v = paired_verdict(diffs, margin, level)
        nearest = min(abs(v["lo"]), abs(v["hi"]))  # the interval's end nearer 0
        if v["verdict"] != r["verdict"]:
            changed.append({"function": r["function"], "was": r["verdict"], **v})
        elif v["verdict"] in ("better", "worse") and nearest < margin:
            kept.append((nearest, {"function": r["function"], **v}))
    narrow = min(kept, key=lambda k: k[0])[1] if kept else None
    return {"m": len(rows), "level": level, "changed": changed, "narrow": narrow}


def quality_context(ctx: dict) -> dict:
    """What the quality paper adds to the default paper's context."""
    functions = _functions(ctx)
    tables = {name: ctx["tables"].get(name) for name in ("quality", "positions", "exactness")}
    cost, tables["cost"] = _cost(ctx)
    tables["functions"] = _functions_table(functions, ctx["quality"]["reference_function"])
    tn = table_numbers((name for name, t in tables.items() if t), ORDER)
    tables = {name: replace(t, number=tn[name]) if t else None for name, t in tables.items()}
    commits = sorted({r["provenance_git_commit"] for r in ctx["quality_runs"]
                      if r.get("provenance_git_commit")})  # fmt: skip
    return {"tables": tables, "tn": tn, "cost": cost, "runs_on": _gpus(ctx), "commits": commits,
            "by_position": _positions(ctx), "functions": functions,
            "control_twins": _control_twins(ctx), "family": _family(ctx)}  # fmt: skip
