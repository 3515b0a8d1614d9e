"""Cells and the batch-size search on a CPU, against tracked tensor memory."""

import json
import math

import numpy as np
import pytest
import torch
from conftest import write_random_tokens

from memopt.config import validate_config
from memopt.data.tokens import TokenData
from memopt.errors import KernelUnavailable, MemoptError
from memopt.jobs.cell import run_cell
from memopt.jobs.pipeline import resolve_batch
from memopt.jobs.search import search_max_batch
from memopt.runtime.measure import MemoryBudgetExceeded, TensorMemoryTracker


@pytest.fixture(scope="module")
def tokens(tmp_path_factory):
    d = write_random_tokens(tmp_path_factory.mktemp("tokens"))
    return TokenData(d)


def study(**techniques):
    return study_on("cpu", **techniques)


def study_on(device: str, **techniques):
    return validate_config(
        {
            "device": device,
            "model": {"n_layers": 2, "d_model": 32, "n_heads": 2, "d_ff": 64, "seq_len": 32},
            "train": {"warmup_steps": 2, "eval_sequences": 4, "eval_batch_size": 2},
            "measure": {"warmup_steps": 2, "min_timed_steps": 4, "max_timed_steps": 4},
            "search": {"cpu_memory_budget_gib": 8 / 1024, "max_batch": 512},
            "techniques": techniques or {"baseline": {}},
            "baseline": next(iter(techniques or {"baseline": 0})),
        }
    )


def test_tracker_counts_live_storages_and_enforces_the_budget():
    with TensorMemoryTracker() as tr:
        a = torch.empty(2**18)  # 1 MiB
        b = a.view(-1)  # a view costs nothing
        del a, b
        c = torch.empty(2**17)
    assert tr.peak == 2**20 and tr.current == 2**19
    del c
    with pytest.raises(MemoryBudgetExceeded), TensorMemoryTracker(budget_bytes=2**20):
        torch.empty(2**19)
        torch.empty(2**19)


def test_cell_measures_everything_and_is_reproducible(tokens):
    cfg = study(baseline={}, bf16={"precision": "bf16", "attention": "auto"})
    a = run_cell(cfg, "baseline", "4", 4, tokens, "cpu")
    assert a["status"] == "ok" and a["kernel"] == "math" and a["timed_steps"] == 4
    assert len(a["loss_curve"]) == 6 and a["peak_allocated_mib"] > 0
    assert a["tokens_per_s"] == pytest.approx(4 * 32 / (a["step_time_ms"]["mean"] / 1e3))
    b = run_cell(cfg, "baseline", "4", 4, tokens, "cpu")
    assert a["loss_curve"] == b["loss_curve"]
    c = run_cell(cfg, "bf16", "4", 4, tokens, "cpu")
    assert c["kernel"] == "flash" and c["loss_curve"][0] == pytest.approx(
        a["loss_curve"][0], rel=1e-2
    )


def test_out_of_memory_is_a_result_not_a_crash(tokens):
    res = run_cell(study(), "baseline", "max", 4096, tokens, "cpu")
    assert res["status"] == "oom" and "budget" in res["error"] and res["tokens_per_s"] is None


def test_other_errors_are_errors(tokens):
    # device auto passes validation (a GPU may be there); on a CPU the kernel is missing at run
    # time. (With device cpu the config is refused when read: tests/test_knobs.py.)
    cfg = study_on("auto", local={"attention": "flex", "window": 8})
    with pytest.raises(KernelUnavailable):
        run_cell(cfg, "local", "4", 4, tokens, "cpu")


def test_search_is_exact_and_records_both_trials(tokens):
    res = search_max_batch(study(), "baseline", tokens, "cpu", progress=lambda m: None)
    best = res["max_batch"]
    assert res["status"] == "ok" and best > 1 and res["first_failing_batch"] == best + 1
    by_batch = {t["batch"]: t["fits"] for t in res["trials"]}
    assert by_batch[best] is True and by_batch[best + 1] is False
    assert all(fits == (b <= best) for b, fits in by_batch.items())


def test_search_cap_and_none_fits(tokens):
    cfg = study()
    cfg["search"]["max_batch"] = 3
    assert search_max_batch(cfg, "baseline", tokens, "cpu", lambda m: None)["status"] == "capped"
    cfg["search"].update(max_batch=512, cpu_memory_budget_gib=1e-6)
    res = search_max_batch(cfg, "baseline", tokens, "cpu", lambda m: None)
    assert (res["status"], res["max_batch"]) == ("none_fits", 0)
    cfg["search"]["cpu_memory_budget_gib"] = None
    with pytest.raises(MemoptError, match="search.cpu_memory_budget_gib"):
        search_max_batch(cfg, "baseline", tokens, "cpu", lambda m: None)


@pytest.mark.slow  # four searches in one process: state leaking from one to the next
def test_search_does_not_depend_on_order(tokens):
    cfg = study(baseline={}, gradcp={"checkpointing": "full"})
    cfg["search"]["cpu_memory_budget_gib"] = 4 / 1024  # smaller batches: a quicker test
    first = [
        search_max_batch(cfg, t, tokens, "cpu", lambda m: None)["max_batch"]
        for t in ("baseline", "gradcp")
    ]
    second = [
        search_max_batch(cfg, t, tokens, "cpu", lambda m: None)["max_batch"]
        for t in ("gradcp", "baseline")
    ][::-1]
    assert first == second and first[1] > first[0]  # checkpointing fits a larger batch


def test_resolve_batch(tmp_path):
    (tmp_path / "b.json").write_text(json.dumps({"max_batch": 40}))
    (tmp_path / "t.json").write_text(json.dumps({"max_batch": 90}))
    assert resolve_batch("same", tmp_path / "t.json", tmp_path / "b.json") == 40
    assert resolve_batch("max", tmp_path / "t.json", tmp_path / "b.json") == 90
    assert resolve_batch("12", None, None) == 12
    with pytest.raises(MemoptError, match="run the search"):
        resolve_batch("max", tmp_path / "missing.json", None)


def test_cell_reports_phase_memory_breakdown_and_model_flops(tokens):
    from memopt.runtime.flops import flops_per_token

    res = run_cell(study(), "baseline", "4", 4, tokens, "cpu")
    n_params = 300 * 32 + 32 * 32 + 2 * (4 * 32 * 32 + 4 * 32 + 2 * 32 * 64 + 64 + 32 + 4 * 32) + 64
    b = res["memory_breakdown"]
    assert b["weights_mib"] * 2**20 == 4 * n_params  # fp32 weights, the tied embedding once
    assert b["gradients_mib"] == b["weights_mib"]
    # AdamW keeps two moments per weight (and a scalar step per parameter tensor).
    assert 2 * b["weights_mib"] < b["optimizer_state_mib"] < 2 * b["weights_mib"] + 0.01
    # The output layer, measured: it keeps at least the FP32 logits (4 x 32 tokens x 300) for
    # the backward pass, whose gradient then needs about as much again (less what the backward
    # pass has freed by then).
    logits = 4 * 32 * 300 * 4 / 2**20
    assert b["activations_mib"] > b["logits_mib"] >= logits
    assert b["logits_grad_mib"] >= 0.95 * logits
    chunked = run_cell(study(t={"loss": "chunked", "loss_chunk": 32}), "t", "4", 4, tokens, "cpu")
    assert chunked["memory_breakdown"]["logits_mib"] < logits / 10  # chunks are recomputed
    p = res["phase_memory"]
    assert p["peak_forward_mib"] >= p["after_forward_mib"] > p["before_step_mib"]
    assert p["peak_backward_mib"] >= p["after_backward_mib"]
    assert res["peak_allocated_mib"] >= max(p["peak_forward_mib"], p["peak_backward_mib"])
    assert res["mfu"] is None  # no datasheet peak for a CPU
    per_token = flops_per_token(study()["model"], 300, None)
    assert res["model_tflops"] == pytest.approx(per_token * res["tokens_per_s"] / 1e12)


def test_flops_per_token_by_hand():
    from memopt.runtime.flops import flops_per_token

    m = {"d_model": 8, "n_layers": 2, "d_ff": 16, "seq_len": 4}
    n_matmul = 2 * (4 * 64 + 2 * 8 * 16) + 8 * 10
    # causal: queries see 1, 2, 3, 4 keys (mean 2.5); window 2: 1, 2, 2, 2 (mean 1.75)
    assert flops_per_token(m, 10, None) == 6 * n_matmul + 12 * 2 * 8 * 2.5
    assert flops_per_token(m, 10, 2) == 6 * n_matmul + 12 * 2 * 8 * 1.75


def test_search_granularity_and_strategies_agree(tokens):
    cfg = study()
    cfg["search"]["cpu_memory_budget_gib"] = 4 / 1024  # smaller batches: a quicker test
    cfg["search"]["from_plan"] = False  # the fit strategy's own aim, from batch 1
    fit = search_max_batch(cfg, "baseline", tokens, "cpu", lambda m: None)
    cfg["search"]["strategy"] = "bisect"
    bisect = search_max_batch(cfg, "baseline", tokens, "cpu", lambda m: None)
    assert fit["max_batch"] == bisect["max_batch"]
    assert len(fit["trials"]) < len(bisect["trials"]) and len(fit["trials"]) <= 6
    assert fit["fit"]["per_sample_mib"] > 0 and fit["prediction_error"] is not None
    cfg["search"].update(strategy="fit", granularity=4)
    res = search_max_batch(cfg, "baseline", tokens, "cpu", lambda m: None)
    assert res["max_batch"] % 4 == 0 and res["first_failing_batch"] == res["max_batch"] + 4
    assert res["max_batch"] <= fit["max_batch"] < res["max_batch"] + 4


def test_search_raises_errors_other_than_out_of_memory(tokens):
    cfg = study_on("auto", local={"attention": "flex", "window": 8})  # as above
    with pytest.raises(KernelUnavailable):
        search_max_batch(cfg, "local", tokens, "cpu", lambda m: None)


def test_gpu_headroom_is_left_free(monkeypatch):
    """On a GPU the search may use what is free (plus its own cache) or the budget, less the
    headroom; a headroom larger than that is refused with the key and the limit."""
    from memopt.jobs import search

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (70 * 2**30, 80 * 2**30))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda: 2 * 2**30)
    cfg = study()
    cfg["search"].update(memory_budget_gib=None, headroom_mib=1024)
    assert search.available_mib(cfg, "cuda") == 72 * 1024 - 1024
    cfg["search"]["memory_budget_gib"] = 40  # an emulated 40 GB card: the smaller of the two
    assert search.available_mib(cfg, "cuda") == 40 * 1024 - 1024
    cfg["search"]["headroom_mib"] = 50_000
    with pytest.raises(
        MemoptError, match=r"search.headroom_mib: 50000 .* less than the 40,960 MiB"
    ):
        search.available_mib(cfg, "cuda")
    cfg["search"]["cpu_memory_budget_gib"] = 0.5  # a CPU budget is exact: no headroom there
    assert search.available_mib(cfg, "cpu") == 512


def test_a_trial_past_the_allocator_slack_is_a_measured_miss(tokens, monkeypatch):
    """On a GPU a trial fits when it trains and its allocated peak stays
    search.allocator_slack_mib below the budget (within it the allocator's cache makes running
    out of memory a matter of chance); past that limit it is a miss, measured."""
    from memopt.config import technique_spec
    from memopt.jobs import search

    cfg = study()
    spec = technique_spec(cfg, "baseline")
    free = search._trial(cfg, spec, tokens, 2, "cpu", None)
    assert free["fits"] and not free["out_of_memory"]
    tight = search._trial(cfg, spec, tokens, 2, "cpu", free["peak_mib"] - 0.01)
    assert (tight["fits"], tight["out_of_memory"]) == (False, False)
    assert tight["peak_mib"] == pytest.approx(free["peak_mib"])
    assert search.fit_limit_mib(cfg, "cpu", 512.0) == 512.0  # the CPU's tracker has no cache
    assert search.fit_limit_mib(cfg, "cuda", 79_524.0) == 79_268.0
    cfg["search"]["allocator_slack_mib"] = 80_000
    with pytest.raises(MemoptError, match=r"allocator_slack_mib: 80000 .* less than the 79,524"):
        search.fit_limit_mib(cfg, "cuda", 79_524.0)
    # The search under such a limit (here 70% of the CPU budget) proves the limit's maximum.
    whole = search_max_batch(study(), "baseline", tokens, "cpu", progress=lambda m: None)
    monkeypatch.setattr(search, "fit_limit_mib", lambda cfg, device, avail: 0.7 * avail)
    res = search_max_batch(study(), "baseline", tokens, "cpu", progress=lambda m: None)
    assert 1 < res["max_batch"] < whole["max_batch"] and res["fit_limit_mib"] < res["budget_mib"]
    by_batch = {t["batch"]: t for t in res["trials"]}
    assert by_batch[res["max_batch"]]["peak_mib"] <= res["fit_limit_mib"]
    above = by_batch[res["max_batch"] + 1]
    assert not above["fits"] and (
        above["out_of_memory"] or above["peak_mib"] > res["fit_limit_mib"]
    )
    assert any(not t["fits"] and not t["out_of_memory"] for t in res["trials"])


def test_the_search_starts_from_the_plan(tokens, monkeypatch):
    """With search.from_plan the first trial is memopt plan's maximum, which on a CPU models the
    tracked tensors: here it is right, so the search proves it in 3 trials (the maximum, the
    batch after it, half of it for the line) where the search from batch 1 needs more. A wrong
    plan still yields the proven maximum; both record the plan and its error."""
    from memopt.jobs import search

    quiet, planned_batch = {"progress": lambda m: None}, search.planned_batch
    flash = {"flash": {"precision": "bf16", "attention": "auto"}}  # CPU: PyTorch's flash kernel
    off = study(**flash)
    off["search"]["from_plan"] = False
    whole = search_max_batch(off, "flash", tokens, "cpu", **quiet)
    best = whole["max_batch"]
    assert whole["plan_batch"] is None and whole["n_trials"] > 3  # torch 2.13: 1, 32, 37, 41, 42
    planned = search_max_batch(study(**flash), "flash", tokens, "cpu", **quiet)
    assert (planned["plan_batch"], planned["plan_error"], planned["max_batch"]) == (best, 0, best)
    assert [t["batch"] for t in planned["trials"]] == [best, best + 1, best // 2]
    best = search_max_batch(study(), "baseline", tokens, "cpu", **quiet)["max_batch"]
    for planned, trials in ((best, 3), (best + 3, None), (best - 2, None)):
        monkeypatch.setattr(search, "planned_batch", lambda *a, p=planned: p)
        res = search_max_batch(study(), "baseline", tokens, "cpu", **quiet)
        assert (res["max_batch"], res["first_failing_batch"]) == (best, best + 1)
        assert res["trials"][0]["batch"] == planned and res["plan_batch"] == planned
        assert res["plan_error"] == planned - best
        assert trials is None or res["n_trials"] == trials
        batches = [t["batch"] for t in res["trials"] if t["fits"]]
        assert res["fit"] and 2 * min(batches) <= max(batches)  # a line over a factor 2
    cfg = validate_config({**study(), "techniques": {"flash": {"precision": "bf16",
                           "attention": "flash"}}, "baseline": "flash"})  # fmt: skip
    spec, model = cfg["techniques"]["flash"], cfg["model"]
    from memopt.plan.memory import memory_line

    assert planned_batch(cfg, spec, 512, 500.0, None, 10**6) == memory_line(
        model, 512, spec
    ).max_batch(500.0)
    assert planned_batch(cfg, spec, 512, 500.0, None, 3) == 3  # within the cap
    fp8 = {**spec, "precision": "fp8"}
    assert planned_batch(cfg, fp8, 512, 500.0, None, 10**6) is None  # not modelled


def test_too_little_text_for_the_sequence_length_names_the_split_and_the_fix():
    from memopt.data.tokens import Batches, eval_sequences

    few = np.arange(20, dtype=np.uint16)
    with pytest.raises(MemoptError, match=r"training split has 20 tokens, fewer than model\.seq"):
        Batches(few, 32, 4, 0, "cpu")
    with pytest.raises(MemoptError, match=r"validation split has 20 tokens.*corpus\.val_fraction"):
        eval_sequences(few, 32, 8)


def test_the_host_bound_scales_what_grew_and_charges_it_as_offloading_pins_it():
    """Twelve checkpoints grow with the batch, two small tensors do not, loss chunks (12 MiB,
    pinned as 16) come more often with it: the bound is the
    largest batch whose pinned pieces (256 MiB, the last rounded up to a power of two) stay
    within the budget, found from two trials without running it."""
    from memopt.jobs.host_bound import host_bound
    from memopt.runtime.offload import charged_bytes

    # bytes of one checkpoint per sequence; a constant; a loss chunk, one per 4 sequences
    per_sequence, fixed, chunk = 3_827_302, 65_536, 12 * 2**20

    def trial(b):
        tensors = [[fixed, 2], [per_sequence * b, 12], [chunk, math.ceil(b / 4)]]
        return {"batch": b, "fits": True, "host_tensors": sorted(tensors)}

    def pinned(b):
        checkpoints = 12 * charged_bytes(per_sequence * b)
        return 2 * charged_bytes(fixed) + checkpoints + math.ceil(b / 4) * charged_bytes(chunk)

    budget = 64_443 * 2**20
    bound = host_bound([trial(150), trial(700)], 1, budget, 19_000, {})
    assert pinned(bound) <= budget < pinned(bound + 1)
    assert host_bound([trial(150), trial(700)], 4, budget, 19_000, {}) == bound // 4
    assert host_bound([], 1, budget, 19_000, {}) is None


def test_the_reported_line_spans_at_least_a_factor_two():
    """The search's last fits are often one batch apart, where rounding would be the slope:
    the line goes through the largest fit and the largest at most half of it."""
    from memopt.jobs.search import _line

    fits = [{"batch": b, "peak_mib": p} for b, p in ((1, 900.0), (150, 2000.0), (1062, 10000.0),
                                                     (1080, 10140.0), (1081, 10150.0))]  # fmt: skip
    line = _line(fits)
    assert line["batches"] == [150, 1081]
    assert line["per_sample_mib"] == pytest.approx((10150 - 2000) / 931)
    assert _line(fits[:1]) is None


def llama_1b_1024_offloaded(b: int) -> list:
    """The tensors `ckpt_offload` offloads at llama_1b_1024 with b sequences (the H200 map's
    search, 6a85181): 17 checkpoints of 8 MiB a sequence, two per-sequence tensors, 32 fixed
    ones, and two of the chunked loss per 4,096 tokens (4 sequences), with a part chunk of the
    rest where b is no multiple of 4."""
    whole, rest = divmod(b, 4)
    tensors = {131_072: 32, 4096 * b: 1, 8192 * b: 1, 8 * 2**20 * b: 17}
    for per_chunk in (32_768, 32 * 2**20):
        tensors[per_chunk] = tensors.get(per_chunk, 0) + whole
        if rest:
            tensors[per_chunk * rest // 4] = tensors.get(per_chunk * rest // 4, 0) + 1
    return sorted([size, n] for size, n in tensors.items())


def test_a_part_chunk_of_the_loss_is_charged_as_what_it_is():
    """The H200 map's llama_1b_1024 `ckpt_offload` search (6a85181): 432 and 433 sequences fit
    (62,221 and 64,405 MiB pinned), 437 fit at 64,437 MiB and 438 passed the 64,443.86-MiB
    budget. Charging 433's part chunk as a whole one put the bound at 433, and the search
    walked up 434, 435, 437, 441, 438 (8 trials); with the loss's chunk structure the bound is
    437 from the fits at 433 and 216, and the whole search takes 5 trials."""
    from functools import partial

    from memopt.jobs.bracket import prove_max
    from memopt.jobs.host_bound import host_bound
    from memopt.runtime.offload import charged_bytes

    recorded = {432: 62_221.375, 433: 64_405.3828125, 216: 32_200.6875, 434: 64_413.390625,
                435: 64_429.40625, 437: 64_437.4140625}  # fmt: skip

    def pinned_mib(b):
        return sum(n * charged_bytes(size) for size, n in llama_1b_1024_offloaded(b)) / 2**20

    assert {b: pinned_mib(b) for b in recorded} == recorded  # the model is the run's
    budget = 64_443.857421875 * 2**20
    assert pinned_mib(437) * 2**20 <= budget < pinned_mib(438) * 2**20

    def fit(b):
        return {"batch": b, "fits": True, "host_tensors": llama_1b_1024_offloaded(b)}

    seen = [fit(432), fit(433), fit(216)]
    assert host_bound(seen, 1, budget, 11_233, {}, chunk=(1024, 4096)) == 437
    assert host_bound(seen, 1, budget, 11_233, {}) == 433  # as a whole chunk: 4 short

    trials = []

    def test(k):
        fits = pinned_mib(k) * 2**20 <= budget
        trials.append({**fit(k), "fits": fits})
        return {"backward": 15_838.0 + 147.14 * k} if fits else None

    bound = partial(host_bound, trials, 1, budget, 11_233, chunk=(1024, 4096))
    found = prove_max(test, 11_233, {"backward": 141_123.0}, {"backward": 15_000.0}, 1, bound,
                      432)  # fmt: skip
    assert (found["lo"], found["hi"]) == (437, 438)
    assert [t["batch"] for t in trials] == [432, 433, 216, 437, 438]
