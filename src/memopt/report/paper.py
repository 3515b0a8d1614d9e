"""Render the paper (Markdown and LaTeX) from the study's results with Jinja2 templates.

All numbers reach the templates through one context dict built here; templates only format them
(filters, environment and the PDF build: memopt.report.paper_format).
StrictUndefined makes a misspelt or missing value a render error instead of an empty string, so a
paper can never silently lack a number.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import jinja2

from memopt.errors import MemoptError
from memopt.report import paper_tables, tables
from memopt.report.effects import analysis, incremental_effects
from memopt.report.noise import noise_rule
from memopt.report.paper_analysis import (
    add_hfu,
    add_tf32_speedups,
    findings,
    recommendations,
    tf32_reference,
)
from memopt.report.paper_figrefs import number_figures
from memopt.report.paper_format import config_yaml, make_environment
from memopt.report.paper_gpus import gpus_used
from memopt.report.paper_inputs import (
    _cells,
    _provenance,
    _quality_runs,
    _search,
    _techniques,
    flops_summary,
)
from memopt.report.paper_links import (
    copy_linked_figures,
    linked_figures,
    linked_prose,
    linked_studies,
)
from memopt.report.paper_literature import citations
from memopt.report.paper_mechanisms import mechanisms
from memopt.report.paper_prose import render_prose
from memopt.report.paper_reference import reference_comparison
from memopt.report.quality_paper import SECTIONS as QUALITY_SECTIONS
from memopt.report.quality_paper import figure_names as quality_figures
from memopt.report.quality_paper import quality_context, quality_focus
from memopt.report.results import (
    FIGURE_NAMES,
    capped_techniques,
    ok_cells,
    read_json,
    relative_to_baseline,
    stopped_at_time_limit,
    write_text,
)
from memopt.report.stages import stage_times
from memopt.report.verdicts import exactness, measurement_share, quality_table, throughput_optimal
from memopt.runtime.flops import param_count


def build_context(
    summary_csv,
    search_paths,
    corpus_stats,
    token_meta,
    config,
    benchmark_paths=(),
    reference_path: Path | None = None,
    quality_csv: Path | None = None,
    exactness_paths=(),
) -> dict:
    """Everything the templates may use, except the figure paths (figure_paths: per format).

    benchmark_paths: Snakemake benchmark files of the stages (wall-clock per stage, appendix);
    reference_path: the YAML of earlier reports' numbers (comparison table), if any;
    quality_csv: the quality runs (results/quality.csv); exactness_paths: the exactness runs."""
    cells = _cells(Path(summary_csv))
    tokens = read_json(token_meta)
    if "model" in config and "vocab_size" in tokens:
        add_hfu(cells, config["model"], tokens["vocab_size"])
    # Search tables follow the cells' technique order, whatever order the paths came in.
    rank = {t: i for i, t in enumerate(dict.fromkeys(c["technique"] for c in cells))}
    searches = sorted(
        (_search(Path(p)) for p in search_paths), key=lambda s: rank.get(s["technique"], len(rank))
    )
    corpus = {"license": None, "description": None, **read_json(corpus_stats)}
    try:
        model = {**config["model"], "params": param_count(config["model"], tokens["vocab_size"])}
        baseline = config["baseline"]
    except KeyError as e:
        raise MemoptError(f"config or token meta lacks key {e} needed by the paper") from None
    # Device and step counts as the cells recorded them (an oom cell has no step counts).
    first_ok = next((c for c in cells if c["status"] == "ok"), cells[0] if cells else {})
    relative = relative_to_baseline(cells, baseline)
    gpu = first_ok.get("device") == "cuda"  # a CPU run: no GPU words, no TF32 (a CPU has none)
    tf32 = tf32_reference(cells, baseline) if gpu else None
    add_tf32_speedups(relative, cells, tf32)
    runs = _quality_runs(quality_csv)
    stages = stage_times(benchmark_paths)
    timed = [c["timed_steps"] for c in cells if c.get("timed_steps") is not None]
    at_time = stopped_at_time_limit(cells, config["measure"])
    quality = quality_table(runs, config["techniques"], baseline, config["quality"]["margin"])
    exact = exactness(
        [read_json(Path(p)) for p in exactness_paths],
        config["techniques"],
        config["exactness"]["tolerance"],
        config["exactness"].get("floor_factor")
        if config["exactness"].get("floor", "none") != "none"
        else None,
        config["exactness"].get("floor", "none"),
    )
    return {
        "cells": cells,
        "techniques": _techniques(cells),
        "baseline": baseline,
        "compared": [t for t in dict.fromkeys(c["technique"] for c in cells) if t != baseline],
        "searches": searches,
        "from_plan": any(s.get("plan_batch") is not None for s in searches),  # its first trial
        "corpus": corpus,
        "tokens": tokens,
        "config": config,
        "model": model,
        "flops": flops_summary(config["model"], tokens["vocab_size"], cells),
        "train": config.get("train", {}),
        "warm_worker": bool(config.get("worker", {}).get("enabled")),
        "device": {"type": first_ok.get("device"), "name": first_ok.get("device_name")},
        "gpu": gpu,
        "hw": "GPU" if gpu else "CPU",
        "measured": {
            "warmup_steps": first_ok.get("warmup_steps"),
            "timed_min": min(timed) if timed else None,
            "timed_max": max(timed) if timed else None,
            "at_max": sum(
                c["timed_steps"] >= config["measure"]["max_timed_steps"]
                for c in cells
                if c.get("timed_steps") is not None and not c.get("measured_as")
            ),
            "at_time": at_time,
            "at_time_list": ", ".join(
                f"{c['technique']} at {c['batch_size']:,} ({100 * c['step_time_ms_rel_ci95']:.1f}%)"
                for c in at_time
            ),
        },
        "retries": [  # each run once: a `max` entry that is its `same` run is not listed again
            c
            for c in cells
            if not c.get("measured_as")
            and ((c.get("allocator_alloc_retries") or 0) > 0 or (c.get("allocator_ooms") or 0) > 0)
        ],
        "noise_rule": noise_rule(gpu),  # the one rule every speed comparison uses (Method)
        "findings": findings(cells, searches, baseline),
        "quality": quality,
        "recommendations": recommendations(
            cells,
            quality,
            baseline,
            capped_techniques(searches),
        ),
        "quality_runs": runs,
        # what each quality run trained: quality.tokens rounded up to whole steps (null: an epoch)
        "quality_tokens": next((r["tokens"] for r in runs if r.get("tokens")), None),
        "exactness": exact,
        "mechanisms": mechanisms(
            cells, baseline, exact["rows"], {**config["model"], "vocab": tokens["vocab_size"]}
        ),
        "optimal": throughput_optimal(cells, searches, config["model"]["seq_len"]),
        "relative": relative,
        "tf32": tf32,
        # Earlier reports ran GPUs: a CPU run's ratios are not set beside them.
        "references": reference_comparison(reference_path, relative, searches, baseline)
        if gpu
        else {"reports": [], "rows": []},
        "stages": stages,
        "share": measurement_share(stages, cells, runs),
        "analysis": analysis(cells),
        "config_yaml": config_yaml(config, searches),
        "increments": incremental_effects(cells),
        "same_cells": list(ok_cells(cells).values()),
        "provenance": _provenance(cells),
        "where": gpus_used(cells, searches, runs),
    }


def figure_paths(figures_dir: Path, out_path: Path, ext: str, names=FIGURE_NAMES) -> dict[str, str]:
    """Each figure's .ext file, relative to the paper file that shows it."""
    figures = {}
    for name in names:
        path = Path(figures_dir) / f"{name}.{ext}"
        if not path.exists():
            raise MemoptError(f"{path}: figure not found (run the figures step first)")
        figures[name] = Path(os.path.relpath(path, Path(out_path).parent)).as_posix()
    return figures


def _render(env: jinja2.Environment, name: str, context: dict) -> str:
    try:
        return env.get_template(name).render(context)
    except jinja2.TemplateNotFound as e:
        raise MemoptError(f"template {e.name} not found in {env.loader.searchpath}") from None
    except jinja2.UndefinedError as e:
        raise MemoptError(f"template {name}: {e.message}") from None
    except jinja2.TemplateSyntaxError as e:
        raise MemoptError(f"template {e.name or name}, line {e.lineno}: {e.message}") from None


def render_paper(
    summary_csv: Path,
    search_paths: list[Path],
    corpus_stats: Path,
    token_meta: Path,
    config: dict,
    figures_dir: Path,
    templates_dir: Path,
    out_md: Path,
    out_tex: Path,
    *,
    benchmark_paths=(),
    reference_path: Path | None = None,
    quality_csv: Path | None = None,
    exactness_paths=(),
) -> None:
    """Render paper.md.j2 -> out_md and paper.tex.j2 -> out_tex; nothing is written unless both
    render, so a failed render never leaves one format newer than the other."""
    context = build_context(
        summary_csv,
        search_paths,
        corpus_stats,
        token_meta,
        config,
        benchmark_paths=benchmark_paths,
        reference_path=reference_path,
        quality_csv=quality_csv,
        exactness_paths=exactness_paths,
    )
    context["tables"] = paper_tables.build(context)  # defined once, rendered to both formats
    name, names, prose_args = "paper", FIGURE_NAMES, {}
    if quality_focus(config):  # a study of quality: its own paper (memopt.report.quality_paper)
        context |= quality_context(context)
        name, names = "quality", quality_figures(context)
        prose_args = {"sections": QUALITY_SECTIONS, "folder": "quality"}
    else:
        context["linked"] = linked_studies(config, Path(templates_dir), _render)
        if "quality" in context["linked"]:  # its verdicts' table, numbered in the order (tables)
            lq = context["linked"]["quality"]
            lq["table"] = replace(lq["table"], number=context["tn"].get("linked_quality"))
    cite, context["cited"] = citations(Path(templates_dir).parent / "literature.yaml")
    linked = linked_prose(context.get("linked", {}), context, Path(templates_dir), _render)
    prose = render_prose(
        make_environment(Path(templates_dir), False),
        {**context, "cite": cite},
        _render,
        **prose_args,
    )
    texts = {}
    for out, template, latex, ext in (
        (out_md, f"{name}.md.j2", False, "png"),
        (out_tex, f"{name}.tex.j2", True, "pdf"),
    ):
        figures = figure_paths(figures_dir, out, ext, names)
        figures |= linked_figures(context.get("linked", {}), figures_dir, out, ext)
        env = make_environment(Path(templates_dir), latex)
        env.filters["table"] = tables.latex if latex else tables.markdown
        text = {name: both["tex" if latex else "md"] for name, both in prose.items()}
        texts[Path(out)] = _render(env, template, {**context, "figures": figures, "prose": text,
                                                   "linked_prose": linked["tex" if latex else "md"]})  # fmt: skip
    if name == "paper":  # its figures numbered and each referred to (memopt.report.paper_figrefs)
        texts[Path(out_md)], texts[Path(out_tex)] = number_figures(texts[Path(out_md)],
                                                                   texts[Path(out_tex)])  # fmt: skip
    copy_linked_figures(context.get("linked", {}), figures_dir)
    for out, text in texts.items():
        write_text(out, text)
