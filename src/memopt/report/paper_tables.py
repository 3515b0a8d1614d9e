"""The paper's tables, each defined once (memopt.report.tables: columns, rows, caption, notes) from
the context memopt.report.paper builds; both formats render these same objects. Table numbers are
memopt.report.tables.table_numbers (TABLE_ORDER), which the prose cites; the techniques, reference, GPU and stage
tables are not numbered. Text is the Markdown subset the prose uses: `code`, **bold**, *emphasis*."""

from __future__ import annotations

from memopt.report.paper_format import num, pct, sig
from memopt.report.paper_tables_effects import (
    increments_table,
    memory_table,
    recommend_table,
    references_table,
    relative_table,
)
from memopt.report.tables import TABLE_ORDER, Span, Table, number, table_numbers


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
        "delivered);\nMFU counts model FLOPs (useful work), HFU also the forward passes that "
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
                    num(c["tokens_per_s"], 0), pct(c.get("mfu"), 1), pct(c.get("hfu"), 1),
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
    fitted = any(s.get("predicted_batch") is not None for s in searches)
    caption = (
        f"the largest batch each technique trains at{within}.\n`capped` means the search stopped "
        "at its cap, so the true maximum is at least that."
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
        row = [s["technique"], num(s["max_batch"], 0), s["status"], s["n_trials"],
               num(s["first_failing_batch"], 0),
               num(s["seconds"], 1) if "seconds" in s else "n/a",
               num(s["fixed_mib"], 0), num(s["per_sample_mib"], 1)]  # fmt: skip
        if fitted:
            err = s.get("prediction_error")
            known = err is not None and s["status"] != "capped"
            row += [num(_fit_at_budget(s), 0), f"{err:+,}" if known else "n/a"]
        rows.append(row)
    columns = ["technique", "max batch", "status", "trials", "first failing batch",
               "search time (s)", "fixed (MiB)", "per sample (MiB)"]  # fmt: skip
    columns += ["predicted", "error"] * fitted
    return Table(
        columns,
        "lrlrrrrr" + "rr" * fitted,
        rows,
        caption,
        number(ctx, "search"),
        "search",
        layout="resize",
    )


def quality_table(ctx: dict) -> Table:
    q, cfg = ctx["quality"], ctx["config"]
    tokens = q["rows"][0]["tokens"] if q["rows"] else None
    caption = (
        "quality, one row per function (the techniques that compute it share its runs). Each run "
        f"trained\n{num(tokens, 0) if tokens is not None else 'n/a'} tokens at batch "
        f"{cfg['quality']['batch']} with the function's fastest exact kernel, one run per seed; "
        f"validation\nloss and perplexity over {cfg['train']['eval_sequences']} sequences spread "
        "over the validation split, evaluated in FP32 with the explicit kernel:\nmean ± standard "
        f"deviation over the seeds, and the seed range. Against `{q['reference_function']}` (the "
        "baseline's function),\nseed by seed (the same initialization and batches): Δ is the mean "
        "paired difference of validation loss with its\n95% interval (Student's t); *equivalent* "
        f"where the interval lies inside ±{num(q['margin'], 3)} nats (`quality.margin`), *worse* or "
        "*better*\nwhere it lies above or below 0, else *inconclusive*; MDD is roughly the "
        "difference these seeds would detect with 80% power\n((t at 97.5% + t at 80%) x the "
        "standard error, at the observed spread: with few seeds a rough estimate)."
    )
    rows, notes = [], []
    for r in q["rows"]:
        loss = r["val_loss"]
        sd = f" ± {num(loss['sd'], 4)}" if loss["sd"] is not None else ""
        delta, p = r["delta_val_loss"], r["paired"] or {}
        ref = "reference" if r["function"] == q["reference_function"] else "n/a"
        interval = f"[{num(p['lo'], 4)}, {num(p['hi'], 4)}]" if p.get("lo") is not None else ""
        rows.append(
            [r["function"], ", ".join(r["techniques"]), r["kernel"], loss["n"],
             num(loss["mean"], 4) + sd, num(r["val_ppl"]["mean"], 2),
             f"{num(r['val_ppl']['min'], 2)}–{num(r['val_ppl']['max'], 2)}",
             " ".join(filter(None, [num(delta, 4) if delta is not None else ref, interval])),
             num(p["mdd"], 4) if p.get("mdd") is not None else "", r["verdict"] or ""]
        )  # fmt: skip
        for f in r["failed"]:
            why = (
                f"its training loss became non-finite at step {num(f['step'], 0)} (diverged); "
                "its seeds are not compared"
                if f["status"] == "diverged"
                else "out of memory at quality.batch"
            )
            notes.append(f"Seed {f['seed']} of `{r['function']}` did not finish: {why}.")
    columns = ["function", "techniques", "kernel", "seeds", "val loss", "val ppl", "ppl range",
               "Δ val loss (95% CI)", "MDD", "verdict"]  # fmt: skip
    notes = ["\n".join(notes)] if notes else []
    return Table(
        columns,
        "lllrrrrrrl",
        rows,
        caption,
        number(ctx, "quality"),
        "quality",
        notes,
        layout="resize",
    )


def positions_table(ctx: dict) -> Table:
    rows = [r for r in ctx["quality"]["rows"] if r.get("positions")]
    buckets = rows[0]["positions"]
    caption = (
        "validation loss by position in the sequence, per function: the mean over its seeds of "
        "each run's mean loss over\nthe tokens at those positions (every evaluated sequence), "
        "± the mean standard error over sequences.\nEvery function is scored on the same "
        "sequences, so the ± is not the uncertainty of a difference between two rows: the Δ rows "
        f"give that,\nthe paired difference from `{ctx['quality']['reference_function']}` seed "
        "by seed with its 95% interval (Student's t over the seeds)."
    )
    columns = ["function"] + [f"positions {b['first']:,}–{b['last']:,}" for b in buckets]
    body = []
    for r in rows:
        body.append(
            [r["function"]] + [f"{num(p['loss'], 3)} ± {num(p['se'], 3)}" for p in r["positions"]]
        )
        if r.get("position_deltas"):  # the paired difference from the reference, bucket by bucket
            body.append([f"Δ {r['function']}"] + [
                num(d["mean"], 3) + (f" [{num(d['lo'], 3)}, {num(d['hi'], 3)}]" if d["lo"] is not None else "")
                for d in r["position_deltas"]])  # fmt: skip
    return Table(
        columns, "l" + "r" * len(buckets), body, caption, number(ctx, "positions"), "positions"
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


def exactness_table(ctx: dict) -> Table:
    e = ctx["exactness"]
    compared = any(r["ok"] is not None for r in e["rows"])
    verdict = (
        "No technique shares its function with another here: nothing to compare."
        if not compared
        else "The check holds for every technique."
        if e["holds"]
        else f"**The check fails** for: {', '.join(e['failed'])}: their quality is not that of "
        "their function's quality runs."
    )
    caption = (
        f"exactness check. Each technique trained {num(e['steps'], 0)} steps at batch "
        f"{num(e['batch_size'], 0)} from the same\ninitialization on the same batches as its "
        "function's reference (the plainest technique of that function in the study);\nthe "
        "largest per-step difference of the training loss must be within the tolerance of its "
        f"precision.\n{verdict}"
    )
    floors = {r["reference"]: r for r in e["rows"] if r["tolerance_from"] == "floor"}
    if floors:
        caption = caption.replace(
            "the tolerance of its precision",
            f"its tolerance: {num(e['floor_factor'], 1)}× its function's noise floor, the largest "
            f"difference between the\nreference's run and the same run with {e['floor_how']} "
            "(the precision's tolerance where none ran)",
        )
    rows = [
        [r["technique"], r["function"], "(itself)", "–", "–", "–", "reference"]
        if r["ok"] is None
        else [r["technique"], r["function"], r["reference"], num(r["max_abs_diff"], 4),
              num(r["final_diff"], 4), sig(r["tolerance"], 4) if r["tolerance_from"] == "floor"
              else r["tolerance"], "yes" if r["ok"] else "**no**"]
        for r in e["rows"]
    ]  # fmt: skip
    notes = []
    if e["controls"]:
        pairs = ", ".join(
            f"`{c['technique']}` against `{c['against']}` {num(c['max_abs_diff'], 4)}"
            for c in e["controls"]
        )
        note = f"For scale, the references of different functions in one precision, trained the same way: {pairs}."
        within = [c for c in e["controls"] if c["within"]]
        if within:
            note += (
                f"\n{'These stay' if len(within) > 1 else 'This stays'} within the tolerance too: "
                f"over {num(e['steps'], 0)} steps the check bounds how far a technique strays from "
                "its reference, but it cannot by itself tell another function from the same one."
            )
        notes.append(note)
    if floors:
        notes.append("Noise floors: " + ", ".join(
            f"`{ref}` {sig(r['floor'], 4)} ({r['floor_kernels']} against {r['floor_against']})"
            for ref, r in floors.items()) + ".")  # fmt: skip
    unmeasured = {r["reference"]: r["floor_reason"] for r in e["rows"] if r.get("floor_reason")}
    if e["floor_factor"] and unmeasured:
        notes.append("No noise floor (the precision's tolerance applies): " + ", ".join(
            f"`{ref}`: {why}" for ref, why in unmeasured.items()) + ".")  # fmt: skip
    columns = ["technique", "function", "reference", "max abs Δ loss", "Δ final loss",
               "tolerance", "within tolerance"]  # fmt: skip
    return Table(
        columns,
        "lllrrrl",
        rows,
        caption,
        number(ctx, "exactness"),
        "exactness",
        notes,
        layout="shrink",
    )


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
    }
    ctx["tn"] = table_numbers(name for name in TABLE_ORDER if has.get(name, True))
    builders = {
        "techniques": techniques_table, "results": results_table, "search": search_table,
        "quality": quality_table, "optimal": optimal_table, "exactness": exactness_table,
        "relative": relative_table, "increments": increments_table, "memory": memory_table,
        "recommend": recommend_table, "references": references_table, "gpus": gpus_table,
        "stages": stages_table, "positions": positions_table,
    }  # fmt: skip
    return {name: make(ctx) if has.get(name, True) else None for name, make in builders.items()}
