"""Protocol v2 (issue 11): function grouping and the exactness check, with the noise floor that
sets its tolerance."""

import math

import pytest
import torch

from memopt.report.verdicts import exactness, noise_floor
from memopt.runtime.functions import function_of, functions, quality_spec, reference_technique

TECHNIQUES = {
    "baseline": {
        "precision": "fp32",
        "attention": "math",
        "window": None,
        "checkpointing": "none",
        "compile": False,
    },
    "bf16": {
        "precision": "bf16",
        "attention": "math",
        "window": None,
        "checkpointing": "none",
        "compile": False,
    },
    "flash": {
        "precision": "bf16",
        "attention": "flash",
        "window": None,
        "checkpointing": "none",
        "compile": False,
    },
    "flash_gradcp": {
        "precision": "bf16",
        "attention": "flash",
        "window": None,
        "checkpointing": "full",
        "compile": False,
    },
    "local128": {
        "precision": "bf16",
        "attention": "flex",
        "window": 128,
        "checkpointing": "none",
        "compile": False,
    },
    "gradcp": {
        "precision": "fp32",
        "attention": "math",
        "window": None,
        "checkpointing": "full",
        "compile": False,
    },
}


def _filled(spec: dict) -> dict:
    """A technique as the workflow runs it: every knob's default filled by the config's schema."""
    from memopt.config import full_spec

    return full_spec(spec)


def test_function_grouping():
    groups = functions(TECHNIQUES)
    assert groups == {
        "fp32": ["baseline", "gradcp"],
        "bf16": ["bf16", "flash", "flash_gradcp"],
        "bf16_w128": ["local128"],
    }
    assert function_of(TECHNIQUES["flash"]) == function_of(TECHNIQUES["flash_gradcp"])
    assert function_of(TECHNIQUES["local128"]) != function_of(TECHNIQUES["bf16"])
    assert reference_technique(TECHNIQUES, "flash_gradcp") == "bf16"  # the explicit kernel
    assert reference_technique(TECHNIQUES, "gradcp") == "baseline"
    assert reference_technique(TECHNIQUES, "local128") == "local128"
    q = quality_spec(TECHNIQUES, "bf16_w128")
    assert (q["attention"], q["window"], q["checkpointing"], q["compile"]) == (
        "auto",
        128,
        "none",
        False,
    )


def _record(name, losses):
    return {"technique": name, "batch_size": 4, "steps": len(losses), "losses": losses}


def test_exactness_fails_an_inexact_technique():
    ref = [7.0 - 0.1 * i for i in range(10)]
    records = [
        _record("bf16", ref),
        _record("flash", [v + 0.01 for v in ref]),  # within bf16's 0.05
        _record("flash_gradcp", [v + (0.2 if i > 5 else 0.0) for i, v in enumerate(ref)]),
        _record("baseline", ref),
        _record("gradcp", [v + 0.02 for v in ref]),  # over fp32's 0.01
    ]
    tol = {"fp32": 0.01, "tf32": 0.02, "bf16": 0.05}
    check = exactness(records, TECHNIQUES, tol)
    rows = {r["technique"]: r for r in check["rows"]}
    assert rows["bf16"]["ok"] is None and rows["baseline"]["ok"] is None  # references
    assert rows["flash"]["ok"] and rows["flash"]["max_abs_diff"] == pytest.approx(0.01)
    assert not rows["flash_gradcp"]["ok"] and rows["flash_gradcp"]["max_abs_diff"] == pytest.approx(
        0.2
    )
    assert not rows["gradcp"]["ok"]
    assert not check["holds"] and check["failed"] == ["flash_gradcp", "gradcp"]
    records[-1] = _record("gradcp", [float("nan")] * 10)
    assert not {r["technique"]: r for r in exactness(records, TECHNIQUES, tol)["rows"]}["gradcp"][
        "ok"
    ]
    # As written to JSON (issue 31: no NaN in a result): null, still a failed check.
    records[-1] = _record("gradcp", ref[:5] + [None] * 5)
    row = {r["technique"]: r for r in exactness(records, TECHNIQUES, tol)["rows"]}["gradcp"]
    assert row["ok"] is False and row["max_abs_diff"] == math.inf


def test_exactness_on_a_real_inexact_kernel(tiny_study, monkeypatch):
    """Two real CPU runs: the explicit kernel against itself agrees exactly; a kernel that drops
    the 1/sqrt(d) scale (same shapes, other arithmetic) fails the check."""
    from memopt.jobs.quality import run_exactness
    from memopt.runtime import attention

    cfg, data = tiny_study
    techniques = {
        "plain": _filled(TECHNIQUES["baseline"]),
        "ckpt": _filled(TECHNIQUES["gradcp"]),
    }
    cfg = {
        **cfg,
        "techniques": techniques,
        "exactness": {
            "steps": 6,
            "batch": 2,
            "tolerance": {"fp32": 1e-4, "tf32": 0.02, "bf16": 0.05},
        },
    }
    plain = run_exactness(cfg, "plain", data, "cpu")
    good = run_exactness(cfg, "ckpt", data, "cpu")
    assert exactness([plain, good], techniques, cfg["exactness"]["tolerance"])["holds"]

    def unscaled(q, k, v, window=None):
        scores = q @ k.transpose(-2, -1)
        keep = attention.band_mask(q.size(-2), window, str(q.device))
        return torch.softmax(scores.masked_fill(~keep, float("-inf")), dim=-1) @ v

    monkeypatch.setitem(attention.IMPLEMENTATIONS, "math", unscaled)
    bad = run_exactness(cfg, "ckpt", data, "cpu")
    check = exactness([plain, bad], techniques, cfg["exactness"]["tolerance"])
    assert check["failed"] == ["ckpt"]


def test_exactness_gives_another_function_of_one_precision_for_scale():
    """A windowed technique is another function than bf16: its loss against bf16's is the scale
    the tolerance is read against (within it here: the check then cannot tell the two apart)."""
    techniques = {
        **TECHNIQUES,
        "local": {**TECHNIQUES["bf16"], "attention": "flex", "window": 64},
    }
    ref = [7.0 - 0.1 * i for i in range(10)]
    tol = {"fp32": 0.01, "tf32": 0.02, "bf16": 0.05}
    near = exactness(
        [_record("bf16", ref), _record("local", [v + 0.03 for v in ref])], techniques, tol
    )
    assert [(c["technique"], c["against"], c["within"]) for c in near["controls"]] == [
        ("local", "bf16", True)
    ]
    assert near["controls"][0]["max_abs_diff"] == pytest.approx(0.03)
    far = exactness(
        [_record("bf16", ref), _record("local", [v + 0.3 for v in ref])], techniques, tol
    )
    assert far["controls"][0]["within"] is False
    # fp32's reference has no other fp32 function to be compared with
    alone = exactness([_record("baseline", ref), _record("bf16", ref)], techniques, tol)
    assert alone["controls"] == []


def test_the_noise_floor_sets_the_tolerance():
    """Synthetic: the reference's run against its second kernel differs by at most 0.004, so with
    floor_factor 2 a technique 0.006 away passes and one 0.01 away fails, although both are
    within bf16's 0.05; without a floor (none recorded) the precision's tolerance applies."""
    ref = [7.0 - 0.1 * i for i in range(10)]
    floor = {"kernel": "math", "losses": [v + 0.004 * (i % 2) for i, v in enumerate(ref)]}
    records = [
        {**_record("bf16", ref), "floor": floor},
        _record("flash", [v + 0.006 for v in ref]),
        _record("flash_gradcp", [v - 0.01 for v in ref]),
    ]
    tol = {"fp32": 0.01, "tf32": 0.02, "bf16": 0.05}
    rows = {r["technique"]: r for r in exactness(records, TECHNIQUES, tol, 2.0)["rows"]}
    assert rows["flash"]["ok"] and rows["flash"]["tolerance"] == pytest.approx(0.008)
    assert rows["flash_gradcp"]["ok"] is False and rows["flash"]["tolerance_from"] == "floor"
    assert rows["flash"]["floor"] == pytest.approx(0.004)
    records[0] = _record("bf16", ref)  # no floor run: bf16's 0.05, said so
    rows = {r["technique"]: r for r in exactness(records, TECHNIQUES, tol, 2.0)["rows"]}
    assert rows["flash_gradcp"]["ok"] and rows["flash_gradcp"]["tolerance_from"] == "precision"


def test_the_noise_floor_tells_two_functions_apart(tiny_study):
    """Real CPU runs: a tolerance loose enough that a 4-token window passes for full attention
    (the issue: local128 against flash within bf16's 0.05); the measured floor (the explicit
    kernel against PyTorch's flash kernel) tells them apart and still passes checkpointing."""
    from memopt.jobs.quality import add_floor, run_exactness

    cfg, data = tiny_study
    techniques = {
        "plain": _filled(TECHNIQUES["baseline"]),
        "ckpt": _filled(TECHNIQUES["gradcp"]),
        "window": _filled({**TECHNIQUES["baseline"], "window": 4}),
    }
    tol = {"fp32": 10.0, "tf32": 0.02, "bf16": 0.05}  # a round number, far too loose
    cfg = {**cfg, "techniques": techniques, "exactness": {"steps": 6, "batch": 2, "tolerance": tol}}
    plain = add_floor(cfg, run_exactness(cfg, "plain", data, "cpu"), data, "cpu")
    assert plain["floor"]["kernel"] == "flash" and plain["floor"]["against"] == "math"
    window = add_floor(cfg, run_exactness(cfg, "window", data, "cpu"), data, "cpu")
    assert window["floor"] == {"kernel": None, "reason": "no second exact kernel on cpu"}
    records = [plain, run_exactness(cfg, "ckpt", data, "cpu"), window]
    loose = exactness(records, techniques, tol)
    assert loose["holds"] and loose["controls"][0]["within"]  # cannot tell them apart
    check = exactness(records, techniques, tol, 2.0)
    assert check["holds"], check["rows"]  # checkpointing: the same function
    (control,) = check["controls"]
    assert control["against"] == "plain" and not control["within"], control


def test_a_compiled_exactness_run_draws_the_references_dropout_masks(tiny_study):
    """With dropout, torch.compile draws its own random numbers by default, so a compiled run
    drifts from its eager reference by a different dropout mask, not by rounding (0.011 nats in
    6 steps of this tiny fp32 model). Exactness runs draw eager's numbers: the compiled run is
    the reference's to rounding, and exactness.floor compile (the reference rerun compiled)
    records it under floor; a 4-token window is still told apart at floor_factor 2."""
    import torch._inductor.config as inductor_config

    from memopt.jobs.quality import add_floor, run_exactness

    cfg, data = tiny_study
    assert cfg["model"]["dropout"] > 0 and not inductor_config.fallback_random
    techniques = {
        "plain": _filled(TECHNIQUES["baseline"]),
        "compiled": _filled({**TECHNIQUES["baseline"], "compile": True}),
        "window": _filled({**TECHNIQUES["baseline"], "window": 4}),
    }
    tol = {"fp32": 10.0, "tf32": 0.02, "bf16": 0.05}
    e = {"steps": 6, "batch": 2, "tolerance": tol, "floor": "compile"}
    cfg = {**cfg, "techniques": techniques, "exactness": e}
    plain = add_floor(cfg, run_exactness(cfg, "plain", data, "cpu"), data, "cpu")
    assert plain["floor"]["kernel"] == "compiled" and plain["floor"]["against"] == "eager"
    assert noise_floor(plain) < 1e-4, noise_floor(plain)  # rounding only (was 0.011)
    assert not inductor_config.fallback_random  # only inside the exactness runs
    records = [
        plain,
        run_exactness(cfg, "compiled", data, "cpu"),
        run_exactness(cfg, "window", data, "cpu"),
    ]
    check = exactness(records, techniques, tol, 2.0, "compile")
    assert check["holds"] and check["floor_how"] == "the model under torch.compile", check["rows"]
    (control,) = check["controls"]
    assert control["against"] == "plain" and not control["within"], control


def test_an_exactness_run_leaves_no_compiled_graph_behind(tiny_study):
    """Dynamo reuses a graph whatever inductor's settings are later: the search trials that
    follow a compiled technique's exactness run in the same job must compile their own graph,
    which draws its own dropout masks as the cells' does, not the exactness run's eager ones."""
    from memopt.config import technique_spec
    from memopt.jobs import quality
    from memopt.runtime.step import prepare

    cfg, data = tiny_study
    techniques = {
        "plain": _filled(TECHNIQUES["baseline"]),
        "compiled": _filled({**TECHNIQUES["baseline"], "compile": True}),
    }
    e = {"steps": 4, "batch": 2, "tolerance": {"fp32": 0.01, "tf32": 0.02, "bf16": 0.05}}
    cfg = {**cfg, "techniques": techniques, "exactness": e}
    plain = quality.run_exactness(cfg, "plain", data, "cpu")
    compiled = quality.run_exactness(cfg, "compiled", data, "cpu")
    assert max(abs(a - b) for a, b in zip(compiled["losses"], plain["losses"])) < 1e-4
    spec = technique_spec(cfg, "compiled")  # a search trial after it, in the same process
    applied, opt, batches = prepare(cfg, spec, data, 2, "cpu", cfg["train"]["seed"])
    trial, _ = quality._losses(applied, opt, batches, 4, cfg, "cpu", "[trial]")
    assert max(abs(a - b) for a, b in zip(trial, plain["losses"])) > 1e-4, trial


def test_a_floor_that_cannot_run_or_diverged_falls_back_and_says_why(tiny_study, monkeypatch):
    from memopt.jobs import quality

    cfg, data = tiny_study
    techniques = {"plain": _filled(TECHNIQUES["baseline"])}
    tol = {"fp32": 0.01, "tf32": 0.02, "bf16": 0.05}
    cfg = {**cfg, "techniques": techniques, "exactness": {"steps": 2, "batch": 2, "tolerance": tol}}
    monkeypatch.setattr(quality, "second_kernel", lambda kernel, window, device: "flex")
    plain = quality.add_floor(cfg, quality.run_exactness(cfg, "plain", data, "cpu"), data, "cpu")
    assert plain["floor"]["kernel"] == "flex" and "CUDA" in plain["floor"]["reason"]
    from torch._dynamo.exc import BackendCompilerFailed

    def failed_compile(*args):  # floor compile: inductor fails (no compiler, a lowering bug)
        raise BackendCompilerFailed(lambda *a: None, RuntimeError("no C++ compiler"), None)

    record = quality.run_exactness(cfg, "plain", data, "cpu")
    monkeypatch.setattr(quality, "run_exactness", failed_compile)
    cfg["exactness"]["floor"] = "compile"
    plain = quality.add_floor(cfg, record, data, "cpu")
    assert plain["floor"]["kernel"] == "compiled" and "no C++ compiler" in plain["floor"]["reason"]
    ref = [7.0 - 0.1 * i for i in range(4)]
    records = [
        {**_record("bf16", ref), "floor": {"kernel": "math", "losses": ref[:3] + [None]}},
        _record("flash", [v + 0.04 for v in ref]),
    ]
    (row,) = [r for r in exactness(records, TECHNIQUES, tol, 2.0)["rows"] if r["ok"] is not None]
    assert row["tolerance_from"] == "precision" and row["tolerance"] == 0.05 and row["ok"]
