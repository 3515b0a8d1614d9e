"""Other published studies the default paper summarizes in sections of their own (config
`paper.map`, `paper.quality`: a study folder with its config.yaml, results/, data/ and paper/):
the map's abstract and findings, rendered by the map paper's own templates from its results, with
its figures; the quality study's verdicts, computed from its quality runs as its own paper does.
The numbers come from the linked study's files when this paper renders; the map's figure of
maxima by length is copied into this paper's figures folder, so that the paper renders the same
wherever it is."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import yaml

from memopt.errors import MemoptError
from memopt.report.paper_format import make_environment, num
from memopt.report.results import read_json
from memopt.report.tables import Table

MAP_FIGURES = ("map_tokens_by_length",)  # the by-size figure stays in the map's own paper


def _study(root: Path, key: str, needs: tuple[str, ...]) -> dict:
    from memopt.config import validate_config

    missing = [n for n in ("config.yaml", *needs) if not (root / n).exists()]
    if missing:
        raise MemoptError(
            f"paper.{key}: {root} is not a published study folder (missing {', '.join(missing)});"
            " allowed: a folder with the study's config.yaml, results/ and data/, or null"
        )
    return validate_config(yaml.safe_load((root / "config.yaml").read_text()))


def _bridge(config: dict, theirs: dict) -> dict:
    """How the map's setting meets this study's: its techniques that are this study's under
    another name (the same knobs, every default filled), those named as one of this study's
    but with other knobs (and which), the model keys its points share that differ from this
    study's model, and the search and measure settings that differ."""
    from memopt.config import full_spec, validate_config

    # every default filled on both sides, each technique and the model checked alone
    ours = {t: full_spec(k) for t, k in config["techniques"].items()}
    mapped = {t: full_spec(k) for t, k in theirs["techniques"].items()}
    alone = {"model": config["model"], "techniques": {"t": {}}, "baseline": "t",
             **{sec: config[sec] for sec in ("search", "measure") if config.get(sec)}}  # fmt: skip
    mine = validate_config(alone)
    here = mine["model"]
    pairs = [{"map": m, "here": h} for m, spec in mapped.items()
             for h, mine in ours.items() if mine == spec]  # fmt: skip
    same = [p for p in pairs if p["map"] != p["here"]]
    differs = [{"name": m, "knobs": sorted(k for k in spec.keys() | ours[m].keys()
                                           if spec.get(k) != ours[m].get(k))}
               for m, spec in mapped.items() if m in ours and ours[m] != spec]  # fmt: skip
    model = [{"key": k, "map": v, "here": here.get(k)}
             for k, v in theirs["model"].items() if k != "seq_len" and here.get(k) != v]  # fmt: skip
    # the search's and the timing's settings (every default filled on both sides)
    settings = [{"key": f"{sec}.{k}", "map": theirs[sec].get(k), "here": mine[sec].get(k)}
                for sec in ("search", "measure") for k in sorted(theirs[sec].keys() | mine[sec].keys())
                if theirs[sec].get(k) != mine[sec].get(k)]  # fmt: skip
    return {"pairs": pairs, "same": same, "differs": differs, "model": model, "settings": settings}


def _above_everywhere(table, names: list[str]) -> list[tuple[str, str]]:
    """(a, b) for the map's techniques in `names` where a's maximum tokens per step is above b's
    at every point that measured both (and there is at least one)."""
    wide = table.pivot(index="point", columns="technique", values="max_tokens").fillna(0)
    return [(a, b) for a in names for b in names
            if a != b and a in wide and b in wide and (wide[a] > wide[b]).all()]  # fmt: skip


def _map(root: Path, templates: Path, render, config: dict) -> dict:
    import pandas as pd

    from memopt.map_points import map_points
    from memopt.report.map_paper import listed, map_context, span
    from memopt.report.paper_prose import render_prose

    map_config = _study(root, "map", ("results/map.csv", "results/map_findings.json"))
    searches = [root / "results/map" / p / "search" / f"{t}.json"
                for p in map_points(map_config) for t in map_config["techniques"]]  # fmt: skip
    table = pd.read_csv(root / "results/map.csv")
    ctx = map_context(table,
                      read_json(root / "results/map_findings.json"), searches,
                      root / "data/corpus/stats.json", root / "data/tokens/meta.json", map_config,
                      root / "repeats")  # fmt: skip
    # in another paper: no protocol sentence, and no memory shares or throughput (their figure
    # and tables stay in the map's own paper)
    ctx["linked"] = True
    env = make_environment(templates, False)
    env.filters.update(span=span, listed=listed)
    bridge = _bridge(config, map_config)
    prose = render_prose(env, ctx, render, ("abstract", "findings"), "map", None)
    return {"path": root.as_posix(), "prose": prose, "models": ctx["models"],
            "points": ctx["points"], "figures_dir": root / "paper" / "figures",
            "reference": ctx["reference"], "techniques": ctx["techniques"],
            "gpu": ctx["device"]["name"], "commits": ctx["where"]["commits"], **bridge,
            "above": _above_everywhere(table, [p["map"] for p in bridge["pairs"]])}  # fmt: skip


def _quality(root: Path) -> dict:
    from memopt.report.paper_inputs import _quality_runs
    from memopt.report.verdicts import quality_table

    config = _study(root, "quality", ("results/quality.csv",))
    runs = _quality_runs(root / "results/quality.csv")
    q = quality_table(runs, config["techniques"], config["baseline"], config["quality"]["margin"])
    rows = q["rows"]  # every function, those without a finished run too (their verdict says so)

    def delta(p):
        interval = f" [{num(p['lo'], 3)}, {num(p['hi'], 3)}]" if p["lo"] is not None else ""
        return num(p["mean"], 3) + interval

    body = [[f"`{r['function']}`", ", ".join(f"`{t}`" for t in r["techniques"]),
             "reference" if r["function"] == q["reference_function"]
             else delta(r["paired"]) if r.get("paired") else "n/a",
             num(r["paired"]["mdd"], 3) if r.get("paired") and r["paired"]["mdd"] else "",
             r["verdict"] or ""] for r in rows]  # fmt: skip
    gpus = sorted({r.get("provenance_gpu") for r in runs if r.get("provenance_gpu")})
    tokens = next((r["tokens"] for r in runs if r.get("tokens")), None)
    caption = (
        f"the quality study ({root.as_posix()}): each function's paired difference of validation "
        f"loss from `{q['reference_function']}` (nats, mean [95% interval] over "
        f"{config['quality']['seeds']} seeds of {num(tokens, 0)} tokens each), its minimum "
        f"detectable difference and its verdict against ±{num(q['margin'], 3)}; techniques as that "
        "study's config names them."
    )
    table = Table(["function", "techniques", "Δ val loss", "MDD", "verdict"], "llrrl", body,
                  caption, None, "linked-quality")  # fmt: skip
    from memopt.report.quality_paper import _family  # the quality paper's own check

    family = _family({"quality": q, "quality_runs": runs})  # the verdicts as one family
    return {"path": root.as_posix(), "quality": q, "rows": rows, "table": table, "gpus": gpus,
            "tokens": tokens, "seeds": config["quality"]["seeds"], "model": config["model"],
            "family": family}  # fmt: skip


def linked_studies(config: dict, templates: Path, render) -> dict:
    """{"map": ..., "quality": ...} for the studies `paper.map` and `paper.quality` name."""
    links = config.get("paper") or {}
    out = {}
    if links.get("map"):
        out["map"] = _map(Path(links["map"]), Path(templates), render, config)
    if links.get("quality"):
        out["quality"] = _quality(Path(links["quality"]))
    return out


def linked_figures(linked: dict, figures_dir: Path, out: Path, ext: str) -> dict[str, str]:
    """The linked map's figures as .ext files in this paper's own `figures_dir` (where
    copy_linked_figures puts them), relative to the paper file `out`: the paper reads the same
    wherever it is rendered, and its folder holds every figure it shows."""
    paths = _map_figures(linked, ext)
    missing = [str(p) for p in paths.values() if not p.exists()]
    if missing:
        raise MemoptError(f"paper.map: figure not found: {', '.join(missing)} (render that "
                          "study's paper first)")  # fmt: skip
    return {n: Path(os.path.relpath(Path(figures_dir) / f"{n}.{ext}", Path(out).parent)).as_posix()
            for n in paths}  # fmt: skip


def copy_linked_figures(linked: dict, figures_dir: Path) -> None:
    """Copy the linked map's figures (.png and .pdf) into `figures_dir`."""
    for ext in ("png", "pdf"):
        for name, path in _map_figures(linked, ext).items():
            shutil.copyfile(path, Path(figures_dir) / f"{name}.{ext}")


def _map_figures(linked: dict, ext: str) -> dict[str, Path]:
    """The linked map's figures as .ext files where its paper drew them ({} without a map)."""
    if "map" not in linked:
        return {}
    return {n: linked["map"]["figures_dir"] / f"{n}.{ext}" for n in MAP_FIGURES}


def linked_prose(linked: dict, context: dict, templates: Path, render) -> dict[str, dict]:
    """Per format ("md", "tex"), the linked studies' text: the map's sections and captions, and
    the quality study's summary (paper/templates/_linked_quality.md.j2), written once in Markdown."""
    from memopt.report.paper_format import md_to_tex

    out = {"md": {}, "tex": {}}
    if "map" in linked:
        for fmt in out:
            out[fmt]["map"] = {name: both[fmt] for name, both in linked["map"]["prose"].items()}
    if "map" in linked:  # where the map's setting meets this study's
        text = render(make_environment(templates, False), "_linked_map.md.j2", context).strip()
        out["md"]["map"]["bridge"], out["tex"]["map"]["bridge"] = text, md_to_tex(text)
    if "quality" in linked:
        text = render(make_environment(templates, False), "_linked_quality.md.j2", context).strip()
        out["md"]["quality_summary"], out["tex"]["quality_summary"] = text, md_to_tex(text)
    return out
