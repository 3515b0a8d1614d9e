"""The paper's tables against their sources: the change, breakdown, exactness, quality, search,
incremental-effects and stage tables equal summary.csv and the search files; the printed config."""

import json
import math
import statistics
from pathlib import Path

import pandas as pd
import yaml
from synthetic_study import (
    QUALITY_LOSS,
    TECHNIQUES,
    make_cell,
    md_table,
    render,
    render_cells,
)

from memopt.report.paper_format import config_yaml


def _f(value, decimals):
    return f"{value:,.{decimals}f}"


def _summary(study) -> pd.DataFrame:
    return pd.read_csv(study["summary"], dtype={"batch_entry": str})


def test_change_breakdown_and_exactness_tables_match_summary(study):
    text = render(study)[0].read_text()
    summary = _summary(study)
    ok = summary[summary["status"] == "ok"]
    base = ok[(ok["technique"] == "baseline") & (ok["batch_entry"] == "same")].iloc[0]
    changes = md_table(text, "memory reduction")  # Table 6: every ok non-baseline cell
    assert len(changes) == len(ok[ok["technique"] != "baseline"])
    for row in changes:
        cell = ok[(ok["technique"] == row["technique"]) & (ok["batch_entry"] == row["entry"])]
        cell = cell.iloc[0]
        assert row["batch"] == _f(cell["batch_size"], 0)
        mark = " †" if isinstance(cell["unstable"], str) else ""  # the per-cell table's mark
        assert row["speed-up"] == _f(cell["tokens_per_s"] / base["tokens_per_s"], 2) + "x" + mark
        saved = 100 * (1 - cell["peak_allocated_mib"] / base["peak_allocated_mib"])
        assert row["memory reduction"] == _f(saved, 1) + "%"
    breakdown = md_table(text, "optimizer state")  # Table 8: the ok cells at `same`
    same = ok[ok["batch_entry"] == "same"]
    assert [r["technique"] for r in breakdown] == list(same["technique"])
    columns = {
        "weights": "weights_mib",
        "gradients": "gradients_mib",
        "optimizer state": "optimizer_state_mib",
        "activations": "activations_mib",
        "output layer": "logits_mib",
        "its backward": "logits_grad_mib",
        "after forward": "phase_after_forward_mib",
        "after backward": "phase_after_backward_mib",
        "peak": "peak_allocated_mib",
    }
    for row, (_, cell) in zip(breakdown, same.iterrows()):
        for header, column in columns.items():
            assert row[header] == _f(cell[column], 0), (header, row)
    exact = md_table(
        text, "within tolerance"
    )  # Table 5: one function per technique here: references
    assert [(r["technique"], r["reference"], r["within tolerance"]) for r in exact] == [
        (t, "(itself)", "reference") for t in TECHNIQUES
    ]


def test_quality_table_states_spread_and_paired_verdicts(study):
    text = render(study)[0].read_text()
    rows = {r["function"]: r for r in md_table(text, "verdict")}
    assert list(rows) == ["fp32", "bf16", "bf16_w128"]  # the techniques' order
    for function, losses in QUALITY_LOSS.items():
        row = rows[function]
        assert row["seeds"] == "2"
        assert (
            row["val loss"] == f"{statistics.fmean(losses):,.4f} ± {statistics.stdev(losses):,.4f}"
        )
        ppl = [math.exp(v) for v in losses]
        assert row["val ppl"] == _f(statistics.fmean(ppl), 2)
        assert row["ppl range"] == f"{_f(min(ppl), 2)}–{_f(max(ppl), 2)}"
    assert rows["fp32"]["Δ val loss (95% CI)"] == "reference" and rows["fp32"]["verdict"] == ""
    assert rows["bf16"]["verdict"] == "inconclusive"  # paired differences 0.01 and 0.02
    assert rows["bf16_w128"]["verdict"] == "worse"  # 0.20 and 0.21
    # mean 0.015, sd 0.00707 over 2 seeds: t(0.975, 1) = 12.706 -> ± 0.0635; MDD with t(0.8, 1)
    assert rows["bf16"]["Δ val loss (95% CI)"] == "0.0150 [-0.0485, 0.0785]"
    assert rows["bf16"]["MDD"] == _f((12.7062 + 1.3764) * 0.005, 4)
    assert rows["bf16_w128"]["techniques"] == "local128"
    assert rows["bf16"]["kernel"] == "cudnn"


def test_search_table_matches_search_files(study):
    text = render(study)[0].read_text()
    rows = {r["technique"]: r for r in md_table(text, "max batch")}
    for path in study["searches"]:
        search = json.loads(Path(path).read_text())
        row = rows[search["technique"]]
        assert row["max batch"] == _f(search["max_batch"], 0)
        assert row["trials"] == str(len(search["trials"]))
        assert row["search time (s)"] == _f(search["seconds"], 1)


def test_the_printed_config_says_the_slack_the_searches_used():
    """Searches recorded before search.allocator_slack_mib counted only out of memory: the
    paper's config says 0 for them, not the default; newer searches' config is printed as is."""
    cfg = {"search": {"headroom_mib": 1024, "allocator_slack_mib": 256}}
    old, new = {"technique": "flash"}, {"technique": "flash", "allocator_slack_mib": 256.0}
    assert "allocator_slack_mib: 0\n" in config_yaml(cfg, [old, old]) + "\n"
    assert "allocator_slack_mib: 256\n" in config_yaml(cfg, [old, new]) + "\n"
    assert "allocator_slack_mib: 256\n" in config_yaml(cfg) + "\n"
    cfg["search"]["from_plan"] = True  # searches from before it: false, as they ran
    assert "from_plan: false\n" in config_yaml(cfg, [old]) + "\n"
    assert "from_plan: true\n" in config_yaml(cfg, [{**new, "plan_batch": None}]) + "\n"


def test_the_printed_config_lists_a_techniques_knobs_away_from_their_defaults():
    from memopt.config import validate_config

    cfg = validate_config({"techniques": {"base": {}, "fast": {"precision": "bf16",
                                                              "attention": "flash"}},
                           "baseline": "base"})  # fmt: skip
    assert len(cfg["techniques"]["fast"]) > 10  # validation fills every knob
    text = config_yaml(cfg)
    assert "  base: {}\n  fast:\n    precision: bf16\n    attention: flash\n" in text
    assert "checkpointing" not in text and "lr_scale" not in text
    assert yaml.safe_load(text)["model"] == cfg["model"]  # the rest as it is


def test_incremental_effects_table_matches_summary(study, tmp_path):
    """A study where two techniques differ in one knob (flash -> window 128): Table 7 has that
    pair, with numbers recomputed here from summary.csv."""
    cells = []
    for technique, spec in (("baseline", {}), ("flash", {"window": None, "attention": "flash"})):
        cell = make_cell("baseline" if technique == "baseline" else "local128", "same", 8)
        cell = {**cell, "technique": technique, "spec": {**cell["spec"], **spec}}
        cell["kernel"] = cell["spec"]["attention"]
        if technique == "flash":
            cell.update(tokens_per_s=9000.5, peak_allocated_mib=9999.25, val_ppl=240.125)
        cells.append(cell)
    cells.append(make_cell("local128", "same", 8))
    out_md, _ = render_cells(study, tmp_path, cells)
    rows = md_table(out_md.read_text(), "knob")
    assert [(r["technique"], r["over"], r["knob"]) for r in rows] == [
        ("local128", "flash", "attention")
    ]
    summary = pd.read_csv(tmp_path / "summary.csv").set_index("technique")
    new, old = summary.loc["local128"], summary.loc["flash"]
    assert rows[0]["change"] == "flash → flex + window 128"
    assert rows[0]["speed-up"] == _f(new["tokens_per_s"] / old["tokens_per_s"], 2) + "x"
    saved = 100 * (1 - new["peak_allocated_mib"] / old["peak_allocated_mib"])
    assert rows[0]["memory reduction"] == _f(saved, 1) + "%"


def test_stage_times_and_reference_comparison(study, tmp_path):
    bench = tmp_path / "benchmarks"
    seconds = {"corpus.tsv": 13.79, "tokens.tsv": 7.25, "search/a.tsv": 20.5, "search/b.tsv": 1.25}
    # Techniques named like stages stay in their own stage.
    seconds |= {"cell/a/same.tsv": 100.0, "cell/tokens/max.tsv": 50.5, "search/corpus.tsv": 0.5}
    seconds |= {"aggregate.tsv": 0.75, "figures.tsv": 7.5}  # the paper stage
    for name, value in seconds.items():
        (bench / name).parent.mkdir(parents=True, exist_ok=True)
        (bench / name).write_text(f"s\th:m:s\tmax_rss\n{value}\t0:00:00\t1.0\n")
    (bench / "render.tsv").write_text("s\th:m:s\n9.0\t0:00:09\n")  # rendering: left out
    reference = tmp_path / "reference.yaml"
    reference.write_text(
        "reports:\n"
        "  - id: other-gpu\n    source: r.md\n    gpu: A100\n    results:\n"
        "      - {memopt: baseline, batch: same, batch_size: 32, max_batch: 32,"
        " peak_memory_raw: '40,000 MB'}\n"
        "      - {memopt: local128, batch: same, batch_size: 32, max_batch: 80,"
        " peak_memory_raw: '10,000 MB', speedup_vs_baseline: 1.5}\n"
        "      - {memopt: local128, batch: max, batch_size: 80, peak_memory_raw: '39 GB'}\n"
    )
    from memopt.report.stages import stage_benchmarks

    out_md, _ = render(
        study, name="timed", benchmark_paths=stage_benchmarks(bench), reference_path=reference
    )
    text = out_md.read_text()
    stages = {r["stage"]: r for r in md_table(text, "jobs")}
    assert list(stages) == ["corpus", "tokens", "searches", "cells", "paper", "total"]
    assert stages["searches"]["jobs"] == "3" and stages["searches"]["time (s)"] == "22.2"
    assert stages["corpus"]["jobs"] == "1" and stages["cells"]["jobs"] == "2"
    assert stages["paper"]["jobs"] == "2" and stages["paper"]["time (s)"] == "8.2"
    assert stages["total"]["time (s)"] == _f(sum(seconds.values()), 1)
    (row,) = md_table(text, "their batch")
    summary = _summary(study).set_index(["technique", "batch_entry"])
    ours = (
        summary.loc[("local128", "same")]["tokens_per_s"]
        / summary.loc[("baseline", "same")]["tokens_per_s"]
    )
    assert row["speed-up (theirs / ours against FP32, and TF32)"] == f"1.50x / {ours:,.2f}x"
    assert row["memory reduction (theirs / ours)"].startswith("75.0% / ")
    # max batch: theirs 80 / 32; ours local128 24 / baseline 8 (the synthetic searches)
    assert row["max batch vs baseline (theirs / ours)"] == "2.50x / 3.00x"
