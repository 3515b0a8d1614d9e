"""What the paper concludes from the results, beyond the tables: the abstract's headline numbers,
hardware FLOP utilization beside MFU, the TF32 reference beside the FP32 baseline, and the
recommendation table (which technique wins each goal, at what cost, against which runner-up).
Torch-free; every number comes from the cells, the searches and the quality runs.
"""

from __future__ import annotations

from pathlib import Path

from memopt.fileio import read_json
from memopt.report.noise import within_noise
from memopt.report.paper_reference import ratio
from memopt.report.results import (
    LATER_SPEC_KEYS,
    SPEC_KEYS,
    capped_techniques,
    entry_sort_key,
    ok_cells,
)
from memopt.runtime.blocks import technique_model
from memopt.runtime.flops import flops_per_token, recompute_flops_per_token

# The knobs of a cell that decide its recomputation (summary.csv columns).
_SPEC = ("checkpointing", "checkpoint_every", "window", "loss", "compile", "compile_memory_budget")


def add_hfu(cells: list[dict], model_cfg: dict, vocab_size: int) -> None:
    """Set each cell's `hfu`: MFU with recomputation counted (None where MFU is, or where the
    recomputation is not known from the knobs)."""
    for c in cells:
        m = technique_model(model_cfg, c)
        extra = recompute_flops_per_token(m, vocab_size, {k: c.get(k) for k in _SPEC})
        model = flops_per_token(m, vocab_size, c.get("window"))
        c["hfu"] = None if c.get("mfu") is None or extra is None else c["mfu"] * (1 + extra / model)


def _best_per_technique(cells: list[dict], key, entry: str | None = None) -> dict[str, dict]:
    """Each technique's ok cell with the largest key(cell) (at `entry`, if given)."""
    best: dict[str, dict] = {}
    for c in cells:
        if c["status"] != "ok" or (entry is not None and c["batch_entry"] != entry):
            continue
        if c["technique"] not in best or key(c) > key(best[c["technique"]]):
            best[c["technique"]] = c
    return best


def _quality_by_technique(quality: dict) -> dict[str, dict]:
    return {t: row for row in quality.get("rows", []) for t in row["techniques"]}


def _ranked(best: dict[str, dict], key) -> list[dict]:
    return sorted(best.values(), key=key, reverse=True)


def _quality_words(row: dict | None) -> str:
    if row is None or not row["val_loss"]["n"]:
        return "quality not measured"
    if row["verdict"] is None:
        return "the reference quality"
    words = {"equivalent": "equivalent to", "worse": "worse than", "better": "better than"}
    verdict = words.get(row["verdict"], f"{row['verdict']} against")
    return f"quality {verdict} the baseline's"


def recommendations(
    cells: list[dict], quality: dict, baseline: str, capped: frozenset = frozenset()
) -> list[dict]:
    """One row per goal: the winning technique, its figure, what it costs, the runner-up and
    its figure, and whether the two are within measurement noise. Goals without data are left out.

    - largest batch: the largest batch a `max` cell trained at (techniques whose searches both
      stopped at the cap, `capped`, at one batch are tied: neither is known to train more);
    - fastest training: the highest tokens/s of any of the technique's cells;
    - least memory at the same batch: the lowest peak allocated memory at `same`;
    - fastest, quality not found worse: among techniques whose function is not detectably worse
      than the reference's (its paired verdict; never diverged), the highest tokens/s (an
      inconclusive verdict counts: "not found worse" is all it says).
    A positive control (a technique whose function changes the learning rate) is a check of the
    quality verdicts, and another block another model, not a technique to use: they are in none
    of the goals.
    """
    q = _quality_by_technique(quality)
    cells = [c for c in cells if not _not_a_technique(q.get(c["technique"], {}))]
    base = next(
        (c for c in cells if c["technique"] == baseline and c["batch_entry"] == "same"), None
    )
    base = base if base is not None and base["status"] == "ok" else None
    rows = []

    def row(goal, ranked, figure, cost, noise=None, tie=None):
        if not ranked:
            return
        win, second = ranked[0], ranked[1] if len(ranked) > 1 else None
        rows.append(
            {
                "goal": goal,
                "winner": win["technique"],
                "figure": figure(win),
                "cost": cost(win),
                "runner_up": second["technique"] if second else None,
                "runner_up_figure": figure(second) if second else None,
                "within_noise": bool(second and noise and noise(win, second)),
                "tied": bool(second and tie and tie(win, second)),
            }
        )

    def speed_vs_base(c):
        if base is None:
            return f"{c['tokens_per_s']:,.0f} tokens/s"
        return f"{c['tokens_per_s'] / base['tokens_per_s']:.2f}x the baseline's tokens/s"

    same_ok = _best_per_technique(cells, lambda c: c["tokens_per_s"], entry="same")
    quickest = max(same_ok.values(), key=lambda c: c["tokens_per_s"], default=None)

    def speed_given_up(c):
        """What the technique costs in speed: its tokens/s at the `same` batch against the
        fastest technique's there (the largest batch is not what a slower step buys)."""
        mine = same_ok.get(c["technique"])
        if mine is None or quickest is None or mine is quickest:
            return f"{c['tokens_per_s']:,.0f} tokens/s at that batch"
        return (
            f"{mine['tokens_per_s'] / quickest['tokens_per_s']:.2f}x the tokens/s of "
            f"{quickest['technique']} at the same batch"
        )

    largest = _best_per_technique(cells, lambda c: c["batch_size"], entry="max")
    row(
        "largest batch",
        _ranked(largest, lambda c: (c["batch_size"], c["tokens_per_s"])),
        lambda c: f"{'≥ ' if c['technique'] in capped else ''}{c['batch_size']:,} sequences",
        lambda c: f"{speed_given_up(c)}; {_quality_words(q.get(c['technique']))}",
        tie=lambda a, b: (
            a["batch_size"] == b["batch_size"] and {a["technique"], b["technique"]} <= capped
        ),
    )
    fastest = _best_per_technique(cells, lambda c: c["tokens_per_s"])
    row(
        "fastest training",
        _ranked(fastest, lambda c: c["tokens_per_s"]),
        lambda c: f"{c['tokens_per_s']:,.0f} tokens/s at batch {c['batch_size']:,}",
        lambda c: (
            f"{c['peak_allocated_mib']:,.0f} MiB peak; {_quality_words(q.get(c['technique']))}"
        ),
        within_noise,
    )
    same = _best_per_technique(cells, lambda c: -c["peak_allocated_mib"], entry="same")
    row(
        "least memory at the same batch",
        _ranked(same, lambda c: -c["peak_allocated_mib"]),
        lambda c: f"{c['peak_allocated_mib']:,.0f} MiB at batch {c['batch_size']:,}",
        lambda c: f"{speed_vs_base(c)}; {_quality_words(q.get(c['technique']))}",
    )
    good = _as_good_as_the_best(quality)
    quality_fastest = {t: c for t, c in fastest.items() if q.get(t, {}).get("function") in good}
    ranked = _ranked(quality_fastest, lambda c: c["tokens_per_s"])
    row(
        "fastest, quality not found worse",
        ranked,
        lambda c: (
            f"{c['tokens_per_s']:,.0f} tokens/s at batch {c['batch_size']:,}, validation loss "
            + _loss_with_spread(q[c["technique"]]["val_loss"])
        ),
        lambda c: f"{c['peak_allocated_mib']:,.0f} MiB peak",
        within_noise,
    )
    if len(ranked) > 1 and (even := break_even_tokens(ranked[0], ranked[1])) is not None:
        rows[-1]["cost"] += (
            f"; a one-time {even['extra_s']:,.0f} s more than {ranked[1]['technique']}'s "
            f"(warm-up past its steps' time, compilation included), repaid after "
            f"{even['tokens'] / 1e6:,.0f}M tokens"
        )
    return rows


def one_time_s(c: dict) -> float | None:
    """A cell's warm-up beyond its warm-up steps at the timed step time: compilation, autotuning
    and first-touch costs (as this run paid them, with whatever compile caches it found)."""
    if c.get("warmup_s") is None or c.get("warmup_steps") is None:
        return None
    return c["warmup_s"] - c["warmup_steps"] * c["step_time_ms_mean"] / 1e3


def break_even_tokens(win: dict, other: dict) -> dict | None:
    """The training tokens after which `win` (faster) has repaid its longer one-time warm-up
    against `other`: extra / (1 / other's tokens/s - 1 / win's). None where it pays nothing
    extra, is not faster, or a warm-up was not recorded."""
    a, b = one_time_s(win), one_time_s(other)
    if a is None or b is None or a <= b or win["tokens_per_s"] <= other["tokens_per_s"]:
        return None
    saved = 1 / other["tokens_per_s"] - 1 / win["tokens_per_s"]  # seconds a token
    return {"extra_s": a - b, "tokens": (a - b) / saved}


def _loss_with_spread(loss: dict) -> str:
    """A function's mean validation loss with its seed range (every quality number carries its
    spread; one seed has none)."""
    if loss["n"] > 1:
        return f"{loss['mean']:.4f} (seeds {loss['min']:.4f}–{loss['max']:.4f})"
    return f"{loss['mean']:.4f} (one seed)"


def _as_good_as_the_best(quality: dict) -> set[str]:
    """The functions not detectably worse than the reference's: the reference itself and those
    whose paired verdict against it is equivalent, better, or inconclusive with an interval (two
    paired seeds at least: one seed says nothing). A function with a diverged seed, or a positive
    control or another model (not techniques to use), is never among them."""

    def judged(r):
        p = r.get("paired") or {}
        return r["verdict"] in ("equivalent", "better") or (
            r["verdict"] == "inconclusive" and p.get("lo") is not None
        )

    return {
        r["function"]
        for r in quality.get("rows", [])
        if r["val_loss"]["n"] and not r.get("diverged_seeds") and not _not_a_technique(r)
        and (r["function"] == quality.get("reference_function") or judged(r))
    }  # fmt: skip


def _not_a_technique(row: dict) -> bool:
    """A quality row judged but never recommended: a positive control or another model."""
    return bool(row.get("control") or row.get("another_model"))


def tf32_reference(cells: list[dict], baseline: str) -> dict | None:
    """The TF32 reference: a technique that is the FP32 baseline with TF32 matmuls, every other
    knob equal. FP32 with TF32 off is the H100's slowest path; speed-ups are also given against
    this reference, the 'FP32/TF32' baseline most reports mean. Its name and its `same` cell."""
    knobs = SPEC_KEYS + list(LATER_SPEC_KEYS)
    same = ok_cells(cells)
    base = same.get(baseline)
    if base is None or base["precision"] != "fp32":
        return None
    for name, c in same.items():
        if c["precision"] == "tf32" and all(c[k] == base[k] for k in knobs if k != "precision"):
            return {"technique": name, "cell": c}
    return None


def add_tf32_speedups(relative: list[dict], cells: list[dict], ref: dict | None) -> None:
    """Each row of the comparison with the baseline gets its speed-up against the TF32
    reference too (None without one)."""
    by_key = {(c["technique"], c["batch_entry"]): c for c in cells}
    for row in relative:
        cell = by_key[row["technique"], row["batch_entry"]]
        row["speedup_tf32"] = (
            cell["tokens_per_s"] / ref["cell"]["tokens_per_s"] if ref is not None else None
        )


def findings(cells: list[dict], searches: list[dict], baseline: str) -> dict:
    """The headline numbers of the abstract, at the `same` batch (else the first entry)."""
    entries = sorted({c["batch_entry"] for c in cells}, key=entry_sort_key)
    entry = "same" if "same" in entries else (entries[0] if entries else None)
    ok = [c for c in cells if c["batch_entry"] == entry and c["status"] == "ok"]
    base = next((c for c in ok if c["technique"] == baseline), None)
    result = {
        "entry": entry,
        "batch_size": None,
        "baseline_ok": base is not None,
        "lowest_memory": None,
        "fastest": None,
        "largest_batch": None,
    }
    if ok:
        result["batch_size"] = ok[0]["batch_size"]
        low = min(ok, key=lambda c: c["peak_allocated_mib"])
        base_mib = base["peak_allocated_mib"] if base else None
        saving = 100 * (1 - low["peak_allocated_mib"] / base_mib) if base_mib else None
        result["lowest_memory"] = {
            "technique": low["technique"],
            "peak_mib": low["peak_allocated_mib"],
            "baseline_mib": base_mib,
            "saving_pct": saving,
        }
        fast = max(ok, key=lambda c: c["tokens_per_s"])
        base_tps = base["tokens_per_s"] if base else None
        result["fastest"] = {
            "technique": fast["technique"],
            # the others whose throughput is within noise of it (memopt.report.noise)
            "tied": [c for c in ok if c is not fast and within_noise(c, fast)],
            "tokens_per_s": fast["tokens_per_s"],
            "baseline_tokens_per_s": base_tps,
            "speedup": ratio(fast["tokens_per_s"], base_tps),
        }
    # "Trains" means a cell finished: a search maximum whose full run ran out of memory is not it.
    trained = [c for c in cells if c["status"] == "ok"]
    if trained:
        top = max(trained, key=lambda c: c["batch_size"])
        base_batches = [c["batch_size"] for c in trained if c["technique"] == baseline]
        base_max = max(base_batches) if base_batches else None
        status = {s["technique"]: s["status"] for s in searches}
        capped = capped_techniques(searches)
        # Techniques whose searches stopped at the same cap tie: none is known to train more.
        tied = [
            c["technique"]
            for c in trained
            if c["batch_entry"] == "max"
            and c["technique"] != top["technique"]
            and c["batch_size"] == top["batch_size"]
            and {c["technique"], top["technique"]} <= capped
        ]
        result["largest_batch"] = {
            "technique": top["technique"],
            "tied": tied,
            "max_batch": top["batch_size"],
            "capped": status.get(top["technique"]) == "capped" and top["batch_entry"] == "max",
            "baseline_max_batch": base_max,
            "ratio": ratio(top["batch_size"], base_max),
        }
    return result


INDEX_LIMIT = 2**31 - 1  # elements a kernel indexes with 32-bit offsets (PyTorch: numel < 2^31 - 1)
# A sweep of `compiled` by batch across the limit (its README: a 14% step from 65 to 66 sequences)
SWEEP = "studies/h200-default/same-batch/compiled-sweep"


def batch_change(same: dict, big: dict) -> dict[str, float]:
    """How throughput changes from one cell to another of a larger batch: by the mean step (the
    tokens/s the tables show) and by the median step (the steady state, which a few slow steps,
    the results table's dagger, do not move)."""
    median = [c["batch_size"] / (c.get("step_time_ms_median") or c["step_time_ms_mean"])
              for c in (same, big)]  # fmt: skip
    return {"mean": big["tokens_per_s"] / same["tokens_per_s"] - 1,
            "median": median[1] / median[0] - 1}  # fmt: skip


def sweep_step(last: int, root: Path | None = None) -> dict | None:
    """The sweep's (SWEEP, in the repository) `compiled` cells at the last batch within the
    limit and the first past it, with the GPU and commit they ran on, and its `flash` cells
    nearest either side (a step of its own, or none): {below, above (each: batch, tokens_per_s),
    change, gpu, gpu_uuid, commit, flash: {below, above, change} or None}; None without the sweep."""
    folder = (root or Path(__file__).resolve().parents[3]) / SWEEP
    runs = {}
    for f in folder.glob("cell_*.json"):
        c = read_json(f)
        if c.get("status") == "ok":
            runs.setdefault(c["technique"], {})[c["batch_size"]] = c

    def pair(technique):
        by = runs.get(technique, {})
        below = max((b for b in by if b <= last), default=None)
        above = min((b for b in by if b > last), default=None)
        if below is None or above is None:
            return None
        b, a = by[below], by[above]
        return {"below": {"batch": below, "tokens_per_s": b["tokens_per_s"]},
                "above": {"batch": above, "tokens_per_s": a["tokens_per_s"]},
                "change": a["tokens_per_s"] / b["tokens_per_s"] - 1,
                "gpu": (a.get("provenance") or {}).get("gpu"),
                "gpu_uuid": (a.get("provenance") or {}).get("gpu_uuid"),
                "commit": (a.get("provenance") or {}).get("git_commit")}  # fmt: skip

    compiled = pair("flash_compile")
    return {**compiled, "flash": pair("flash")} if compiled else None


def logits_step(cells: list[dict], seq_len: int, vocab: int, increments: list[dict]) -> list[dict]:
    """Compiled techniques whose `max` cell's logits (batch x seq_len x vocab elements) pass 2^31
    elements (`both_past`: the `same` cell's too): the change between its two cells by the mean
    and the median step, and the uncompiled twin's (the one-knob pair, compile) between its own
    two cells for contrast. Past 2^31 elements a kernel needs 64-bit indexing; the cells do
    not isolate that cause (a sweep by batch does: studies/h200-default/same-batch/compiled-sweep)."""
    last = (INDEX_LIMIT - 1) // (seq_len * vocab)  # the largest batch whose logits stay below it
    ok = {(c["technique"], c["batch_entry"]): c for c in cells if c["status"] == "ok"}

    def change(technique):  # max against same
        same, big = ok.get((technique, "same")), ok.get((technique, "max"))
        if not same or not big or big.get("measured_as"):
            return None
        return {"same_batch": same["batch_size"], "max_batch": big["batch_size"],
                "change": batch_change(same, big)}  # fmt: skip

    out = []
    for (technique, entry), c in ok.items():
        step = change(technique) if entry == "same" and c.get("compile") in (True, "True") else None
        if step is None or step["max_batch"] <= last:
            continue
        twin = next((r["over"] for r in increments
                     if r["technique"] == technique and r["knob"] == "compile"), None)  # fmt: skip
        out.append({"technique": technique, "last_within": last, **step, "limit": "2³¹", "sweep": SWEEP,
                    "swept": sweep_step(last),
                    "both_past": step["same_batch"] > last,
                    "twin": twin, "twin_step": change(twin) if twin else None})  # fmt: skip
    return out
