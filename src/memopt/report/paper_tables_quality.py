"""The paper's quality tables (memopt.report.tables; built by memopt.report.paper_tables): each
function's quality runs and paired verdict, its loss by position, and the exactness check with
its noise floors."""

from __future__ import annotations

from memopt.report.paper_format import num, sig
from memopt.report.tables import Table, number


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
        columns, "l" + "r" * len(buckets), body, caption, number(ctx, "positions"), "positions",
        layout="shrink",  # the Δ rows' intervals can pass the line (the H200's at 2 seeds)
    )  # fmt: skip


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
