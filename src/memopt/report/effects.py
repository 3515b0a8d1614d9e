"""What the cells say at one batch (the `same` entry): every one-knob pair's effect and the best
technique on each axis; and what a larger batch buys each technique (batch_speed). Each speed
comparison is by the papers' one noise rule (memopt.report.noise). Kept apart from memopt.report.results, which the training jobs import: the rule is the papers',
and changing it reruns no job."""

from __future__ import annotations

from memopt.knobs import BY_NAME
from memopt.knobs import groups as knob_groups
from memopt.report.noise import within_noise
from memopt.report.paper_analysis import batch_change
from memopt.report.results import _change, ok_cells, pareto


def _describe(cell: dict, keys: list[str]) -> str:
    """The knobs `keys` of a cell as a change names them (memopt.knobs: each knob's describe)."""
    knobs = [BY_NAME[k] for k in keys if not BY_NAME[k].subordinate]
    return " + ".join(filter(None, (k.describes(cell) for k in knobs)))


def changed_groups(a: dict, b: dict) -> list[str]:
    """The knob groups (mechanisms) in which two cells' knobs differ, in registry order."""
    return [
        g
        for g, keys in knob_groups().items()
        if any(BY_NAME[k].value_in(a) != BY_NAME[k].value_in(b) for k in keys)
    ]


def incremental_effects(cells: list[dict]) -> list[dict]:
    """At the `same` batch, every pair of techniques whose knobs differ in exactly one group
    (precision, attention kernel/window, checkpointing, compile): the effect of that change, from
    the technique listed first to the one listed later."""
    same = ok_cells(cells)
    order = list(same)  # the config's technique order: a change goes from earlier to later
    rows = []
    for base_name, base in same.items():
        for name, cell in same.items():
            if order.index(name) <= order.index(base_name):
                continue
            groups = changed_groups(cell, base)
            if len(groups) != 1:
                continue
            keys = knob_groups()[groups[0]]
            rows.append(
                {
                    "technique": name,
                    "over": base_name,
                    "knob": groups[0],
                    "change": f"{_describe(base, keys)} → {_describe(cell, keys)}",
                    "within_noise": within_noise(cell, base),
                    # a cell whose steps are not steady (the results table's †): no cause from this pair
                    "unstable": [c["technique"] for c in (base, cell) if c.get("unstable")],
                    "median_speedup": base["step_time_ms_median"] / cell["step_time_ms_median"]
                    if cell.get("step_time_ms_median") and base.get("step_time_ms_median")
                    else None,
                    **_change(cell, base),
                }
            )
    return rows


def analysis(cells: list[dict]) -> dict:
    """What the numbers say at the `same` batch, for the generated analysis text: the best
    technique on each axis, whether the runner-up is within measured noise (within_noise: the
    papers' one rule, memopt.report.noise), and the memory-speed Pareto set over
    every ok cell."""
    same = list(ok_cells(cells).values())
    result = {"fastest": None, "lowest_memory": None, "pareto": []}
    if same:
        by_speed = sorted(same, key=lambda c: c["step_time_ms_mean"])
        best = by_speed[0]
        tied = [c["technique"] for c in by_speed[1:] if within_noise(c, best)]
        result["fastest"] = {"technique": best["technique"], "within_noise": tied}
        low = min(same, key=lambda c: c["peak_allocated_mib"])
        result["lowest_memory"] = {
            "technique": low["technique"],
            "peak_mib": low["peak_allocated_mib"],
        }
    ok = [c for c in cells if c["status"] == "ok"]
    # Memory in whole MiB, as the tables print it: 0.005 MiB is no advantage.
    front = set(pareto([(round(c["peak_allocated_mib"]), c["tokens_per_s"]) for c in ok]))
    result["pareto"] = [
        f"{c['technique']} ({c['batch_entry']})"
        for c in ok
        if (round(c["peak_allocated_mib"]), c["tokens_per_s"]) in front
    ]
    return result


# A larger batch's gain in throughput worth naming (and beyond the two cells' noise).
GAIN = 0.05


def batch_speed(cells: list[dict]) -> dict | None:
    """How throughput changes from the `same` batch to each technique's own maximum batch, by the
    mean step (the tables' tokens/s) and by the median (memopt.report.paper_analysis.batch_change),
    and which techniques gain from it by both, beyond noise."""
    same = ok_cells(cells)
    changes = [
        (c, batch_change(same[c["technique"]], c))
        for c in cells
        if c["batch_entry"] == "max"
        and c["status"] == "ok"
        and not c.get("measured_as")
        and c["technique"] in same
        and c["batch_size"] > same[c["technique"]]["batch_size"]
    ]
    if not changes:
        return None
    gain = [
        min(r.values()) >= GAIN and not within_noise(c, same[c["technique"]]) for c, r in changes
    ]
    rest = [r for (_, r), g in zip(changes, gain) if not g]

    def span(rs):  # lo and hi, by the mean step and by the median
        return {f"{k}_{m}": f(r[m] for r in rs) for m in ("mean", "median")
                for k, f in (("lo", min), ("hi", max))}  # fmt: skip

    return {
        **span([r for _, r in changes]),
        "n": len(changes),
        "threshold": GAIN,
        "gainers": [{"technique": c["technique"], **r} for (c, r), g in zip(changes, gain) if g],
        "others": {**span(rest), "n": len(rest)} if rest else None,
    }
