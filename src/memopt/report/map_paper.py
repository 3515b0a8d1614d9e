"""The map study's paper (Markdown and LaTeX), rendered by the default paper's machinery: the same
Jinja2 environments and filters (memopt.report.paper_format), the same table objects and their two
renderers (memopt.report.tables), prose written once in Markdown and converted (render_prose),
the same figure paths and atomic writes. Its numbers come from results/map.csv and
results/map_findings.json (memopt.report.map_results) and the searches' JSON; the templates are
paper/templates/map.{md,tex}.j2 and paper/templates/map/."""

from __future__ import annotations

from pathlib import Path

from memopt.config import full_spec
from memopt.map_points import map_points, map_reference, point_models
from memopt.report import tables
from memopt.report.map_analysis import (
    SLOPE_SAME,
    budget_spread,
    fixed_savings,
    kept_scores,
    pay_groups,
    pays_everywhere,
    share_ranges,
    speed_summary,
    where_run,
)
from memopt.report.map_claims import (
    at_once,
    cell_row,
    fit_sequences,
    host_rivals,
    interval_misses,
    own_max_speeds,
    point_spans,
    recompute_share,
    retry_room,
    searches_by_cell,
    single_points,
    slope_ratios,
    time_groups,
)
from memopt.report.map_figures import CLOSE
from memopt.report.map_repeats import repeat_spread
from memopt.report.map_results import (
    BREAKDOWN,
    LIMIT_MARKS,
    LIMIT_WHY,
    MAP_FIGURE_NAMES,
    retried,
    was_timed,
)
from memopt.report.noise import RETRY_NOISE, SPEED_BASIS, noise_rule
from memopt.report.paper import _render, figure_paths
from memopt.report.paper_format import config_yaml, make_environment, num, pct
from memopt.report.paper_inputs import PROVENANCE_KEYS, _clean
from memopt.report.paper_prose import render_prose
from memopt.report.results import read_json, write_text
from memopt.report.tables import Table
from memopt.runtime.flops import param_count

SECTIONS = ("title", "abstract", "introduction", "findings", "limitations", "conclusion")
KNOB_DEFAULTS = {"precision": None, "attention": None, "window": None, "checkpointing": "none",
                 "loss": "standard", "offload": "none", "compile": False, "optimizer": "adamw"}  # fmt: skip
# a window's same-batch speed-up is set beside its FLOPs where it computes below this share of them
FEWER_FLOPS = 0.95
KNOB_COLUMNS = tuple(KNOB_DEFAULTS)


def span(lo, hi, decimals: int = 1) -> str:
    """'1.3–4.0', or '4.0' where both ends print the same."""
    a, b = num(lo, decimals), num(hi, decimals)
    return a if a == b else f"{a}–{b}"


def listed(items) -> str:
    """'a', 'a and b', 'a, b and c'."""
    items = [str(i) for i in items]
    return " and ".join(items) if len(items) < 3 else ", ".join(items[:-1]) + " and " + items[-1]


def _models(config: dict, vocab: int) -> list[dict]:
    names, out = point_models(config), {}
    for point, model in map_points(config).items():
        name = names[point]
        out.setdefault(name, {**model, "name": name, "params": param_count(model, vocab)})
        out[name]["n_kv_heads"] = out[name].get("n_kv_heads") or out[name]["n_heads"]
    return list(out.values())


def map_context(table, findings: dict, search_paths, corpus_stats, token_meta, config,
                repeats_dir=None) -> dict:  # fmt: skip
    """Everything the map paper's templates use (`table`: results/map.csv as a DataFrame;
    `repeats_dir`: a published study's repeats/, beside its results/, where it has one)."""
    rows = [{k: _clean(v) for k, v in r.items()} for r in table.to_dict(orient="records")]
    tokens = read_json(token_meta)
    reference = findings["reference"]
    points = list(dict.fromkeys(r["point"] for r in rows))
    techniques = list(dict.fromkeys(r["technique"] for r in rows))
    searches = [read_json(Path(p)) for p in search_paths]
    timed = [r for r in rows if r["cell_status"] == "ok"]
    models = _models(config, tokens["vocab_size"])
    specs = {t: config["techniques"][t] for t in techniques}
    # per technique, the knobs it sets otherwise than the reference ("attention flex"), every
    # default filled on both sides (memopt.config.full_spec)
    ref_spec = full_spec(specs[reference])
    differs = {t: [f"{k} {v}" for k, v in full_spec(s).items() if v != ref_spec.get(k)]
               for t, s in specs.items()}  # fmt: skip
    best = []  # per point: the techniques with the most tokens per step (ties), against the reference
    for p in points:
        at = [r for r in rows if r["point"] == p]
        top = max(r["max_tokens"] for r in at)
        tied = [r for r in at if r["max_tokens"] == top]
        ref = next(r for r in at if r["technique"] == reference)
        best.append({"point": p, "techniques": [r["technique"] for r in tied], "tokens": top,
                     "bound": any(r["limit"] in ("data", "cap") for r in tied),  # a lower bound
                     "host": any(r["limit"] == "host" for r in tied),  # the host's, not the GPU's
                     "gpu": any(r["limit"] == "memory" for r in tied),  # the GPU's memory's
                     "ratio": top / ref["max_tokens"] if ref["max_tokens"] else None,
                     # its tokens/s over the reference's, each at its own maximum (both timed)
                     "speed": next((r["tokens_per_s"] / ref["tokens_per_s"] for r in tied
                                    if was_timed(r) and was_timed(ref)), None),
                     # either cell of that ratio retried cudaMalloc in its timed steps
                     "retried": any(was_timed(r) and retried(r) for r in [ref, *tied])})  # fmt: skip
    # the techniques among the most at every point (in the map's order), else each point's
    always = [t for t in techniques if all(t in b["techniques"] for b in best)]
    winners = always or list(dict.fromkeys(t for b in best for t in b["techniques"]))
    ratios = [b["ratio"] for b in best if b["ratio"] is not None]
    speeds = [b["speed"] for b in best if b["speed"] is not None]
    # the best's ratios where the GPU's memory stopped it, and where the host's did
    split = {}
    for kind in ("gpu", "host"):
        r = [b["ratio"] for b in best if b["ratio"] is not None and b[kind]]
        split[kind] = {"min": min(r), "max": max(r)} if r else None

    by_cell = searches_by_cell(search_paths, searches)
    speed = speed_summary(findings)
    for s in speed:  # where a faster or slower ratio comes from: model FLOPs per token and MFU
        for f in s["faster"] + s["slower"] + s["others"]:
            mine, ref = (
                cell_row(rows, f["point"], s["technique"]),
                cell_row(rows, f["point"], reference),
            )
            f.update(mfu=mine["mfu"], ref_mfu=ref["mfu"], flops=_flops(mine) / _flops(ref))
    verdicts = [f for s in speed for f in s["faster"] + s["slower"]]
    fits = [s["fit"] for s in searches if s.get("fit")]
    spread = budget_spread(search_paths, searches, rows, reference)
    for o in (spread or {}).get("one_apart", []):  # what each search's line allows there
        o["fit"] = fit_sequences(by_cell.get((spread["point"], o["technique"])))
        o["ref_fit"] = fit_sequences(by_cell.get((spread["point"], reference)))
    budgets: dict = {}  # per technique, its searches' budgets over the points
    for (_, t), s in by_cell.items():
        if s.get("budget_mib"):
            budgets.setdefault(t, []).append(s["budget_mib"])
    plan = map_points(config)
    # each technique's model FLOPs over all it computes, at every point (None: no recomputation)
    recompute = {t: recompute_share({p: plan[p] for p in points}, full_spec(specs[t]), tokens["vocab_size"])
                 for t in techniques}  # fmt: skip
    spans = point_spans(search_paths, searches, read_json)  # when each point's jobs ran
    runs, where = time_groups(spans), where_run(rows)
    groups = [list(dict.fromkeys(point for point, _ in g)) for g in runs]  # points, in order
    on_gpu = any(r["gpu"] for r in timed)
    repeats = repeat_spread(Path(repeats_dir), Path(repeats_dir).parent / "results", RETRY_NOISE) \
        if repeats_dir else None  # fmt: skip
    return {
        "config": config, "config_yaml": config_yaml(config, searches), "corpus": read_json(corpus_stats),
        "tokens": tokens, "models": models,
        "lengths": list(config["map"]["seq_lens"]), "points": points, "techniques": techniques,
        "specs": specs, "differs": differs, "reference": reference,
        "pays_at": findings["pays_at"], "rows": rows,
        "searches": {
            "n": len(rows), "proven": sum(r["search_status"] == "ok" for r in rows),
            "none_fits": [r for r in rows if r["search_status"] == "none_fits"],
            "capped": [r for r in rows if r["search_status"] == "capped"],
            "max_trials": max(r["trials"] for r in rows), "seconds": sum(r["search_s"] for r in rows),
            "longest": max(rows, key=lambda r: r["search_s"]), "host": [r for r in rows if r["limit"] == "host"],
            "headroom_mib": config["search"]["headroom_mib"],
            "budgets_mib": sorted({s["budget_mib"] for s in searches if s.get("budget_mib")}),
            "slack_mib": max((s.get("allocator_slack_mib") or 0 for s in searches), default=0),
            "budget_sequences": spread,
            # the most one technique's budgets differ over the points (and so over the GPUs)
            "budget_within_mib": max((max(b) - min(b) for b in budgets.values()), default=None),
        },
        "timed": {"n": len(timed), "fastest": max(timed, key=lambda r: r["tokens_per_s"]) if timed else None,
                  "top_mfu": max((r for r in timed if r.get("mfu") is not None), key=lambda r: r["mfu"], default=None)},
        # cells whose timed steps retried cudaMalloc: their tokens/s include that slow path
        "retrying": sorted((r for r in timed if retried(r)),
                           key=lambda r: r["alloc_retries"] / (r.get("timed_steps") or 1)),
        "best": best, "winners": winners, "everywhere": bool(always),
        "ties": any(len(b["techniques"]) > 1 for b in best), "bound": any(b["bound"] for b in best),
        "best_ratio": {"min": min(ratios), "max": max(ratios)} if ratios else None,
        "best_speed": {"min": min(speeds), "max": max(speeds)} if speeds else None,
        # where some best maxima are the host's and some the GPU's, their ratios apart
        "best_split": split if all(split.values()) else None,
        # the points of best_speed where either cell retried cudaMalloc (a noisier ratio)
        "speed_retried": [b["point"] for b in best if b["speed"] is not None and b["retried"]],
        "reference_precision": config["techniques"][reference]["precision"].upper(),
        "findings": [
            {"technique": t, "length": pay_groups(f, "length"), "size": pay_groups(f, "size"),
             **pays_everywhere(f, findings["pays_at"])}
            for t, f in findings["techniques"].items()
        ],
        "shares": share_ranges(rows, reference),
        "speed": speed, "retry_noise": RETRY_NOISE, "speed_basis": SPEED_BASIS, "noise_rule": noise_rule(on_gpu),
        # what the claims may say (memopt.report.map_claims)
        "references": [t for t in dict.fromkeys((reference, config.get("baseline"))) if t in specs],
        "single": single_points(rows, reference, findings["pays_at"], by_cell),
        "winner_slopes": {t: [w for w in slope_ratios(rows, t, reference) if w["max"] > 1 + SLOPE_SAME]
                          for t in winners},
        # the fewest sequences the reference fits at a point (points where it fits none left out)
        "fewest": min((r["max_batch"] for r in rows if r["technique"] == reference and r["max_batch"]),
                      default=None),
        "rivals": host_rivals(rows, best, by_cell),
        "host_cap": config["search"].get("host_pinned_gib"),
        "ci_misses": interval_misses(rows, config["measure"]["target_rel_ci"]),
        "at_once": at_once(spans), "groups": groups,
        "own_speeds": own_max_speeds(rows, [t for t in techniques if t != reference], reference,
                                     recompute, config["measure"]["target_rel_ci"]),
        "retry_room": retry_room(timed),
        # a faster or slower verdict at the reference's batch from two cells that did not retry
        "verdicts_clean": bool(verdicts) and not any(f["retried"] for f in verdicts),
        "fewer_flops": FEWER_FLOPS,
        # the most machines the groups of points ran on (groups that share a GPU ran on one)
        "group_machines": _group_machines(runs),
        "recompute": recompute,
        # techniques that set more than one knob otherwise than the reference (not the references)
        "multi_knob": [t for t in techniques if t not in (reference, config.get("baseline"))
                       and len(differs[t]) > 1],
        "fits": {"n": len(fits), "two": sum(len(f.get("batches") or []) == 2 for f in fits)},
        "flex_alone": {t: any(u != t and v.get("attention") == s.get("attention") and not v.get("window")
                              for u, v in specs.items()) for t, s in specs.items() if s.get("window")},
        "slope_same": SLOPE_SAME,
        "repeats": repeats,
        # the own-maximum verdicts again with the repeats' own allowance for a retried cell
        "own_speeds_repeats": own_max_speeds(rows, [t for t in techniques if t != reference],
                                             reference, recompute, retry=repeats["retried_max"])
        if repeats and repeats["retried_max"] else None,  # a spread of 0 allows nothing
        "n_kinds": len(BREAKDOWN), "dodge": CLOSE - 1,
        "fixed": fixed_savings(rows, reference, findings["pays_at"]),
        "scores": kept_scores(rows, models, specs),
        "linked": False,  # True: rendered inside another paper (memopt.report.paper_links)
        "device": {"name": " and ".join(sorted({r["gpu"] for r in timed if r["gpu"]})) or None,
                   "gpu": on_gpu},
        "where": where,
        "provenance": {k: sorted({str(p[k]) for s in searches for p in [s.get("provenance") or {}] if p.get(k)})
                       for k in PROVENANCE_KEYS},
    }  # fmt: skip


def _group_machines(groups: list[list[tuple]]) -> int:
    """How many machines the groups of (point, GPU UUID) (time_groups) ran on at most: groups
    that share a GPU ran on one machine."""
    machines: list[set] = []  # the GPUs of each machine found so far
    for g in groups:
        gpus = {gpu for _, gpu in g} - {None}
        joined = [m for m in machines if m & gpus]
        machines = [m for m in machines if not m & gpus] + [gpus.union(*joined)]
    return len(machines)


def _flops(row: dict) -> float:
    """Model FLOPs per token of a timed cell."""
    return row["model_tflops"] * 1e12 / row["tokens_per_s"]


def _by_point(ctx: dict, value, caption: str, number: int, label: str, notes=()) -> Table:
    """One row per point, one column per technique, `value(row)` in each cell."""
    rows = [[f"`{p}`"] + [value(cell_row(ctx["rows"], p, t)) for t in ctx["techniques"]]
            for p in ctx["points"]]  # fmt: skip
    return Table(["point"] + [f"`{t}`" for t in ctx["techniques"]], "l" + "r" * len(ctx["techniques"]),
                 rows, caption, number, label, list(notes), layout="shrink")  # fmt: skip


def map_tables(ctx: dict) -> dict[str, Table]:
    """The map paper's tables, numbered in the order the paper shows them."""
    models = Table(
        ["model", "block", "layers", "d_model", "heads", "key/value heads", "d_ff", "parameters"],
        "llrrrrrr",
        [[f"`{m['name']}`", "Llama-style" if m["arch"] == "llama" else "GPT-2-style", m["n_layers"],
          num(m["d_model"]), m["n_heads"], m["n_kv_heads"], num(m["d_ff"]), num(m["params"])]
         for m in ctx["models"]],
        "The models of the map (parameters with the tied embedding counted once"
        + (", at the first length: the GPT-2-style model's learned positions add d_model per token "
           "of length)." if any(m["arch"] != "llama" for m in ctx["models"]) else ")."),
        1, "models",
    )  # fmt: skip
    specs = ctx["specs"]
    knobs = Table(
        ["technique", *KNOB_COLUMNS], "l" * (len(KNOB_COLUMNS) + 1),
        [[f"`{t}`", *("-" if s.get(k) == d or s.get(k) is None else str(s.get(k))
                      for k, d in KNOB_DEFAULTS.items())]
         for t, s in specs.items()],
        "The techniques: the knobs each sets (-: off, or the default).", label="techniques",
        layout="shrink",
    )  # fmt: skip

    def tokens(r):
        if r["search_status"] == "none_fits":
            return "OOM"
        mark = f" {LIMIT_MARKS[r['limit']]}" if r["limit"] in LIMIT_MARKS else ""
        return num(r["max_tokens"]) + mark

    def speed(r):
        if r["tokens_per_s"] is None:
            return "OOM" if r["search_status"] == "none_fits" else "n/a"
        mark = " r" if retried(r) else ""
        return f"{num(r['tokens_per_s'] / 1000, 1)}k ({pct(r['mfu'], 0)}){mark}"

    def per_token(r):
        if r["per_token_mib"] is None:  # no fit: batch 1 does not fit, or only one batch did
            return "OOM" if r["search_status"] == "none_fits" else "-"
        return num(r["per_token_mib"] * 1024, 1)

    no_slope = any(per_token(r) == "-" for r in ctx["rows"])  # Table 4's "-" only where it is used
    budgets = ctx["searches"]["budgets_mib"] or [None]  # sorted: the smallest to the largest
    lo, hi = (num(b) if b else "n/a" for b in (budgets[0], budgets[-1]))
    budget = lo if lo == hi else f"{lo} to {hi}"
    slack = ctx["searches"]["slack_mib"]
    peak = f", its allocated peak at least {num(slack)} MiB below it," if slack else ""
    return {
        "models": models,
        "techniques": knobs,
        "tokens": _by_point(
            ctx, tokens, "The proven maximum tokens per step (batch x length) at each point. OOM: "
            "batch 1 does not fit" + "".join(f"; {LIMIT_MARKS[k]}: {why}" for k, why in LIMIT_WHY.items()
                                             if any(r["limit"] == k for r in ctx["rows"])) + ".",
            2, "tokens",
            [f"Every other maximum is the GPU's: batch B trained within the budget of {budget} MiB "
             f"(what the GPU had free when the search began, less {num(ctx['searches']['headroom_mib'])} MiB)"
             f"{peak} and B + 1 "
             "did not."],
        ),
        "speed": _by_point(ctx, speed, "Throughput at each technique's maximum: tokens/s (k: thousand), "
                           "model FLOPs utilization (of the GPU's dense BF16 peak, also for FP32) in brackets; "
                           "r: cudaMalloc failed and was "
                           "retried in the timed steps (Limitations).", 3, "speed"),
        "per_token": _by_point(ctx, per_token, "Memory per token (KiB), the slope of the search's "
                               "line of peak allocated GPU memory against batch, divided by the sequence length (GPU memory "
                               "only: pinned host memory is not in it)"
                               + ("; -: the search tried fewer than two batches that fit, so no slope" if no_slope else "")
                               + "; OOM: batch 1 does not fit.", 4, "per-token"),
    }  # fmt: skip


def render_map_paper(table_csv, findings_json, search_paths, corpus_stats, token_meta, config,
                     figures_dir, templates_dir, out_md, out_tex, repeats_dir=None) -> None:  # fmt: skip
    """map.md.j2 -> out_md and map.tex.j2 -> out_tex; nothing is written unless both render."""
    import pandas as pd

    ctx = map_context(pd.read_csv(table_csv), read_json(findings_json), search_paths, corpus_stats,
                      token_meta, config, repeats_dir)  # fmt: skip
    ctx["tables"] = map_tables(ctx)
    templates = Path(templates_dir)
    md_env = make_environment(templates, False)
    md_env.filters.update(span=span, listed=listed)
    prose = render_prose(md_env, ctx, _render, SECTIONS, "map", None)
    texts = {}
    for out, template, latex, ext in ((out_md, "map.md.j2", False, "png"),
                                      (out_tex, "map.tex.j2", True, "pdf")):  # fmt: skip
        env = make_environment(templates, latex)
        env.filters.update(
            table=tables.latex if latex else tables.markdown, span=span, listed=listed
        )
        text = {name: both["tex" if latex else "md"] for name, both in prose.items()}
        figures = figure_paths(figures_dir, out, ext, MAP_FIGURE_NAMES)
        texts[Path(out)] = _render(env, template, {**ctx, "figures": figures, "prose": text})
    for out, text in texts.items():
        write_text(out, text)


def map_paper_from_results(study: dict, results: Path, data: Path, out: Path, templates: Path):
    """What `memopt paper` does for a map study: the table and findings again from the results
    (results/map.csv, results/map_findings.json), the figures, then the paper (out/paper.md,
    out/paper.tex), as the map rules do."""
    import os

    from memopt.errors import MemoptError
    from memopt.report.figures_style import render_all
    from memopt.report.map_figures import builders
    from memopt.report.map_results import aggregate_map

    points, names = map_points(study), point_models(study)
    searches = [
        results / "map" / p / "search" / f"{t}.json" for p in points for t in study["techniques"]
    ]
    cells = [
        results / "map" / p / "cells" / t / "max.json" for p in points for t in study["techniques"]
    ]
    missing = [str(p) for p in searches + cells if not p.exists()]
    if missing:
        raise MemoptError(f"{len(missing)} map result(s) missing under {results}: "
                          + ", ".join(missing[:5]) + " (is --config the map study's config?)")  # fmt: skip
    vocab = read_json(data / "tokens" / "meta.json")["vocab_size"]
    reference = map_reference(study)
    table = aggregate_map(points, names, list(study["techniques"]), vocab, results, reference)
    render_all(builders(table, reference), out / "figures", processes=os.cpu_count() or 1)
    render_map_paper(results / "map.csv", results / "map_findings.json", searches,
                     data / "corpus" / "stats.json", data / "tokens" / "meta.json", study,
                     out / "figures", templates, out / "paper.md", out / "paper.tex",
                     results.parent / "repeats")  # fmt: skip
