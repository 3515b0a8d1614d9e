"""The paper's tables of effects (memopt.report.tables; built by memopt.report.paper_tables):
each cell against the baseline, single-knob changes, memory by kind, recommendations, and the
comparison with earlier reports (numbered as memopt.report.tables.table_numbers says)."""

from __future__ import annotations

from memopt.report.paper_format import num
from memopt.report.tables import Table, number


def _x(value) -> str:
    return f"{num(value, 2)}x"


def retry_cost(ctx: dict, technique: str) -> dict | None:
    """Where `technique`'s cell at the `same` batch retried cudaMalloc in its timed steps: the
    retries, and its search trial at that batch (one synchronized step in a fresh allocator) as
    the step without them: {retries, steps, batch, cell_ms, trial_ms, cost, share} (cost: the
    cell's mean step, which its tokens/s and so the ratios use, over the trial's, less 1; share:
    how much smaller every ratio over it would be against the trial, 0 when the cell is no
    slower). None without retries or without such a trial."""
    batch = ctx["findings"]["batch_size"]
    cell = next((c for c in ctx["cells"] if c["technique"] == technique and c["status"] == "ok"
                 and c["batch_size"] == batch and (c.get("allocator_alloc_retries") or 0) > 0),
                None)  # fmt: skip
    search = next((s for s in ctx["searches"] if s["technique"] == technique), None)
    trial = next((t for t in (search or {}).get("trials", [])
                  if t["batch"] == batch and t["fits"] and t.get("last_step_ms")), None)  # fmt: skip
    if cell is None or trial is None or not cell.get("step_time_ms_mean"):
        return None
    cost = cell["step_time_ms_mean"] / trial["last_step_ms"] - 1
    return {"retries": int(cell["allocator_alloc_retries"]), "steps": int(cell["timed_steps"]),
            "batch": batch, "cell_ms": cell["step_time_ms_mean"], "trial_ms": trial["last_step_ms"],
            "cost": cost, "share": max(0.0, 1 - 1 / (1 + cost))}  # fmt: skip


def _retry_sentence(ctx: dict, technique: str, what: str) -> str:
    r = retry_cost(ctx, technique)
    if r is None:
        return ""
    head = (
        f" `{technique}`'s cell retried cudaMalloc {r['retries']} times in its {r['steps']} timed "
        f"steps; its search trial at batch {r['batch']} (one step after one warm-up step, in a "
        f"fresh allocator) took {num(r['trial_ms'], 0)} ms against the cell's mean of "
        f"{num(r['cell_ms'], 0)}"
    )
    if r["cost"] <= 0:
        return (
            head + ": the cell is no slower than that one step, which shows no cost of the retries."
        )
    return (
        head
        + f": measured against that step, every {what} would be {num(100 * r['share'], 1)}% smaller."
    )


def _unstable(ctx: dict) -> dict:
    """{(technique, batch): speed-up over the baseline's same cell by median steps} for
    the unstable cells (memopt.report.steady.instability: the per-cell table's †), whose mean
    step time misleads."""

    def median_rate(c):
        return c["tokens_per_step"] / c["step_time_ms_median"]

    ok = [c for c in ctx["cells"] if c.get("status") == "ok" and c.get("step_time_ms_median")]
    base = next((c for c in ok if c["technique"] == ctx["baseline"]
                 and c["batch_entry"] == "same"), None)  # fmt: skip
    if base is None:
        return {}
    return {(c["technique"], c["batch_size"]): median_rate(c) / median_rate(base)
            for c in ok if c.get("unstable") and c["technique"] != ctx["baseline"]}  # fmt: skip


def relative_table(ctx: dict) -> Table:
    tf32, gpu = ctx["tf32"], ctx["gpu"]
    caption = (
        "each cell against the baseline at its maximum batch "
        f"({num(ctx['findings']['batch_size'], 0)}): throughput\nspeed-up and peak-memory "
        f"reduction (quality is a property of the function: Table {number(ctx, 'quality')}).\n"
    )
    if tf32:
        caption += (
            "The baseline computes in true FP32 (TF32 off), the slowest matmul path of a GPU with "
            f'tensor cores; "vs TF32" is the speed-up against `{tf32["technique"]}`,\nthe same '
            f"baseline with TF32 matmuls ({num(tf32['cell']['tokens_per_s'], 0)} tokens/s at the "
            'same batch), the "FP32/TF32" baseline most reports mean.'
        )
    else:
        slowest = ", the slowest matmul path of a GPU with tensor cores" if gpu else ""
        caption += (
            f"The baseline computes in true FP32 (TF32 off){slowest}; this study has no TF32 "
            "reference (the baseline with\n`precision: tf32`), so speed-ups against an FP32/TF32 "
            "baseline are not given."
        )
    caption += _retry_sentence(ctx, ctx["baseline"], "speed-up")
    if tf32:
        caption += _retry_sentence(ctx, tf32["technique"], '"vs TF32" ratio')
    skewed = _unstable(ctx)
    if skewed:
        caption += (
            "\nSpeed-ups divide mean step times (what a run takes); † marks an unstable cell "
            f"(Table {number(ctx, 'results')}), whose mean step misleads: by the median step "
            + ", ".join(f"`{t}` at {num(b, 0)} is {_x(v)}" for (t, b), v in skewed.items())
            + "."
        )
    rows = [
        [
            r["technique"],
            r["batch_entry"],
            num(r["batch_size"], 0),
            _x(r["speedup"]) + (" †" if (r["technique"], r["batch_size"]) in skewed else ""),
        ]  # fmt: skip
        + [_x(r.get("speedup_tf32"))] * bool(tf32)
        + [f"{num(r['memory_reduction_pct'], 1)}%"]
        for r in ctx["relative"]
    ]
    columns = ["technique", "entry", "batch", "speed-up"] + ["vs TF32"] * bool(tf32)
    columns.append("memory reduction")
    return Table(
        columns, "llrr" + "r" * bool(tf32) + "r", rows, caption, number(ctx, "relative"), "relative"
    )


def increments_table(ctx: dict) -> Table:
    rows = [
        [r["technique"], r["over"], r["knob"], r["change"], _x(r["speedup"]),
         f"{num(r['memory_reduction_pct'], 1)}%"]
        for r in ctx["increments"]
    ]  # fmt: skip
    caption = (
        "incremental effects at the same batch: pairs of techniques that differ in one knob (and "
        "in the attention kernel\nwhere the knob needs another one: a window runs on FlexAttention)."
    )
    columns = ["technique", "over", "knob", "change", "speed-up", "memory reduction"]
    return Table(
        columns, "llllrr", rows, caption, number(ctx, "increments"), "increments", layout="resize"
    )


def memory_table(ctx: dict) -> Table:
    cells = ctx["same_cells"]
    offloaded = any(c.get("offloaded_mib") for c in cells)
    output = any(c.get("logits_grad_mib") is not None for c in cells)
    freed = any(c.get("logits_mib") is not None and c["logits_mib"] < 0 for c in cells)
    kept = (
        "of them what the output layer (final LayerNorm, logits, loss) kept, measured around it, "
        "and what its backward pass needed on top (the logits' gradient; n/a: a compiled step, "
        "not measured)"
        if output
        else "of them the logits (computed from their shape, not measured)"
    )
    caption = (
        "memory at the same batch, from one measured step (MiB): weights, gradients, optimizer "
        f"state,\nthe activations kept for the backward pass, {kept}, allocated memory after the\n"
        "forward and the backward pass, and the peak"
        + ("; offloaded: what one forward pass kept in host memory instead" if offloaded else "")
        + (
            "; a negative output layer kept nothing: memory that the blocks held until then was "
            "freed while it ran (counted as 0 in the text and figures)"
            if freed
            else ""
        )
        + "."
    )
    columns = ["technique", "weights", "gradients", "optimizer state", "activations"]
    columns += ["output layer", "its backward"] if output else ["logits"]
    columns += ["offloaded"] * offloaded + ["after forward", "after backward", "peak"]
    rows = []
    for c in cells:
        row = [c["technique"]] + [
            num(c[k], 0) for k in ("weights_mib", "gradients_mib", "optimizer_state_mib",
                                   "activations_mib", "logits_mib")
        ]  # fmt: skip
        row += [num(c.get("logits_grad_mib"), 0)] * output
        row += [num(c.get("offloaded_mib"), 0)] * offloaded
        row += [num(c[k], 0) for k in ("phase_after_forward_mib", "phase_after_backward_mib")]
        rows.append(row + [num(c["peak_allocated_mib"], 0)])
    return Table(
        columns,
        "l" + "r" * (len(columns) - 1),
        rows,
        caption,
        number(ctx, "memory"),
        "memory",
        layout="resize",
    )


def recommend_table(ctx: dict) -> Table:
    hw, rows = ctx["hw"], []
    for r in ctx["recommendations"]:
        runner = "none"
        if r["runner_up"]:
            tag = (
                ", within noise"
                if r["within_noise"]
                else ", tied at the search's cap"
                if r["tied"]
                else ""
            )
            runner = f"{r['runner_up']} ({r['runner_up_figure']}{tag})"
        rows.append(
            [r["goal"].replace("GPU", hw), f"**{r['winner']}**", r["figure"], r["cost"], runner]
        )
    caption = (
        f"recommendations, from the cells (Table {number(ctx, 'results')}) and the quality runs "
        f"(Table {number(ctx, 'quality')})."
    )
    return Table(
        ["goal", "use", "its figure", "what it costs", "runner-up"], "lllll", rows, caption, number(ctx, "recommend"),
        "recommend", size="footnotesize",
        colspec="@{}p{0.15\\linewidth}p{0.12\\linewidth}p{0.18\\linewidth}p{0.27\\linewidth}p{0.18\\linewidth}@{}",
    )  # fmt: skip


def references_table(ctx: dict) -> Table:
    refs = ctx["references"]

    def pair(theirs, ours, fmt, extra=""):
        return f"{fmt(theirs) if theirs is not None else '-'} / " + (
            fmt(ours) + extra if ours is not None else "*not run*"
        )

    rows = []
    for r in refs["rows"]:
        tf32 = r.get("our_speedup_tf32")
        rows.append([
            r["report"], r["gpu"], r["technique"], num(r["batch_size"], 0),
            pair(r["speedup"], r["our_speedup"], _x, f" (TF32: {_x(tf32)})" if tf32 is not None else ""),
            pair(r["memory_reduction_pct"], r["our_memory_reduction_pct"], lambda v: f"{num(v, 1)}%"),
            pair(r["max_batch_ratio"], r["our_max_batch_ratio"], _x),
        ])  # fmt: skip
    why = "".join(
        f" **{rep['id']}**: {rep['comparability'].strip()}"
        for rep in refs["reports"]
        if rep.get("comparability")
    )
    columns = ["report", "GPU", "technique", "their batch",
               "speed-up (theirs / ours against FP32, and TF32)", "memory reduction (theirs / ours)",
               "max batch vs baseline (theirs / ours)"]  # fmt: skip
    return Table(
        columns, "lllrrrr", rows, "Ratios against each study's own baseline: theirs / ours.",
        label="references", notes=[f"Why the ratios differ from ours:{why}"], size="footnotesize",
        colspec="@{}p{0.12\\linewidth}p{0.11\\linewidth}p{0.13\\linewidth}p{0.06\\linewidth}"
                "p{0.18\\linewidth}p{0.12\\linewidth}p{0.11\\linewidth}@{}",  # 0.83 + 12 gaps
    )  # fmt: skip
