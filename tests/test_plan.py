"""`memopt plan` (memopt.plan): peak memory against the batch predicted from the model's shape
and the knobs, checked against the searches the H100 measured."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from memopt.config import validate_config
from memopt.plan.memory import host_max_batch, memory_line, unmodelled
from memopt.plan.report import CONTEXT_MIB, gpu_memory_mib, plan
from memopt.run.cli import main

ROOT = Path(__file__).resolve().parents[1]
STUDY = ROOT / "studies" / "h100-default"
EAGER = ("baseline", "tf32", "flash", "local128", "adamw8bit")  # nothing calibrated in their lines


def searches():
    for path in sorted((STUDY / "results" / "search").glob("*.json")):
        yield json.loads(path.read_text())


def test_first_principles_lines_match_the_h100s_fits():
    """Eager techniques: what autograd keeps, counted from the code, is the measured slope within
    0.1% and the fixed part within 1% (14 MiB: FP32's is the least sure), so the maximum is
    the measured one (those searches counted only out of memory: their limit is the budget less
    about 100 MiB the allocator keeps)."""
    cfg = validate_config(yaml.safe_load((STUDY / "config.yaml").read_text()))
    seen = set()
    for s in searches():
        if s["technique"] not in EAGER:
            continue
        seen.add(s["technique"])
        line = memory_line(cfg["model"], 32_000, s["spec"])
        fit = s["fit"]
        assert line.per_sequence_mib == pytest.approx(fit["per_sample_mib"], rel=1e-3)
        assert line.fixed_mib == pytest.approx(fit["fixed_mib"], rel=0.01)
        assert line.max_batch(s["budget_mib"] - 100) == s["max_batch"], s["technique"]
    assert seen == set(EAGER)


def test_a_llama_point_and_the_host_limit_of_offload():
    """Llama 128M at 1,024 tokens (the map, f0247d6, GPU-b570dff2): flash proved 96 sequences
    under a fit limit of 79,044 MiB (803.7 MiB a sequence); GPT-2's ckpt_offload at 4,096 tokens
    proved 373, bound by the 64,444 MiB of pinned host memory it may use (the GPU would allow
    about 526)."""
    llama = {"arch": "llama", "n_layers": 12, "d_model": 768, "n_heads": 12, "n_kv_heads": 4,
             "d_ff": 3072, "seq_len": 1024, "dropout": 0.0}  # fmt: skip
    flash = {"precision": "bf16", "attention": "flash"}
    line = memory_line(llama, 32_000, flash)
    assert line.per_sequence_mib == pytest.approx(803.7, rel=1e-3)
    assert line.max_batch(79_044) == 96
    gpt2 = {"n_layers": 12, "d_model": 768, "n_heads": 12, "d_ff": 3072, "seq_len": 4096,
            "dropout": 0.0}  # fmt: skip
    offload = {**flash, "checkpointing": "full", "loss": "chunked", "offload": "activations"}
    gpu = memory_line(gpt2, 32_000, offload).max_batch(79_046)
    assert gpu > 500 and host_max_batch(gpt2, offload, 64_444, gpu) == 373


def test_what_has_no_measured_point_is_not_predicted():
    assert unmodelled({"precision": "bf16", "attention": "flash"}) == []
    assert unmodelled({"precision": "fp8", "attention": "flash"}) == ["precision=fp8"]
    # gradients kept through the next micro-batch; a chunk's logits: not measured yet
    assert unmodelled({"precision": "bf16", "attention": "flash", "grad_accum": 8}) == [
        "grad_accum=8"]  # fmt: skip
    missing = unmodelled({"precision": "bf16", "attention": "flash", "loss": "chunked"})
    assert len(missing) == 1 and "loss=chunked" in missing[0]  # chunked without checkpointing
    with pytest.raises(ValueError, match="no measured point for optimizer=sgd"):
        memory_line({"n_layers": 1, "d_model": 8, "n_heads": 2, "d_ff": 16, "seq_len": 8},
                    100, {"precision": "bf16", "attention": "flash", "optimizer": "sgd"})  # fmt: skip


def test_gpu_memory_sizes_and_names():
    assert gpu_memory_mib("24GiB") == 24 * 1024 and gpu_memory_mib("H100-80GB") == 81_559
    assert gpu_memory_mib("40GB") == pytest.approx(40e9 / 2**20)
    for bad in ("24", "0GiB", "lots"):
        with pytest.raises(Exception, match=r"--gpu-memory: .* allowed: a size such as 24GiB"):
            gpu_memory_mib(bad)


def test_plan_follows_the_budget_the_search_would_have(tmp_path, capsys):
    cfg = validate_config(yaml.safe_load((ROOT / "config.yaml").read_text()))
    small = plan(cfg, 24 * 1024.0, 32_000)
    big = plan(cfg, 81_559.0, 32_000)
    for a, b in zip(small["rows"], big["rows"]):
        assert 0 < a["max_batch"] < b["max_batch"], a["technique"]
    # An emulated 24 GiB budget on the H100 limits PyTorch's allocator alone: a 24 GiB card
    # whose context lies outside it.
    card = [r["max_batch"] for r in plan(cfg, 24 * 1024.0 + CONTEXT_MIB, 32_000)["rows"]]
    cfg["search"]["memory_budget_gib"] = 24
    assert [r["max_batch"] for r in plan(cfg, 81_559.0, 32_000)["rows"]] == card
    fp8 = dict(yaml.safe_load((ROOT / "config.yaml").read_text()))
    fp8["techniques"] = {"baseline": {"precision": "fp32", "attention": "math"},
                         "fp8": {"precision": "fp8", "attention": "flash"}}  # fmt: skip
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(fp8))
    main(["plan", "--config", str(tmp_path / "c.yaml"), "--gpu-memory", "40GiB"])
    out = capsys.readouterr().out
    assert "| fp8 | not predicted: no measured point for precision=fp8" in out
    assert "| baseline | 1,329.6 | 1,551.75 |" in out
    with pytest.raises(SystemExit):
        main(["plan", "--config", str(tmp_path / "c.yaml"), "--gpu-memory", "1GiB"])
    assert "leaves nothing to train in" in capsys.readouterr().err


def test_plan_takes_the_studys_host_budget(tmp_path, capsys):
    """search.host_pinned_gib is what offloading may pin wherever the study runs: the plan
    checks it without --host-memory, and uses it over a --host-memory share."""
    raw = yaml.safe_load((ROOT / "config.yaml").read_text())
    raw["techniques"] = {"offload": {"precision": "bf16", "attention": "flash",
                                     "checkpointing": "full", "loss": "chunked",
                                     "offload": "activations"}}  # fmt: skip
    raw.update(baseline="offload", batch_sizes=["max"])
    raw.setdefault("search", {})["host_pinned_gib"] = 8
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(raw))

    def row(*more):
        main(["plan", "--config", str(tmp_path / "c.yaml"), "--gpu-memory", "80GiB", *more])
        out = capsys.readouterr().out
        assert "the host's pinned memory checked" in out
        return next(line for line in out.splitlines() if line.startswith("| offload |"))

    assert row() == row("--host-memory", "1TiB")  # the study's 8 GiB, not 500 GiB
    rows = {r["technique"]: r for r in plan(validate_config(raw), 81_920.0, 32_000,
                                            8 * 1024.0)["rows"]}  # fmt: skip
    assert f"| {rows['offload']['max_batch']:,} | " in row() and "| host |" in row()


def test_the_leave_one_out_tool_on_the_published_studies(tmp_path):
    """tools/plan_check.py: every configuration of the three published GPT-2 studies predicted
    from constants fitted on the others; its maxima are the measured ones within 1.1% (its
    table's summary line says so, computed) but for `offload` on both GPUs, whose limit is the
    host's pinned memory (1,493 predicted against 1,461: +2.2%); every search proven."""
    import subprocess
    import sys

    out = tmp_path / "loo.md"
    proc = subprocess.run([sys.executable, "tools/plan_check.py", "--out", str(out),
                           "--map-state", "none"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    rows = [line.split(" | ") for line in out.read_text().splitlines() if line.startswith("| h")]
    assert len(rows) == 23  # 8 + 8 + 7 searches
    scored = [r for r in rows if r[5] != "capped |"]
    errors = {(r[0], r[1]): float(r[5].rstrip(" |%")) for r in scored}
    assert len(errors) == 23 and errors.pop(("| h200-default", "offload")) == 2.2
    assert errors.pop(("| h100-default", "offload")) == 2.2
    assert max(abs(e) for e in errors.values()) <= 1.1
    assert "23 proven maxima (of 23 searches): median absolute error 0.0%" in out.read_text()


def test_calibration_recovers_the_shipped_constants():
    """The constants fitted to the published studies alone are the shipped GPT-2 ones (which
    the map's first points fitted as well): compile keeps the eager layers' bytes, the chunked
    loss's workspace is a quarter of d_ff."""
    from memopt.plan.calibrate import calibrate, point

    cfg = validate_config(yaml.safe_load((STUDY / "config.yaml").read_text()))
    points = [point(s, cfg["model"], 32_000) for s in searches()]
    cal = calibrate([p for p in points if p is not None])
    assert cal["compile_layer_factor"]["gpt2"] == pytest.approx(1.00, abs=0.01)
    assert cal["ckpt_chunked_workspace"]["gpt2"] == pytest.approx(0.26, abs=0.01)
    assert cal["fixed_extra_mib"]["eager"] == pytest.approx(0.0, abs=15)


def test_the_cpu_model_predicts_the_smoke_studys_searches():
    """config/smoke.yaml's searches on this machine's CPU (64 MiB of tracked tensors, dropout
    0.1, 2 cores, torch 2.13): baseline and tf32 42, bf16 53, flash (PyTorch's CPU flash
    kernel) 56, local16 53, gradcp 76 sequences. On a CPU dropout keeps typed masks, BF16 math
    attention a BF16 softmax and the loss three FP32 logits (memopt.plan.memory); with CUDA's
    rules the maxima would be off by up to 8 sequences."""
    cfg = validate_config(yaml.safe_load((ROOT / "config" / "smoke.yaml").read_text()))
    measured = {"baseline": 42, "tf32": 42, "bf16": 53, "flash": 56, "local16": 53, "gradcp": 76}
    rows = {r["technique"]: r for r in plan(cfg, None, 1000)["rows"]}
    assert {k: rows[k]["max_batch"] for k in measured} == measured
    assert rows["lean"]["missing"] == ["loss_chunk=16", "ckpt_chunked on a CPU"]
    model = cfg["model"]
    cuda = {k: memory_line(model, 1000, cfg["techniques"][k]).max_batch(64) for k in measured}
    assert max(abs(cuda[k] - measured[k]) for k in measured) >= 5
    assert rows["flash"]["speed"] is None  # no CPU cell is shipped
    # what no CPU search measured is not predicted there
    assert unmodelled({"precision": "bf16", "attention": "flash", "compile": True}, "cpu") == [
        "compiled on a CPU"]  # fmt: skip
    assert unmodelled({"precision": "fp32", "attention": "auto"}, "cpu") == [
        "attention=auto (flash on cpu) with precision=fp32"]  # fmt: skip


def test_tokens_per_second_from_the_nearest_measured_cell():
    """A configuration no cell measured (GPT-2 110M at 2,048 tokens, flash, on an H100) leans on
    the nearest cell of its knobs on that GPU; its tokens/s is that cell's model FLOP/s over its
    own FLOPs a token, inside the interval. A GPU or knobs with no cell: no prediction."""
    from memopt.plan import speed
    from memopt.runtime.flops import flops_per_token

    points = speed.load_points()
    assert len(points) >= 50
    gpt2 = {"n_layers": 12, "d_model": 768, "n_heads": 12, "d_ff": 3072, "seq_len": 2048,
            "dropout": 0.0}  # fmt: skip
    flash = {"precision": "bf16", "attention": "flash"}
    h100 = "NVIDIA H100 80GB HBM3"
    band = speed.band(points, h100)
    got = speed.predict(points, gpt2, 32_000, flash, 60, h100, band)
    q = next(p for p in points if p["where"] == got["leans_on"])
    assert q["gpu"] == h100 and q["key"] == speed.speed_key(flash) and q["seq_len"] in (1024, 4096)
    assert got["tokens_per_s"] == pytest.approx(
        q["model_flops_per_s"] / flops_per_token(gpt2, 32_000, None)
    )
    assert got["low"] < got["tokens_per_s"] < got["high"]
    assert got["low"] == pytest.approx(got["tokens_per_s"] * band["low"])
    assert speed.predict(points, gpt2, 32_000, flash, 60, "NVIDIA A100-SXM4-80GB", None) is None
    assert (
        speed.predict(points, gpt2, 32_000, {**flash, "optimizer": "sgd"}, 60, h100, band) is None
    )


def test_the_speed_interval_is_the_leave_one_out_spread():
    """Each configuration predicted from the others of its GPU, its replicas left out with it
    (h100-default's flash at 1,024 tokens and the map's gpt2_110m_1024 flash are one
    configuration): the interval's factors are the 10th and 90th percentiles of one ratio per
    configuration; none for the H200, whose cells are all one shape; none beyond the farthest
    distance a check leaned over; `auto` leans on the kernel it resolves to."""
    from memopt.plan import speed

    points = speed.load_points()
    where = {p["where"]: p for p in points}
    assert (
        where["h100-default/flash@117"]["config"] == where["map/gpt2_110m_1024/flash@121"]["config"]
    )
    h100 = "NVIDIA H100 80GB HBM3"
    pairs = speed.leave_one_out([p for p in points if p["gpu"] == h100])
    assert {q["where"] for p, q in pairs if p["where"] == "h100-default/flash@117"} == {
        "map/gpt2_110m_4096/flash@30"}  # fmt: skip
    interval = speed.band(points, h100)
    configs = {p["config"] for p, _ in pairs}
    assert interval["n"] == len(configs) >= 20 and interval["low"] < 1 < interval["high"]
    assert speed.band(points, "NVIDIA H200") is None
    gpt2 = {"n_layers": 12, "d_model": 768, "n_heads": 12, "d_ff": 3072, "seq_len": 1024,
            "dropout": 0.0}  # fmt: skip
    near = speed.predict(
        points, gpt2, 32_000, {"precision": "bf16", "attention": "auto"}, 100, h100, interval
    )
    assert near["leans_on"].split("/")[-1].startswith("flash@") and near["low"] is not None
    far = dict(gpt2, n_layers=96, d_model=4096, n_heads=32, d_ff=16384, seq_len=65536)
    got = speed.predict(
        points, far, 32_000, {"precision": "bf16", "attention": "flash"}, 1, h100, interval
    )
    assert got["tokens_per_s"] > 0 and got["low"] is None  # farther than any check: no interval


def test_the_shipped_speed_points_are_the_studies_cells(tmp_path):
    """src/memopt/plan/speed_points.json is what tools/plan_check.py --write-points derives from
    the published studies and the map's saved state, not numbers typed in."""
    import subprocess
    import sys

    out, summary = tmp_path / "points.json", tmp_path / "summary.md"
    proc = subprocess.run([sys.executable, "tools/plan_check.py", "--write-points", str(out),
                           "--summary", str(summary)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    shipped = ROOT / "src" / "memopt" / "plan" / "speed_points.json"
    assert json.loads(out.read_text()) == json.loads(shipped.read_text())
    assert "| tokens/s, one per configuration |" in summary.read_text()  # the same call's too


def test_the_readmes_prediction_table_is_the_tools(tmp_path):
    """The README's leave-one-out table is what tools/plan_check.py --summary prints for the
    published studies and the map's saved state, and its figure is drawn."""
    import subprocess
    import sys

    summary, png = tmp_path / "summary.md", tmp_path / "residuals.png"
    proc = subprocess.run([sys.executable, "tools/plan_check.py", "--summary", str(summary),
                           "--figure", str(png)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    readme = (ROOT / "README.md").read_text()
    block = readme.split("<!-- plan_check summary -->")[1].split("<!-- /plan_check summary -->")[0]
    assert block.strip() == summary.read_text().strip()
    rows = [r for r in block.strip().splitlines()[2:]]
    assert [r.split(" | ")[0] for r in rows] == ["| maximum batch", "| peak at half the maximum "
                                                 "or more"] * 2 + ["| tokens/s, one per configuration"]  # fmt: skip
    assert png.stat().st_size > 10_000 and (ROOT / "docs/figures/plan_check.png").exists()
    # the map read from a published folder (its results/ as the state holds them) gives the same
    import tarfile

    folder = tmp_path / "map"
    with tarfile.open(ROOT / "studies/h100-map-pieces/state.tar.gz") as tar:
        tar.extractall(folder, filter="data")
    again = tmp_path / "again.md"
    proc = subprocess.run([sys.executable, "tools/plan_check.py", "--summary", str(again),
                           "--map-state", str(folder)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert again.read_text() == summary.read_text()


def test_plan_refuses_what_it_cannot_answer(tmp_path, capsys):
    """Neither or both of --gpu-memory and --cpu; --cpu without a CPU budget in the config;
    a GPU too small for one sequence says so rather than blaming the measured cells."""
    for args in ([], ["--gpu-memory", "40GiB", "--cpu"]):
        with pytest.raises(SystemExit):
            main(["plan", "--config", "config/map.yaml", *args])
        assert "give --gpu-memory SIZE (a GPU) or --cpu" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["plan", "--config", "config/map.yaml", "--cpu"])
    assert "search.cpu_memory_budget_gib is null" in capsys.readouterr().err
    main(["plan", "--config", "config/map.yaml", "--gpu-memory", "2.5GiB", "--speed-gpu", "H200"])
    out = capsys.readouterr().out
    assert (
        "| flash | 1,538.5 | 641.56 | 6,671 | 0 | 0 | gpu | counted | not one sequence fits" in out
    )
    assert "tokens/s at the max (H200)" in out
