"""What the map paper says beyond its tables, computed from the map's rows (results/map.csv as
dicts) and findings (results/map_findings.json): where each technique pays, grouped per axis;
the share of the step's memory by kind; techniques that save fixed memory, in sequences; the
same-batch speeds; the spread of the searches' budgets; which GPU ran which point. Used by
memopt.report.map_paper."""

from __future__ import annotations

import math
from pathlib import Path

from memopt.errors import MemoptError
from memopt.report.map_results import BREAKDOWN
from memopt.report.noise import speed_verdict


def pay_groups(found: list[dict], axis: str) -> list[dict]:
    """The findings of one technique along one axis, grouped by where it starts to pay:
    [{from, everywhere (`from` is the first value measured: it pays wherever measured, where it
    starts is not seen), last (`from` is the last value measured: "at", not "from"), ratio_min,
    ratio_max, one_more (at every `from` of the group the
    technique's maximum is one sequence above the reference's), at: [fixed values]}], the paying
    groups first, by `from`."""
    groups: dict = {}
    for f in found:
        if f["axis"] != axis:
            continue
        measured = sorted(float(v) for v in f["ratios"])
        first = f["from"] is not None and float(f["from"]) == measured[0]
        g = groups.setdefault((f["from"], first), {"from": f["from"], "everywhere": first,
                                                  "at": [], "ratios": [], "one_more": True})  # fmt: skip
        g["at"].append(f["at"])
        # `from` is the last value measured: it pays there, and beyond it the map says nothing
        g["last"] = (
            g.get("last", True) and f["from"] is not None and float(f["from"]) == measured[-1]
        )
        g["one_more"] = g["one_more"] and bool(f.get("one_more"))
        if f["ratio"] is not None:  # None: the reference fits no batch there
            g["ratios"].append(f["ratio"])
    out = sorted(groups.values(), key=lambda g: (g["from"] is None, g["from"] or 0))
    for g in out:
        ratios = g.pop("ratios")
        g["ratio_min"], g["ratio_max"] = (min(ratios), max(ratios)) if ratios else (None, None)
    return out


def pays_everywhere(found: list[dict], pays: float) -> dict:
    """{"everywhere": the technique pays at every point measured (along the length, every
    model's ratios cover every point), "ratio_min", "ratio_max" over those points, and
    "reference_none": at some of them the reference fits no batch (no ratio there)}."""
    ratios = [v for f in found if f["axis"] == "length" for v in f["ratios"].values()]
    known = [v for v in ratios if v is not None]
    everywhere = bool(ratios) and all(v is None or v >= pays for v in ratios)
    return {"everywhere": everywhere, "ratio_min": min(known, default=None),
            "ratio_max": max(known, default=None), "reference_none": len(known) < len(ratios)}  # fmt: skip


def tied_points(values: list[tuple[float, str]], end: float) -> list[str]:
    """Every point whose share prints as `end` does (whole percent): a tie is named whole."""
    return [p for v, p in values if round(100 * v) == round(100 * end)]


def share_ranges(rows: list[dict], technique: str) -> dict | None:
    """The share of each kind of memory (and of the three fixed kinds together, "fixed") in
    `technique`'s timed step at its maximum, with the points where it is smallest and largest."""
    out = {}
    fixed = ("weights", "gradients", "optimizer_state")
    for kind in (*BREAKDOWN, "fixed"):
        values = []
        for r in rows:
            parts = [r.get(f"{k}_mib") for k in BREAKDOWN]
            if r["technique"] != technique or any(p is None for p in parts) or not sum(parts):
                continue
            part = sum(r[f"{k}_mib"] for k in fixed) if kind == "fixed" else r[f"{kind}_mib"]
            values.append((part / sum(parts), r["point"]))
        if values:
            lo, hi = min(values), max(values)
            out[kind] = {"min": lo[0], "min_at": tied_points(values, lo[0]),
                         "max": hi[0], "max_at": tied_points(values, hi[0])}  # fmt: skip
    # the kinds' sum against the step's allocated peak (what the shares are shares of)
    cover = [sum(r[f"{k}_mib"] for k in BREAKDOWN) / r["peak_allocated_mib"] for r in rows
             if r["technique"] == technique and r.get("peak_allocated_mib")
             and all(r.get(f"{k}_mib") is not None for k in BREAKDOWN)]  # fmt: skip
    if out and cover:
        out["cover"] = {"min": min(cover), "max": max(cover)}
    return out or None


SLOPE_SAME = 0.01  # two fits' slopes this close (relative): the same memory per token


def fixed_savings(rows: list[dict], reference: str, pays: float) -> list[dict]:
    """Techniques that change only the memory a step holds whatever its batch: the same memory
    per token as the reference (slopes within SLOPE_SAME) at every point where both fit, a fit
    that starts lower. Per technique: the saving in MiB and in the reference's sequences, what
    paying (pays x the reference's batch) would need in sequences, the largest share of that need
    the saving meets at one point (`share`; `share_at`: the points where it prints so), whether
    the optimizer state's measured difference is the saving (within 5% at every point), and the
    points left out (`without`: one of the two fits fewer than two batches, so no slope)."""
    out = {}
    points = list(dict.fromkeys(r["point"] for r in rows))
    for point in points:
        ref = next(r for r in rows if r["point"] == point and r["technique"] == reference)
        if not (ref["per_token_mib"] and ref["fixed_mib"] is not None):
            continue
        seq = ref["per_token_mib"] * ref["seq_len"]
        for r in rows:
            if r["point"] != point or r["technique"] == reference or not r["per_token_mib"]:
                continue
            same = abs(r["per_token_mib"] / ref["per_token_mib"] - 1) <= SLOPE_SAME
            saved = ref["fixed_mib"] - r["fixed_mib"]
            e = out.setdefault(r["technique"], {"technique": r["technique"], "points": [],
                                                "same": True})  # fmt: skip
            e["same"] &= same
            state = (ref.get("optimizer_state_mib") or 0) - (r.get("optimizer_state_mib") or 0)
            e["points"].append({"point": point, "mib": saved, "sequences": saved / seq,
                                "needs": (pays - 1) * ref["max_batch"],
                                "state": abs(state - saved) <= 0.05 * abs(saved)})  # fmt: skip
    found = []
    for e in out.values():
        if not e["same"] or not all(p["mib"] > 1 for p in e["points"]):
            continue
        pts = e["points"]
        shares = [(p["sequences"] / p["needs"], p["point"]) for p in pts]
        share = max(v for v, _ in shares)
        weighed = {p["point"] for p in pts}
        found.append({"technique": e["technique"], "n": len(pts),
                      **{f"{k}_{f.__name__}": f(p[k] for p in pts) for k in ("mib", "sequences", "needs")
                         for f in (min, max)},
                      "share": share, "share_at": tied_points(shares, share),
                      "state": all(p["state"] for p in pts),
                      "without": [p for p in points if p not in weighed]})  # fmt: skip
    return found


def speed_summary(findings: dict) -> list[dict]:
    """Per technique timed at the reference's batch somewhere: how many points, the range of its
    tokens/s over the reference's, and the points where it is faster or slower beyond the two
    cells' noise (memopt.report.noise; each entry's "noise"), each with its ratio, and the others
    (within noise)."""
    out = []

    def verdict(f):
        if "noise" not in f:  # findings aggregated before the noise rule
            raise MemoptError("map_findings.json has no 'noise' per ratio (written before the "
                              "papers' noise rule): run `memopt paper` on the map study again")  # fmt: skip
        return speed_verdict(f["ratio"], f["noise"])

    for technique, found in (findings.get("speed") or {}).items():
        if not found:
            continue
        ratios = [f["ratio"] for f in found]
        out.append({
            "technique": technique, "n": len(found), "min": min(ratios), "max": max(ratios),
            "faster": [f for f in found if verdict(f) == "faster"],
            "slower": [f for f in found if verdict(f) == "slower"],
            "others": [f for f in found if verdict(f) is None],
        })  # fmt: skip
    return out


def budget_spread(search_paths, searches: list[dict], rows: list[dict], reference: str):
    """The widest spread of the searches' budgets at one point, in MiB (`mib`), and the point
    where a spread is most of the reference's sequences (its fit's memory per sequence), the worst
    case for telling two techniques' maxima apart: {mib, n, point, point_mib, sequence_mib (the
    reference's sequence there), batch (its maximum there), moves (the most sequences that spread
    can move a maximum by), one_apart ([{technique, batch, settled, ...}] one sequence from the
    reference's there, with what its trials show: _settled, and gap_mib: _gap)}, or None. A search's
    budget is what the GPU had free when it began, so two searches at one point can differ by this
    much for no reason of their techniques."""
    by_point: dict = {}  # point -> technique -> its search
    for path, s in zip(search_paths, searches):
        by_point.setdefault(Path(path).parts[-3], {})[Path(path).stem] = s
    budgets = {p: [s["budget_mib"] for s in at.values() if s.get("budget_mib")]
               for p, at in by_point.items()}  # fmt: skip
    per_seq = {r["point"]: r["per_token_mib"] * r["seq_len"] for r in rows
               if r["technique"] == reference and r["per_token_mib"]}  # fmt: skip
    spreads = [(max(b) - min(b), p) for p, b in budgets.items() if b and p in per_seq]
    if not spreads:
        return None
    mib = max(m for m, _ in spreads)
    worst, point = max((m / per_seq[p], p) for m, p in spreads)
    if mib <= 0:
        return None
    ref = next(r["max_batch"] for r in rows if r["point"] == point and r["technique"] == reference)
    at = by_point[point]
    # techniques one sequence from the reference there: a difference the budget alone can make
    near = [{"technique": r["technique"], "batch": r["max_batch"],
             "gap_mib": _gap(at.get(r["technique"]), at.get(reference), r["max_batch"] > ref),
             **_settled(at.get(r["technique"]), at.get(reference), r["max_batch"], ref)}
            for r in rows if r["point"] == point and r["technique"] != reference and ref
            and r["max_batch"] and abs(r["max_batch"] - ref) == 1]  # fmt: skip
    return {"mib": mib, "n": worst, "point": point, "point_mib": worst * per_seq[point],
            "sequence_mib": per_seq[point], "batch": ref, "one_apart": near,
            "moves": math.ceil(worst), **_odd_budget(by_point, point)}  # fmt: skip


def _odd_budget(by_point: dict, point: str) -> dict:
    """{odd, rest_max}: the technique whose budget alone makes most of the spread at `point`
    (without it, less than half is left), and the widest spread of the others' budgets at any point
    (also less than half of it); {} where no one technique does."""

    def spread(at: dict, without: str | None) -> float:
        b = [s["budget_mib"] for t, s in at.items() if t != without and s.get("budget_mib")]
        return max(b) - min(b) if len(b) > 1 else 0.0

    at = by_point[point]
    whole = spread(at, None)
    rest, odd = min((spread(at, t), t) for t in at)
    if len(at) < 3 or 2 * rest >= whole:
        return {}
    rest_max = max(spread(a, odd) for a in by_point.values())
    return {"odd": odd, "rest_max": rest_max} if 2 * rest_max < whole else {}


def _gap(mine: dict | None, theirs: dict | None, mine_higher: bool) -> float | None:
    """The budget of the search with the larger maximum less the other's (MiB): at or below 0,
    the budget did not favour it, so it cannot be what put the two maxima apart."""
    if not (mine and theirs and mine.get("budget_mib") and theirs.get("budget_mib")):
        return None
    gap = mine["budget_mib"] - theirs["budget_mib"]
    return gap if mine_higher else -gap


def _settled(mine: dict | None, theirs: dict | None, batch: int, ref: int) -> dict:
    """Whether the trials settle that a one-sequence difference is the budget's: the one with
    the smaller maximum trained the other's batch (no out-of-memory) and was refused only because
    its peak passed its own fit limit, while that peak is within the other's. {"settled": False}
    or {"settled": True, "lower", "higher" (techniques' roles), "at", "peak_mib", "own_limit_mib",
    "other_limit_mib"}."""
    if not (mine and theirs):
        return {"settled": False}
    (low, high), at = ((mine, theirs), ref) if batch < ref else ((theirs, mine), batch)
    trial = next((t for t in low.get("trials", []) if t["batch"] == at), None)
    own, other = low.get("fit_limit_mib"), high.get("fit_limit_mib")
    if not (trial and own and other and trial.get("peak_mib")) or trial["fits"] \
            or trial.get("out_of_memory") or not own < trial["peak_mib"] <= other:  # fmt: skip
        return {"settled": False}
    return {"settled": True, "lower": low["technique"], "higher": high["technique"], "at": at,
            "peak_mib": trial["peak_mib"], "own_limit_mib": own, "other_limit_mib": other}  # fmt: skip


def where_run(rows: list[dict]) -> dict:
    """The GPUs by UUID (label, model, points), each point's jobs on one GPU or not, the commits."""
    gpus: dict = {}
    split = []
    for point in dict.fromkeys(r["point"] for r in rows):
        ids = {
            u for r in rows if r["point"] == point for u in (r["gpu_uuid"], r["search_gpu_uuid"])
        }
        if len(ids) > 1:
            split.append(point)
        for r in (r for r in rows if r["point"] == point):
            g = gpus.setdefault(
                r["gpu_uuid"], {"uuid": r["gpu_uuid"], "model": r["gpu"], "points": []}
            )
            if point not in g["points"]:
                g["points"].append(point)
    for i, g in enumerate(gpus.values(), 1):
        g["label"] = f"GPU {i}"
    commits = sorted({c for r in rows for c in (r["git_commit"], r["search_git_commit"]) if c})
    models = sorted({g["model"] for g in gpus.values() if g["model"]})
    return {"gpus": list(gpus.values()), "split": split, "commits": commits, "models": models}


SCORE_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2}  # one attention score, by precision


def kept_scores(rows: list[dict], models: list[dict], specs: dict) -> list[dict]:
    """Techniques whose attention keeps the score matrices (math attention): how their memory
    per token grows with the length, per layer and query head, in bytes per pair of tokens, from
    the fits at the two shortest lengths where a model fits a batch; against the bytes of one
    score in the technique's precision. [{technique, model, bytes, lengths, score_bytes,
    about_one, none_fits: [{point, gib}] where it fits no batch, one sequence's memory
    extrapolated}]."""
    shapes = {m["name"]: m for m in models}
    out = []
    for technique, spec in specs.items():
        if spec.get("attention") != "math":
            continue
        for name, m in shapes.items():
            fits = sorted((r["seq_len"], r["per_token_mib"]) for r in rows
                          if r["technique"] == technique and r["model"] == name
                          and r["per_token_mib"])  # fmt: skip
            if len(fits) < 2:
                continue
            (n0, a), (n1, b) = fits[:2]
            growth = (b - a) * 2**20 / (n1 - n0)  # bytes per token per token of length
            per = growth / (m["n_heads"] * m["n_layers"])
            # where it fits no batch: one sequence's memory, the line through the two fits
            none = [(r["point"], r["seq_len"]) for r in rows if r["technique"] == technique
                    and r["model"] == name and r["search_status"] == "none_fits"]  # fmt: skip
            gib = [{"point": p, "gib": n * (a + (n - n0) * growth / 2**20) / 1024} for p, n in none]
            score = SCORE_BYTES.get(spec.get("precision"))
            out.append({"technique": technique, "model": name, "lengths": [n0, n1], "bytes": per,
                        "score_bytes": score,  # about one kept score: within a quarter of it
                        "about_one": bool(score) and abs(per / score - 1) <= 0.25,
                        "none_fits": gib})  # fmt: skip
    return out
