"""The plan's calibrated constants from measured searches, and the leave-one-out check of its
predicted maxima (tools/plan_check.py). Torch-free.

A measured point is a search (its JSON) with the model it ran: its fit (fixed MiB, MiB a
sequence) implies each constant of its class (memopt.plan.memory.terms); a constant is the
median over the points of its class and block style (else over both styles, else the shipped
CALIBRATION). Leave-one-out: each configuration (model, length, knobs: its replicas on other
GPUs and in other studies together) is predicted from constants fitted on the others, at its
own search's limit.
"""

from __future__ import annotations

import json
import statistics

from memopt.plan.memory import CALIBRATED, CALIBRATION, MIB, largest_batch, terms

# What a search that counted only out-of-memory as a miss (before search.allocator_slack_mib)
# could use of its budget: near the budget the allocator keeps about this much unallocated.
OLD_SEARCH_MARGIN_MIB = 100.0


def point(search: dict, model: dict, vocab: int) -> dict | None:
    """A search as a measured point (None where the plan does not model its knobs)."""
    try:
        t = terms(model, vocab, search["spec"])
    except ValueError:
        return None
    limit = search.get("fit_limit_mib") or search["budget_mib"] - OLD_SEARCH_MARGIN_MIB
    key = json.dumps([model, {k: v for k, v in search["spec"].items() if v is not None}],
                     sort_keys=True)  # fmt: skip
    return {"search": search, "model": model, "vocab": vocab, "terms": t, "limit": limit,
            "key": key}  # fmt: skip


def implied(p: dict, cal: dict = CALIBRATION) -> dict:
    """What the point's fit says of its class's constants (empty without a fit)."""
    fit, t = p["search"].get("fit"), p["terms"]
    if not fit:
        return {}
    out = {"fixed_extra_mib": fit["fixed_mib"] - sum(t["fixed"].values()) - cal["state_mib"]}
    per_token = fit["per_sample_mib"] * MIB / p["model"]["seq_len"]
    if t["kind"] == "compiled":
        per_token -= cal["compile_logits_bytes"] * p["vocab"]
    if t["kind"] in CALIBRATED and t["per_unit"]:
        out[CALIBRATED[t["kind"]]] = (per_token - t["known"]) / t["per_unit"]
    return out


def calibrate(points: list[dict], base: dict = CALIBRATION) -> dict:
    """The constants fitted to `points` (base's where no point implies them)."""
    cal = json.loads(json.dumps(base))
    seen = [(p["terms"]["kind"], p["terms"]["arch"], implied(p, base)) for p in points]
    for name in set(CALIBRATED.values()):
        for arch in cal[name]:
            own = [v[name] for _, a, v in seen if name in v and a == arch]
            every = [v[name] for _, _, v in seen if name in v]
            if own or every:
                cal[name][arch] = statistics.median(own or every)
    for kind in cal["fixed_extra_mib"]:
        values = [v["fixed_extra_mib"] for k, _, v in seen if k == kind and v]
        if values:
            cal["fixed_extra_mib"][kind] = statistics.median(values)
    return cal


def predicted_max(p: dict, cal: dict):
    """The point's maximum batch predicted with `cal`, at its own search's limits and cap, and
    its memory line."""
    s = p["search"]
    best, _, line = largest_batch(p["model"], p["vocab"], s["spec"], p["limit"],
                                  s.get("host_budget_mib"), s.get("cap"), cal)  # fmt: skip
    return best, line


def leave_one_out(points: list[dict]) -> list[dict]:
    """Per point: its maximum predicted from the others' constants, against the measured one,
    and the peaks of its fitting trials, predicted with the same constants at their batches
    (peaks: (batch, measured MiB, predicted MiB) each)."""
    rows = []
    for p in points:
        cal = calibrate([q for q in points if q["key"] != p["key"]])
        measured, (predicted, line) = p["search"]["max_batch"], predicted_max(p, cal)
        peaks = [(t["batch"], t["peak_mib"], line.at(t["batch"])) for t in p["search"]["trials"]
                 if t["fits"] and t.get("peak_mib")]  # fmt: skip
        rows.append({"technique": p["search"]["technique"], "kind": p["terms"]["kind"],
                     "status": p["search"]["status"], "measured": measured,
                     "predicted": predicted, "peaks": peaks,
                     "error": (predicted - measured) / measured if measured else None})  # fmt: skip
    return rows
