"""What the map paper may claim, and how far, computed from the map's rows (results/map.csv as
dicts) and its searches' JSON: how many sequences each search's fit allows (a maximum is that,
rounded down), where a technique pays at a single point, the winner's memory per token against the
reference's, techniques that the host's pinned-memory budget stops before the GPU's memory would,
the tokens/s at each technique's own maximum and what recomputation alone would cost, the cells
whose interval missed its target, and which points ran at the same time. Used by
memopt.report.map_paper."""

from __future__ import annotations

import math
from datetime import datetime
from pathlib import Path

from memopt.report.map_results import retried
from memopt.report.noise import RETRY_NOISE, pair_noise, speed_verdict

# retries "go with" the room a cell left where at most this share of the cells that left as
# little as any retried cell did not retry (and some cells left more)
RETRY_ROOM_CLEAN = 0.25


def searches_by_cell(search_paths, searches: list[dict]) -> dict:
    """{(point, technique): search} from results/map/POINT/search/TECHNIQUE.json."""
    return {(Path(p).parts[-3], Path(p).stem): s for p, s in zip(search_paths, searches)}


def cell_row(rows: list[dict], point: str, technique: str) -> dict:
    """The row of `technique` at `point`."""
    return next(r for r in rows if r["point"] == point and r["technique"] == technique)


def fit_sequences(search: dict | None) -> float | None:
    """How many sequences the search's fit allows under its limit (its maximum, a whole number
    of sequences, is this rounded down where the fit is right): (limit - fixed) / per sequence."""
    fit = (search or {}).get("fit") or {}
    limit = (search or {}).get("fit_limit_mib")
    if not (fit.get("per_sample_mib") and fit.get("fixed_mib") is not None and limit):
        return None
    return (limit - fit["fixed_mib"]) / fit["per_sample_mib"]


def single_points(rows: list[dict], reference: str, pays: float, by_cell: dict) -> dict:
    """Techniques that pay (at least `pays` x the reference's tokens per step) at exactly one
    point: {technique: {point, ratio, batch, ref_batch, fit, ref_fit (sequences the fits allow,
    None without a fit), rounding (each maximum is its fit rounded down, the fits less than a
    sequence apart: the rounding made the whole sequence)}}."""
    out = {}
    for t in dict.fromkeys(r["technique"] for r in rows):
        if t == reference:
            continue
        paying = []
        for r in (r for r in rows if r["technique"] == t):
            ref = cell_row(rows, r["point"], reference)
            if ref["max_tokens"] and r["max_tokens"] / ref["max_tokens"] >= pays:
                paying.append((r, ref))
        if len(paying) == 1:
            r, ref = paying[0]
            fit = fit_sequences(by_cell.get((r["point"], t)))
            ref_fit = fit_sequences(by_cell.get((r["point"], reference)))
            # the maxima are the fits rounded down, and less than a sequence apart on the fits
            rounding = fit is not None and ref_fit is not None and fit - ref_fit < 1 \
                and math.floor(fit) == r["max_batch"] and math.floor(ref_fit) == ref["max_batch"]  # fmt: skip
            out[t] = {"point": r["point"], "ratio": r["max_tokens"] / ref["max_tokens"],
                      "batch": r["max_batch"], "ref_batch": ref["max_batch"], "fit": fit,
                      "ref_fit": ref_fit, "rounding": rounding}  # fmt: skip
    return out


def slope_ratios(rows: list[dict], technique: str, reference: str) -> list[dict]:
    """The reference's memory per token over the technique's (how many times less memory each
    token costs it), per model: [{model, min, max}] over the points where both have a slope."""
    out: dict = {}
    for r in rows:
        if r["technique"] != technique or not r["per_token_mib"]:
            continue
        ref = cell_row(rows, r["point"], reference)
        if ref["per_token_mib"]:
            out.setdefault(r["model"], []).append(ref["per_token_mib"] / r["per_token_mib"])
    return [{"model": m, "min": min(v), "max": max(v)} for m, v in out.items()]


def pinned_for(search: dict | None, batch: int, seq_len: int) -> float | None:
    """The pinned host memory (MiB) a batch would take, charged as the search charges it
    (memopt.jobs.host_bound.pinned_charge, from the tensors its fitting trials offloaded), where
    its GPU line (fit_sequences) still allows that batch; None otherwise. A prediction past the
    proven maximum."""
    from memopt.jobs.host_bound import pinned_charge

    if not search:
        return None
    spec, gpu, g = search.get("spec") or {}, fit_sequences(search), search.get("granularity") or 1
    chunk = (seq_len, spec["loss_chunk"]) if spec.get("loss") == "chunked" else None
    charged = pinned_charge(search["trials"], g, chunk)
    if charged is None or gpu is None or gpu < batch:
        return None
    return charged(-(-batch // g)) / 2**20


def host_rivals(rows: list[dict], best: list[dict], by_cell: dict | None = None) -> list[dict]:
    """Techniques the host's pinned-memory budget stopped at points where the most tokens per
    step came from a technique the GPU's memory stopped, while each of their tokens costs less GPU
    memory than the winner's: with a larger host budget they could train more. [{technique,
    points, ratio_min, ratio_max (the winner's memory per token over theirs), pinned_gib: {min,
    max} the pinned memory a GPU that one sequence more than the winner's maximum would take
    (pinned_for, at every one of the points; else None)}]."""
    out: dict = {}
    for b in best:
        won = [r for r in rows if r["point"] == b["point"] and r["technique"] in b["techniques"]
               and r["limit"] == "memory" and r["per_token_mib"]]  # fmt: skip
        for w in won:
            for r in rows:
                if r["point"] == b["point"] and r["limit"] == "host" and r["per_token_mib"] \
                        and r["per_token_mib"] < w["per_token_mib"]:  # fmt: skip
                    e = out.setdefault(r["technique"], {"technique": r["technique"], "points": [],
                                                        "ratios": [], "pinned": []})  # fmt: skip
                    e["points"].append(b["point"])
                    e["ratios"].append(w["per_token_mib"] / r["per_token_mib"])
                    search = (by_cell or {}).get((b["point"], r["technique"]))
                    e["pinned"].append(pinned_for(search, w["max_batch"] + 1, r["seq_len"]))
    return [{"technique": e["technique"], "points": list(dict.fromkeys(e["points"])),
             "ratio_min": min(e["ratios"]), "ratio_max": max(e["ratios"]),
             "pinned_gib": {"min": min(e["pinned"]) / 1024, "max": max(e["pinned"]) / 1024}
             if None not in e["pinned"] else None} for e in out.values()]  # fmt: skip


def interval_misses(rows: list[dict], target: float) -> dict | None:
    """Timed cells whose 95% interval stayed wider than the target (the time limit stopped them
    first): {n, max, worst (its row)}, or None where every cell reached it."""
    wide = [r for r in rows if r["cell_status"] == "ok" and (r.get("rel_ci95") or 0) > target]
    if not wide:
        return None
    worst = max(wide, key=lambda r: r["rel_ci95"])
    return {"n": len(wide), "max": worst["rel_ci95"], "worst": worst}


def _when(text: str | None) -> float | None:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() if text else None


def point_spans(search_paths, searches: list[dict], read) -> dict:
    """{(point, GPU UUID): (start, end)}: from the point's first search's start to its last job's
    end on that GPU (provenance of the searches and of the cells beside them; `read` reads a
    cell's JSON), for at_once and time_groups. A point whose techniques ran on two GPUs, at
    different times (a machine lost mid-point: tools/gpu_study.sh STUDY_PARTIAL=pairs), has a
    span on each, not one across the time between them."""
    spans: dict = {}
    for path, s in zip(search_paths, searches):
        path = Path(path)
        cell = path.parents[1] / "cells" / path.stem / "max.json"
        for data in (s, read(cell) if cell.exists() else {}):
            prov = data.get("provenance") or {}
            start, end = _when(prov.get("started")), _when(prov.get("finished"))
            if start is not None and end is not None:
                key = (path.parts[-3], prov.get("gpu_uuid"))
                lo, hi = spans.get(key, (start, end))
                spans[key] = (min(lo, start), max(hi, end))
    return spans


def at_once(spans: dict) -> int | None:
    """The most points whose jobs ran at the same time (`spans`: point_spans), or None without
    timestamps."""
    if not spans:
        return None
    return max(len({point for (point, _), (lo, hi) in spans.items() if lo <= t < hi})
               for t, _ in spans.values())  # fmt: skip


def time_groups(spans: dict) -> list[list[tuple]]:
    """The (point, GPU) keys of `spans` (point_spans) in groups that ran at overlapping times (a
    group ran on one machine, groups that did not overlap may have run on different machines), in
    the order they began."""
    groups: list = []  # [[points], end]
    for point, (lo, hi) in sorted(spans.items(), key=lambda kv: kv[1]):
        if groups and lo < groups[-1][1]:
            groups[-1][0].append(point)
            groups[-1][1] = max(groups[-1][1], hi)
        else:
            groups.append([[point], hi])
    return [g for g, _ in groups]


def own_max_speeds(
    rows: list[dict],
    techniques,
    reference: str,
    shares: dict | None = None,
    target: float | None = None,
    retry: float = RETRY_NOISE,
) -> list[dict]:
    """Each technique's tokens/s over the reference's, each at its own maximum (the batches
    differ): [{technique, min, max, under (below 1 at every point timed), over (above 1), below (slower beyond the
    two cells' noise at every point: memopt.report.noise, the papers' one rule, as a cell's
    retries move its mean however the batches compare), above (faster beyond it everywhere),
    slower and faster (at how many points the rule says so), mixed (a point the rule leaves
    within noise is farther from 1 than one it counts: the pairs' noises decided it), ends (the pairs behind min and max: {point, retried, one_more:
    the technique's maximum one sequence above the reference's, noise: the pair's noise}), n, rate, wide}]. rate: {min, max} of that ratio over the
    technique's share of its FLOPs that are model FLOPs at the point (shares[technique]["by_point"],
    recompute_share), i.e. its FLOP rate, recomputation counted, over the reference's; None
    without shares. wide: interval_misses of the cells behind the ratios against `target` (None
    without a target or a miss). retry: the allowance for a cell that retried (the rule's
    RETRY_NOISE; another for a sensitivity check)."""
    out = []
    for t in techniques:
        ratios, rates, behind, ends = [], [], [], []
        by_point = ((shares or {}).get(t) or {}).get("by_point") or {}
        for r in rows:
            if r["technique"] != t or not r.get("tokens_per_s"):
                continue
            ref = cell_row(rows, r["point"], reference)
            if ref.get("tokens_per_s"):
                ratios.append(r["tokens_per_s"] / ref["tokens_per_s"])
                ends.append({"point": r["point"], "retried": retried(r) or retried(ref),
                             "noise": pair_noise(r, ref, retry),
                             "one_more": r.get("max_batch") == (ref.get("max_batch") or 0) + 1})  # fmt: skip
                if r["point"] in by_point:
                    rates.append(ratios[-1] / by_point[r["point"]])
                behind += [r, ref]
        if ratios:
            said = [speed_verdict(v, e["noise"]) for v, e in zip(ratios, ends)]
            slow = [v for v, s in zip(ratios, said) if s == "slower"]
            fast = [v for v, s in zip(ratios, said) if s == "faster"]
            # a point not called so whose ratio is farther from 1 than one that is: the pairs'
            # noises differ (a retry's allowance, or a wider interval) and decided it
            mixed = any(
                s != "slower" and slow and v < max(slow) for v, s in zip(ratios, said)
            ) or any(s != "faster" and fast and v > min(fast) for v, s in zip(ratios, said))
            out.append({"technique": t, "min": min(ratios), "max": max(ratios), "n": len(ratios),
                        "under": all(v < 1 for v in ratios), "over": all(v > 1 for v in ratios),
                        "ends": [ends[ratios.index(min(ratios))], ends[ratios.index(max(ratios))]],
                        "below": all(v == "slower" for v in said), "above": all(v == "faster" for v in said),
                        "slower": said.count("slower"), "faster": said.count("faster"), "mixed": mixed,
                        "rate": {"min": min(rates), "max": max(rates)} if len(rates) == len(ratios) else None,
                        "wide": interval_misses(behind, target) if target is not None else None})  # fmt: skip
    return out


def retry_room(rows: list[dict]) -> dict | None:
    """How the timed cells that retried cudaMalloc sit against their budgets and how far their
    steps spread: {free_max (the most budget a retried cell left unallocated at its peak), n, near
    (cells that left at most that), clean_near (of those, how many did not retry), tracks (the
    paper may say retries go with that room: RETRY_ROOM_CLEAN), spread (the
    retried cell whose slowest step over its fastest is the largest), clean_spread (the largest
    such ratio in a cell that did not retry)}, or None where no cell retried."""
    timed = [r for r in rows if r.get("tokens_per_s")]
    hit = [r for r in timed if retried(r) and r.get("free_mib") is not None]
    if not hit:
        return None
    free_max = max(r["free_mib"] for r in hit)
    near = [r for r in timed if r.get("free_mib") is not None and r["free_mib"] <= free_max]
    spread = [r for r in hit if r.get("step_spread")]
    clean = [r["step_spread"] for r in timed if not retried(r) and r.get("step_spread")]
    clean_near = sum(not retried(r) for r in near)
    return {"free_max": free_max, "n": len(hit), "near": len(near), "clean_near": clean_near,
            # retries go with the room left: most cells that left that little retried, and some
            # cells left more (none of which retried, by free_max)
            "tracks": len(near) < len(timed) and clean_near <= RETRY_ROOM_CLEAN * len(near),
            "spread": max(spread, key=lambda r: r["step_spread"]) if spread else None,
            "clean_spread": max(clean, default=None)}  # fmt: skip


def recompute_share(points: dict, spec: dict, vocab: int) -> dict | None:
    """Model FLOPs over model + recomputed FLOPs per token, over the points (`points`: name ->
    model config): the tokens/s ratio recomputation alone would give at an equal FLOP rate.
    {min, max, by_point} or None where the technique recomputes nothing (or an unknown amount)."""
    from memopt.runtime.flops import flops_per_token, recompute_flops_per_token

    shares = {}
    for name, model in points.items():
        extra = recompute_flops_per_token(model, vocab, spec)
        if not extra:
            return None
        base = flops_per_token(model, vocab, spec.get("window"))
        shares[name] = base / (base + extra)
    return (
        {"min": min(shares.values()), "max": max(shares.values()), "by_point": shares}
        if shares
        else None
    )
