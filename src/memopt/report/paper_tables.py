"""The paper's tables, each defined once (memopt.report.tables: columns, rows, caption, notes) from
the context memopt.report.paper builds; both formats render these same objects. Table numbers are
memopt.report.tables.table_numbers (TABLE_ORDER), which the prose cites; the techniques, reference, GPU and stage
tables are not numbered. Text is the Markdown subset the prose uses: `code`, **bold**, *emphasis*."""

from __future__ import annotations

from memopt.report.paper_format import host_budget_words, num, pct
from memopt.report.paper_tables_effects import (
    increments_table,
    memory_table,
    recommend_table,
    references_table,
    relative_table,
)
from memopt.report.paper_tables_quality import exactness_table, positions_table, quality_table
from memopt.report.tables import (
    LINKED_QUALITY_ORDER,
    TABLE_ORDER,
    Span,
    Table,
    number,
    table_numbers,
)


def techniques_table(ctx: dict) -> Table:
    ts = ctx["techniques"]
    show_loss = any(t["loss"] != "standard" for t in ts)
    show_opt = any(t["optimizer"] != "adamw" for t in ts)
    show_other = any(t["other"] for t in ts)
    columns = ["technique", "precision", "attention", "window", "checkpointing", "compile"]
    columns += ["loss"] * show_loss + ["optimizer"] * show_opt + ["other knobs"] * show_other
    rows = []
    for t in ts:
        every = f" (every {t['checkpoint_every']})" if t["checkpointing"] == "every_k" else ""
        chunk = f" ({num(t['loss_chunk'], 0)} rows)" if t["loss"] == "chunked" else ""
        row = [t["name"], t["precision"], t["attention"], t["window"] or "full"]
        row += [t["checkpointing"] + every, t["compiled"]]
        row += [t["loss"] + chunk] * show_loss + [t["optimizer"]] * show_opt
        row += [t["other"]] * show_other + [", ".join(t["kernels"]) or "n/a"]
        rows.append(row)
    return Table(
        columns + ["kernel that ran"], "l" * (len(columns) + 1), rows,
        caption="Techniques and the attention kernel that actually ran.", label="techniques",
        layout="shrink",
    )  # fmt: skip


def results_table(ctx: dict) -> Table:
    cfg, gpu, where = ctx["config"]["measure"], ctx["gpu"], ctx["where"]
    limit = f", or {num(cfg['max_timed_s'], 0)} s of timed steps" if cfg.get("max_timed_s") else ""
    retries = (
        "retries counts the allocator's cudaMalloc retries and out-of-memory errors over the timed "
        "steps."
        if gpu
        else "retries are n/a on a CPU, which has no caching allocator."
    )
    caption = (
        "one row per timing cell (technique x batch entry). Memory is the peak over whole timed "
        "steps,\noptimizer included; step time is the median of the timed steps with its 95% "
        "confidence interval (order statistics; † marks an unstable cell,\nlisted below the "
        f"table); the cell timed steps until the 95% interval of their mean was within "
        f"{pct(cfg['target_rel_ci'], 1)} of it, or {cfg['max_timed_steps']} steps{limit};\n"
        "tokens/s is the batch's tokens over the mean step time (what the whole timed run "
        "delivered), ± the 95% interval of that mean (part of a cell's noise: Method);\nMFU counts model FLOPs (useful work), HFU also the forward passes that "
        "checkpointing and a recomputed loss run again (n/a where MFU is, or where the compiler "
        f"chooses what to recompute);\n{retries}"
    )
    columns = ["technique", "function", "entry", "batch", "status", "peak allocated (MiB)",
               "peak reserved (MiB)", "median step (ms)", "timed steps", "tokens/s", "MFU", "HFU",
               "retries"] + ["GPU"] * bool(where["split"])  # fmt: skip
    rows = []
    for c in ctx["cells"]:
        batch = num(c["batch_size"], 0) + (f" × {c['grad_accum']}" if c["grad_accum"] > 1 else "")
        row = [c["technique"], c["function"], c["batch_entry"], batch]
        if c["status"] == "ok":
            median = num(c["step_time_ms_median"], 1)
            if c.get("step_time_ms_median_lo") is not None:
                lo, hi = num(c["step_time_ms_median_lo"], 1), num(c["step_time_ms_median_hi"], 1)
                median += f" [{lo}–{hi}]"
            retried = c.get("allocator_alloc_retries")
            row += ["ok", num(c["peak_allocated_mib"], 0), num(c["peak_reserved_mib"], 0),
                    median + (" †" if c.get("unstable") else ""), num(c["timed_steps"], 0),
                    num(c["tokens_per_s"], 0) + _plus_minus(c.get("step_time_ms_rel_ci95")),
                    pct(c.get("mfu"), 1), pct(c.get("hfu"), 1),
                    "n/a" if retried is None else num(retried + (c.get("allocator_ooms") or 0), 0)]  # fmt: skip
        elif c["status"] == "diverged":
            step = num(c["diverged_step"], 0)
            row += ["**diverged**", Span(f"training loss non-finite at step {step}", 8)]
        else:
            row += ["**OOM**", Span("out of memory", 8)]
        if where["split"]:
            row.append(where["labels"].get(c.get("provenance_gpu_uuid"), "n/a"))
        rows.append(row)
    return Table(
        columns, "lllrlrrrrrrrr" + "l" * bool(where["split"]), rows, caption, number(ctx, "results"), "results",
        _results_notes(ctx), layout="sideways",
    )  # fmt: skip


def _results_notes(ctx: dict) -> list[str]:
    notes, cells = [], ctx["cells"]
    unstable = [c for c in cells if c.get("unstable") and not c.get("measured_as")]
    if unstable:
        notes.append(
            "† Unstable cells, whose mean step time misleads (the median is the steady state): "
            + "; ".join(
                f"`{c['technique']}` ({c['batch_entry']}, batch {c['batch_size']}): {c['unstable']}"
                for c in unstable
            )
            + "."
        )
    groups: dict[str, list[dict]] = {}
    for c in cells:
        if c.get("measured_as"):
            groups.setdefault(c["batch_entry"], []).append(c)
    for entry, group in groups.items():
        names = [f"`{c['technique']}`" for c in group]
        listed = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
        many = len(names) > 1
        notes.append(
            f"The `{entry}` row{'s' * many} of {listed} {'are their' if many else 'is its'} "
            f"`{group[0]['measured_as']}` run{'s' * many}: the same batch, measured once."
        )
    if ctx.get("retries"):
        r = ctx["retries"]
        at = ", ".join(f"`{c['technique']}` at {c['batch_size']}" for c in r)
        notes.append(
            f"**Allocator retries.** In {len(r)} cell{'s' * (len(r) != 1)} ({at}) the caching "
            "allocator\nhad to free its cache and retry a cudaMalloc during the timed steps. A "
            "retry synchronizes the device and returns\ncached blocks to the driver, so these "
            "cells' step times include that slow path: their speed is what the technique\n"
            "achieves this close to the memory limit, not its speed with room to spare."
        )
    return notes


def _fit_at_budget(s: dict) -> int | None:
    """The batch the search's linear fit puts at its limit (what a capped search's first guess
    is not): the search's own prediction where it made one from the fit, else the fit's."""
    if s["status"] != "capped":
        return s.get("predicted_batch")
    fixed, per = s.get("fixed_mib"), s.get("per_sample_mib")
    if fixed is None or not per:
        return None
    return int(((s.get("fit_limit_mib") or s["budget_mib"]) - fixed) // per)


def search_table(ctx: dict) -> Table:
    searches, cfg = ctx["searches"], ctx["config"]["search"]
    budgets = [s["budget_mib"] for s in searches if s.get("budget_mib")]
    within = ""
    if budgets:
        lo, hi = num(min(budgets), 0), num(max(budgets), 0)
        headroom = cfg.get("headroom_mib")
        less = f", less a headroom of {num(headroom, 0)} MiB" if headroom else ""
        span = lo if lo == hi else f"{lo}–{hi}"
        within = f" within {span} MiB (what was free when each search began{less})"
        slacks = sorted(
            {s["allocator_slack_mib"] for s in searches if s.get("allocator_slack_mib")}
        )
        if slacks:  # searches that count a peak within the allocator's slack as a miss
            within += f", its allocated peak at least {num(slacks[-1], 0)} MiB below that"
    planned = ctx["from_plan"]  # the searches tried memopt plan's maximum first
    fitted = not planned and any(s.get("predicted_batch") is not None for s in searches)
    caption = f"the largest batch each technique trains at{within}."
    if any(s["status"] == "capped" for s in searches):
        caption += (
            "\n`capped` means the search stopped at its cap, so the true maximum is at least that."
        )
    hosts = [s for s in searches if s.get("limit") == "host"]
    if hosts:
        budget = max(s.get("host_budget_mib") or 0 for s in hosts) / 1024
        caption += (
            "\n`ok (host)`: the pinned host memory memopt lets the offloaded activations take "
            f"stopped it, not the GPU's memory ({budget:.1f} GiB, "
            f"{host_budget_words(ctx['config'])})."
        )
    if planned:
        caption += (
            "\nFixed and per-sample memory are the search's linear fit of peak memory on its "
            "trials; *plan* is memopt plan's predicted maximum, the search's first trial, and "
            "*error* its distance from the proven maximum (positive: over-predicted)."
        )
    if fitted:
        caption += (
            "\nFixed and per-sample memory are the search's linear fit of peak memory on its probe "
            "trials; *predicted* is the batch that fit\nput at the budget, and *error* its "
            "distance from the proven maximum (positive: the fit over-predicted; n/a for a capped "
            "search, whose maximum is not known)."
        )
    rows = []
    for s in searches:
        status = s["status"] + (" (host)" if s.get("limit") == "host" else "")
        row = [s["technique"], num(s["max_batch"], 0), status, s["n_trials"],
               num(s["first_failing_batch"], 0),
               num(s["seconds"], 1) if "seconds" in s else "n/a",
               num(s["fixed_mib"], 0), num(s["per_sample_mib"], 1)]  # fmt: skip
        if planned or fitted:  # memopt plan's first trial, else the fit's boundary; its error
            err = s.get("plan_error" if planned else "prediction_error")
            known = err is not None and s["status"] != "capped"
            guess = s.get("plan_batch") if planned else _fit_at_budget(s)
            row += [num(guess, 0), f"{err:+,}" if known else "n/a"]
        rows.append(row)
    columns = ["technique", "max batch", "status", "trials", "first failing batch",
               "search time (s)", "fixed (MiB)", "per sample (MiB)"]  # fmt: skip
    columns += ["plan", "error"] * planned + ["predicted", "error"] * fitted
    return Table(
        columns,
        "lrlrrrrr" + "rr" * (planned or fitted),
        rows,
        caption,
        number(ctx, "search"),
        "search",
        layout="resize",
    )


def optimal_table(ctx: dict) -> Table:
    def at(best):
        return f"{num(best['tokens_per_s'], 0)} at {best['batch']}" if best else "n/a"

    rows = [
        [o["technique"], num(o["max_batch"], 0), at(o["cell"]), at(o["trial"]),
         f"{o['best']['batch']} ({o['best']['from']})" if o["best"] else "n/a"]
        for o in ctx["optimal"]
    ]  # fmt: skip
    caption = (
        "the throughput-optimal batch: the highest tokens/s each technique reached among its "
        "timed cells and\nits search trials (a trial times one synchronized step after one warm-up "
        "step: a rough figure)."
    )
    columns = ["technique", "max batch", "best timed cell", "best search trial", "best batch"]
    return Table(columns, "lrrrr", rows, caption, number(ctx, "optimal"), "optimal")


def gpus_table(ctx: dict) -> Table:
    where = ctx["where"]
    rows = [
        [g["label"], g["model"], g["uuid"], g["host"], g["cells"], g["searches"], g["quality"]]
        for g in where["gpus"]
    ]
    notes = []
    if where.get("unrecorded"):
        kinds = {"cells": "timing cells", "searches": "searches", "quality": "quality runs"}
        counts = ", ".join(f"{n} {kinds[k]}" for k, n in where["unrecorded"].items())
        notes.append(
            f"Not counted: {counts} whose results do not name their GPU (written before memopt "
            "recorded it, or run on a CPU)."
        )
    columns = ["", "GPU", "UUID", "host", "timing cells", "searches", "quality runs"]
    return Table(
        columns, "llllrrr", rows, "The GPUs the jobs ran on (from each result's provenance).",
        label="gpus", notes=notes, layout="resize",
    )  # fmt: skip


def stages_table(ctx: dict) -> Table:
    stages, share = ctx["stages"], ctx.get("share")
    rows = [[s["stage"], s["jobs"], num(s["seconds"], 1)] for s in stages["rows"]]
    total = [["total", sum(s["jobs"] for s in stages["rows"]), num(stages["total_s"], 1)]]
    notes = []
    if share:
        notes.append(
            f"Of the {num(share['total_s'], 1)} s of job time, {num(share['timed_s'], 1)} s were "
            f"timed steps of the timing cells and\n{num(share['quality_s'], 1)} s training steps of "
            f"the quality runs; the other {num(share['other_s'], 1)} s "
            f"({num(share['other_pct'], 1)}%) went to\nthe data, the searches and exactness runs, "
            "process starts, warm-up, compilation, evaluation and the paper."
        )
    return Table(["stage", "jobs", "time (s)"], "lrr", rows, label="stages", notes=notes,
                 footer=total)  # fmt: skip


def build(ctx: dict) -> dict[str, Table | None]:
    """Every table of the paper; None where the study has nothing to show in it. Sets ctx["tn"]:
    the numbers of the numbered tables the study has (memopt.report.tables.table_numbers)."""
    has = {
        "relative": bool(ctx["relative"]),
        "increments": bool(ctx["increments"]),
        "memory": bool(ctx["same_cells"]),
        "exactness": bool(ctx["exactness"]["rows"]),
        "recommend": bool(ctx.get("recommendations")),
        "references": bool(ctx["references"]["rows"]),
        "gpus": bool(ctx["where"]["gpus"]),
        "stages": bool(ctx["stages"]["rows"]),
        "positions": any(r.get("positions") for r in ctx["quality"]["rows"]),
        "linked_quality": bool((ctx["config"].get("paper") or {}).get("quality")),
    }
    order = LINKED_QUALITY_ORDER if has["linked_quality"] else TABLE_ORDER
    ctx["tn"] = table_numbers((name for name in order if has.get(name, True)), order)
    builders = {
        "techniques": techniques_table, "results": results_table, "search": search_table,
        "quality": quality_table, "optimal": optimal_table, "exactness": exactness_table,
        "relative": relative_table, "increments": increments_table, "memory": memory_table,
        "recommend": recommend_table, "references": references_table, "gpus": gpus_table,
        "stages": stages_table, "positions": positions_table,
    }  # fmt: skip
    return {name: make(ctx) if has.get(name, True) else None for name, make in builders.items()}


def _plus_minus(rel) -> str:
    """ " ±x.x%": a cell's relative 95% interval of its mean step time ("" where none)."""
    return "" if rel is None or rel != rel else f" ±{pct(rel, 1)}"
