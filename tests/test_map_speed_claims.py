"""How far the map paper's speed claims go (memopt.report.map_claims, map_results and the
templates), from the review of the 7-point H200 draft (issue 37): a ratio at its own maximum is
set beside its FLOP rate, recomputation counted, not called "near" a share it may be far from; the
widest interval behind it is named; the repeats say which point they cover; a same-batch ratio
says whether one cell retried or both; and tokens/s are not ranked across model sizes."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from test_map_claims import base, copy, edit, render, row  # noqa: F401 (base: a fixture)
from test_map_repeats import paragraph, write_repeats

from memopt.report.map_claims import (
    at_once,
    own_max_speeds,
    point_spans,
    recompute_share,
    retry_room,
    time_groups,
)
from memopt.report.map_paper import _group_machines
from memopt.report.map_results import map_row, same_batch_speed


def test_own_maximum_speeds_carry_the_flop_rate_and_the_widest_interval():
    rows = [{**row(p, t, 1), "tokens_per_s": v, "rel_ci95": ci, "cell_status": "ok"}
            for p, t, v, ci in
            (("a", "flash", 100.0, 0.054), ("a", "ckpt", 85.0, 0.004),
             ("b", "flash", 100.0, 0.003), ("b", "ckpt", 76.0, 0.012))]  # fmt: skip
    shares = {"ckpt": {"min": 0.75, "max": 0.8, "by_point": {"a": 0.75, "b": 0.8}}}
    got = own_max_speeds(rows, ["ckpt"], "flash", shares, 0.01)[0]
    # 0.85 / 0.75 at a, 0.76 / 0.8 at b: one point above the reference's FLOP rate, one below
    assert got["rate"]["min"] == pytest.approx(0.95) and got["rate"]["max"] == pytest.approx(
        0.85 / 0.75
    )
    # the reference's cell at a is the widest behind these ratios, past the 1% target
    assert got["wide"]["max"] == 0.054 and got["wide"]["n"] == 2
    assert (got["wide"]["worst"]["point"], got["wide"]["worst"]["technique"]) == ("a", "flash")
    assert own_max_speeds(rows, ["ckpt"], "flash", shares, 0.06)[0]["wide"] is None
    # without the shares of every point, no rate (a range over some points would say too much)
    assert (
        own_max_speeds(rows, ["ckpt"], "flash", {"ckpt": {"by_point": {"a": 0.75}}})[0]["rate"]
        is None
    )
    assert own_max_speeds(rows, ["ckpt"], "flash")[0]["rate"] is None


def test_the_recomputed_share_is_kept_per_point():
    model = {"n_layers": 2, "d_model": 64, "n_heads": 4, "d_ff": 256, "seq_len": 32,
             "arch": "llama", "n_kv_heads": 2, "dropout": 0.0}  # fmt: skip
    spec = {"precision": "bf16", "attention": "flash", "checkpointing": "full", "loss": "standard",
            "window": None}  # fmt: skip
    got = recompute_share({"short": model, "long": {**model, "seq_len": 256}}, spec, 512)
    assert set(got["by_point"]) == {"short", "long"}
    assert got["min"] == min(got["by_point"].values()) < got["max"] == max(got["by_point"].values())


def test_a_same_batch_ratio_says_whether_both_cells_retried():
    def cell(point, technique, retries):
        return {"point": point, "technique": technique, "max_batch": 4, "tokens_per_s": 100.0,
                "cell_status": "ok", "alloc_retries": retries}  # fmt: skip

    table = pd.DataFrame([cell("p", "flash", 3), cell("p", "win", 2),
                          cell("q", "flash", 3), cell("q", "win", 0)])  # fmt: skip
    got = {f["point"]: f for f in same_batch_speed(table, "win", "flash")}
    assert got["p"]["retried"] and got["p"]["both"]
    assert got["q"]["retried"] and not got["q"]["both"]


def test_the_paper_names_the_widest_interval_and_the_flop_rate(base, tmp_path):  # noqa: F811
    root = copy(base, tmp_path)
    edit(root, "gpt2_s_32", "flash", "cell", lambda d: d.update(step_time_ms={"rel_ci95": 0.054}))
    md = render(root)
    abstract = md.split("## Abstract")[1].split("## 1")[0]
    assert "`flash`'s tokens/s (95% intervals up to 5.4% of a cell's mean, `flash`'s at `gpt2_s_32`;" \
        in abstract  # fmt: skip
    assert "and counting them its FLOP rate was 5.33× `flash`'s, at a larger batch" in abstract
    assert "near the" not in abstract
    findings = md.split("## 4 Findings")[1].split("## 5")[0]
    assert "The widest 95% interval among these cells is 5.4% of the mean (`flash` at " \
           "`gpt2_s_32`)." in findings  # fmt: skip
    # tokens/s are not ranked across model sizes: the highest MFU is named instead
    assert "The highest throughput at a maximum" not in findings
    assert "**Throughput.** The highest MFU at a maximum is `" in findings
    limits = md.split("## 5 Limitations")[1].split("## 6")[0]
    assert "The GPT-2-style model (`gpt2_s`) and the Llama-style models (`llama_s` and " \
           "`llama_m`) differ in block as well as size" in limits  # fmt: skip


def test_the_repeats_say_which_point_they_cover(base, tmp_path):  # noqa: F811
    root = copy(base, tmp_path)
    write_repeats(root, {"flash": [(36000.0, 0), (36036.0, 0)]})
    said = paragraph(root)
    # the repeats hold the rule at one of the map's 6 points: said so
    assert ", each cell's runs within noise of each other by the rule." in said
    assert said.count(" The repeats cover `llama_s_32` alone.") == 1


# The review of the 9-point H200 draft (issue 37): a ratio at each technique's own maximum is
# "below" the reference's only past the same-batch rule; the retried cells' step spread and room
# left are said; the groups that share a GPU ran on one machine.


def test_below_at_own_maxima_takes_the_speed_rule_and_the_retries():
    def rows(ratio, retries):
        return [{**row("a", "flash", 1), "tokens_per_s": 100.0, "alloc_retries": retries},
                {**row("a", "ckpt", 1), "tokens_per_s": 100.0 * ratio, "alloc_retries": 0}]  # fmt: skip

    def below(ratio, retries):
        return own_max_speeds(rows(ratio, retries), ["ckpt"], "flash")[0]

    # no intervals here: the noise is 0, or 0.14 where the reference retried
    assert below(0.9, 0)["below"] and below(0.9, 0)["under"]
    assert not below(0.9, 4)["below"] and below(0.9, 4)["under"]  # the reference retried
    assert below(0.8, 4)["below"]  # more than 14% below
    assert below(1.2, 4)["above"] and not below(1.15, 4)["above"]
    # the pairs behind the range's ends: one sequence apart where the technique's batch is 2
    two = rows(0.9, 4) + [{**row("b", "flash", 1), "tokens_per_s": 100.0, "alloc_retries": 0},
                          {**row("b", "ckpt", 2), "tokens_per_s": 120.0, "alloc_retries": 0}]  # fmt: skip
    ends = own_max_speeds(two, ["ckpt"], "flash")[0]["ends"]
    assert ends == [{"point": "a", "retried": True, "noise": 0.14, "one_more": False},
                    {"point": "b", "retried": False, "noise": 0.0, "one_more": True}]  # fmt: skip


def test_retry_room_says_how_far_retried_steps_spread_and_whether_retries_track_the_room():
    def cell(point, retries, free, spread):
        return {"point": point, "technique": "t", "tokens_per_s": 1.0, "alloc_retries": retries,
                "free_mib": free, "step_spread": spread}  # fmt: skip

    rows = [cell("a", 3, 500.0, 1.5), cell("b", 2, 900.0, 1.2), cell("c", 0, 300.0, 1.01),
            cell("d", 0, 5000.0, 1.03), cell("e", 0, 9000.0, 1.02)]  # fmt: skip
    got = retry_room(rows)
    assert got["free_max"] == 900.0 and got["n"] == 2
    assert (got["near"], got["clean_near"]) == (3, 1)  # a, b and c left at most 900 MiB
    assert not got["tracks"]  # one of the three did not retry: more than a quarter
    assert got["spread"]["point"] == "a" and got["clean_spread"] == 1.03
    got = retry_room(rows[:2] + rows[3:])  # without c: every cell that left little retried
    assert got["tracks"]
    assert not retry_room(rows[:2])["tracks"]  # no cell left more: nothing to compare with
    assert retry_room([cell("c", 0, 300.0, 1.01)]) is None


def test_groups_that_share_a_gpu_ran_on_one_machine():
    a, b, c, d = ("a", "X"), ("b", "Y"), ("c", "X"), ("d", "Z")
    assert _group_machines([[a, b], [c], [d]]) == 2
    assert _group_machines([[a], [b], [d]]) == 3
    assert _group_machines([[a, d], [b], [c, b]]) == 1


def test_a_point_on_two_gpus_has_a_span_on_each(tmp_path):
    """A point whose techniques ran on two machines (STUDY_PARTIAL=pairs) did not run all the
    time between: a point run meanwhile is a group of its own, not one run at the same time."""

    def write(point, technique, start, end, gpu):
        path = tmp_path / "map" / point / "search" / f"{technique}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        when = {
            "started": f"2026-11-29T09:{start:02d}:00Z",
            "finished": f"2026-11-29T09:{end:02d}:00Z",
        }
        path.write_text(json.dumps({"provenance": when | {"gpu_uuid": gpu}}))
        return path

    paths = [
        write("e", "t", 0, 10, "X"),
        write("e", "u", 40, 50, "Y"),
        write("f", "t", 20, 30, "Z"),
    ]
    spans = point_spans(paths, [json.loads(p.read_text()) for p in paths], lambda p: {})
    assert spans == {("e", "X"): (spans[("e", "X")][0], spans[("e", "X")][0] + 600),
                     ("e", "Y"): (spans[("e", "X")][0] + 2400, spans[("e", "X")][0] + 3000),
                     ("f", "Z"): (spans[("e", "X")][0] + 1200, spans[("e", "X")][0] + 1800)}  # fmt: skip
    assert at_once(spans) == 1
    groups = time_groups(spans)
    assert groups == [[("e", "X")], [("f", "Z")], [("e", "Y")]]
    assert _group_machines(groups) == 3


def test_a_row_keeps_the_room_left_and_the_step_spread():
    model = {"n_layers": 2, "d_model": 64, "n_heads": 4, "d_ff": 256, "seq_len": 32,
             "arch": "gpt2", "dropout": 0.0}  # fmt: skip
    search = {"technique": "t", "status": "ok", "max_batch": 4, "trials": [], "seconds": 1.0,
              "budget_mib": 1000.0, "fit": {}}  # fmt: skip
    cell = {"status": "ok", "peak_allocated_mib": 750.0, "step_times_ms": [100.0, 150.0, 120.0]}
    got = map_row("p", "m", model, 512, search, cell)
    assert got["free_mib"] == 250.0 and got["step_spread"] == 1.5
    got = map_row("p", "m", model, 512, search, {"status": "failed"})
    assert got["free_mib"] is None and got["step_spread"] is None


def test_the_paper_gives_the_retried_step_spread_and_table_4_caption_its_marks(base, tmp_path):  # noqa: F811
    root = copy(base, tmp_path)
    md = render(root)
    # fp32's search at gpt2_s_64 drew no line ("-" in Table 4), so the caption says what - is
    assert "; -: the search tried fewer than two batches that fit, so no slope; OOM" in md
    # in this fixture 5 of the 23 timed cells retried, and all 23 left as little: no link said
    assert "goes with how close the rounding" not in md
    edit(
        root,
        "llama_m_32",
        "offload",
        "cell",
        lambda d: d.update(step_times_ms=[100.0] * 8 + [150.0] * 3),
    )  # a retried cell
    line = json.loads((root / "results/map/gpt2_s_64/search/flash.json").read_text())["fit"]
    edit(root, "gpt2_s_64", "fp32", "search", lambda d: d.update(fit=line))
    md = render(root)
    speed = md.split("**Speed at")[1].split("\n\n")[0]
    assert "Within one cell that retried, the slowest timed step took up to 1.50× the fastest " \
           "(`offload` at `llama_m_32`), so how a run's steps fall between the slow path and the " \
           "fast one could move its mean by up to that much; the rule's 14% rests on how far reruns " \
           "moved such cells, not on this bound; " \
           "every faster-or-slower verdict below comes from two cells that did not retry." \
        in speed  # fmt: skip
    assert "-: the search tried fewer than two batches" not in md  # every search drew a line
    # a spread within the rule's 14% for a retried cell: nothing to set against it
    edit(root, "llama_m_32", "offload", "cell",
         lambda d: d.update(step_times_ms=[100.0] * 8 + [112.0] * 3))  # fmt: skip
    speed = render(root).split("**Speed at")[1].split("\n\n")[0]
    assert "slowest timed step took up to 1.12× the fastest" in speed
    assert "not on this bound" not in speed
    assert "speed_clear_retried" not in (root / "results/map_findings.json").read_text()


def test_own_maximum_ratios_within_noise_are_not_called_slower_or_faster(base, tmp_path):  # noqa: F811
    root = copy(base, tmp_path)
    cell = root / "results/map/gpt2_s_32/cells/flash/max.json"
    flash = json.loads(cell.read_text())["tokens_per_s"]
    # offload 1.1x flash there, and its cell retried: within the pair's noise (0.14 and more)
    edit(root, "gpt2_s_32", "offload", "cell",
         lambda d: d.update(tokens_per_s=flash * 1.1, allocator_events={"alloc_retries": 2}))  # fmt: skip
    md = render(root)
    abstract = md.split("## Abstract")[1].split("## 1")[0]
    assert ", above `flash`'s at all 6 points, faster at 5 of them beyond noise (Method);" \
        in abstract  # fmt: skip
    assert "above `flash`'s at every point" not in abstract
    findings = md.split("## 4 Findings")[1].split("## 5")[0]
    assert "(by the within-noise rule of Method: `offload` faster at 5 of the 6 " \
           "points)" in findings  # fmt: skip
    assert "(each at its own maximum; faster at 5 of 6 beyond noise)" \
        in md.split("Conclusion")[-1]  # fmt: skip


def test_the_counts_are_given_again_with_the_repeats_own_allowance(base, tmp_path):  # noqa: F811
    """The final review of issue 37: the own-maximum counts rest on the 14% allowance for a
    retried cell, measured on an H100; where the map's own repeats moved such a cell less, the
    paper gives the counts with that allowance too (abstract and Findings)."""
    root = copy(base, tmp_path)
    flash = json.loads((root / "results/map/gpt2_s_32/cells/flash/max.json").read_text())
    edit(root, "gpt2_s_32", "offload", "cell",  # 1.1x flash, retried: within 14%, not within 1%
         lambda d: d.update(tokens_per_s=flash["tokens_per_s"] * 1.1,
                            allocator_events={"alloc_retries": 2}))  # fmt: skip
    md = render(root)
    assert "allowance this map's repeats showed" not in md  # no repeats: nothing to say
    write_repeats(root, {"window": [(40000.0, 5), (40400.0, 9)]})  # a retried cell moved 1.0%
    md = render(root)
    abstract = md.split("## Abstract")[1].split("## 1")[0]
    assert "faster at 5 of them beyond noise (Method) (faster at 6 with the 1.0% allowance this " \
           "map's repeats showed for a retried cell)" in abstract  # fmt: skip
    findings = md.split("## 4 Findings")[1].split("## 5")[0]
    assert "With the allowance this map's repeats showed for a cell that retried (1.0% in place " \
           "of 14%), `offload` faster at 6 of the 6 points would be beyond noise: the counts rest " \
           "on that allowance." in findings  # fmt: skip
