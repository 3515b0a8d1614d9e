"""Parallel techniques on the CPU (memopt.runtime.parallel, memopt.run.distributed): two gloo ranks under
torchrun train what one process trains on the whole batch, for DDP, ZeRO-1 and FSDP2's two
sharding levels; a cell and a search of a parallel technique run as one job on two ranks."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import write_random_tokens

from memopt.config import validate_config
from memopt.data.tokens import TokenData
from memopt.errors import ConfigError, MemoptError
from memopt.runtime import lease
from memopt.runtime.step import prepare, train_step

MODES = {
    "ddp": {"parallel": "ddp"},
    "zero1": {"parallel": "ddp", "shard": "optimizer"},
    "zero2": {"parallel": "fsdp2", "shard": "grads"},
    "zero3": {"parallel": "fsdp2", "shard": "full"},
    # FSDP2 re-gathers a checkpointed block's weights for its recomputation.
    "zero3_ckpt": {"parallel": "fsdp2", "shard": "full", "checkpointing": "full"},
    "ddp_accum": {"parallel": "ddp", "grad_accum": 2},
}
STEPS, BATCH = 3, 8  # BATCH: the global batch, 4 sequences per rank

# Run by torchrun on each rank: train every mode STEPS steps, rank 0 saves the full weights.
RANK_SCRIPT = """
import json, sys, torch, torch.distributed as dist
sys.path.insert(0, sys.argv[3])
from test_parallel import trained
dist.init_process_group("gloo")
cfg = json.loads(open(sys.argv[1]).read())
out = {name: trained(cfg, name) for name in cfg["techniques"]}
if dist.get_rank() == 0:
    torch.save(out, sys.argv[2])
dist.destroy_process_group()
"""


def study(tokens_dir: Path, arch: str = "gpt2", **techniques) -> dict:
    # llama: two query heads sharing one key/value head (grouped-query attention)
    block = {"arch": "llama", "n_kv_heads": 1} if arch == "llama" else {}
    cfg = validate_config(
        {
            "device": "cpu",
            # No dropout: each rank draws its own masks, one process draws others.
            "model": {
                "n_layers": 2,
                "d_model": 32,
                "n_heads": 2,
                "d_ff": 64,
                "seq_len": 32,
                "dropout": 0.0,
                **block,
            },  # fmt: skip
            "train": {"warmup_steps": 1, "grad_clip": 0.5},
            "measure": {"warmup_steps": 2, "min_timed_steps": 3, "max_timed_steps": 3},
            "search": {"cpu_memory_budget_gib": 8 / 1024, "max_batch": 64},
            "exactness": {"batch": 4, "steps": 2},
            "techniques": techniques,
            "baseline": next(iter(techniques)),
        }
    )
    return cfg | {"tokens_dir": str(tokens_dir)}


@pytest.fixture(scope="module")
def tokens_dir(tmp_path_factory) -> Path:
    d = write_random_tokens(tmp_path_factory.mktemp("tokens"))
    return d


def trained(cfg: dict, name: str) -> dict[str, torch.Tensor]:
    """Train technique `name` STEPS steps at the global BATCH; its full weights."""
    spec = cfg["techniques"][name]
    applied, opt, batches = prepare(
        cfg, spec, TokenData(Path(cfg["tokens_dir"])), BATCH, "cpu", cfg["train"]["seed"]
    )
    for step in range(STEPS):
        x, y = batches.next()
        train_step(applied, opt, x, y, step, cfg["train"])
    state = applied.model.state_dict()
    return {  # a sharded weight gathered whole; DDP's names without its "module." prefix
        k.removeprefix("module."): (v.full_tensor() if hasattr(v, "full_tensor") else v).clone()
        for k, v in state.items()
    }


@pytest.mark.slow  # torchrun-style ranks in processes of their own (pytest -m slow)
@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_sharded_steps_train_the_same_weights_as_one_process(tokens_dir, tmp_path, arch):
    cfg = study(tokens_dir, arch, **{n: {**m, "gpus": 2} for n, m in MODES.items()})
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
         str(script), str(tmp_path / "cfg.json"), str(tmp_path / "out.pt"), str(Path(__file__).parent)],
        check=True, env={**__import__("os").environ, "OMP_NUM_THREADS": "1"}, timeout=300,
    )  # fmt: skip
    sharded = torch.load(tmp_path / "out.pt")
    for name, knobs in MODES.items():
        one = {k: v for k, v in knobs.items() if k not in ("parallel", "shard")}
        ref = trained(study(tokens_dir, arch, ref=one), "ref")
        initial = trained(
            study(tokens_dir, arch, ref=one) | {"train": {**cfg["train"], "lr": 0.0}}, "ref"
        )
        assert sharded[name].keys() == ref.keys(), name
        for k, v in ref.items():
            assert not torch.equal(v, initial[k]), (name, k)  # the weights did move
            torch.testing.assert_close(sharded[name][k], v, rtol=1e-5, atol=1e-6, msg=f"{name} {k}")


def test_each_rank_trains_its_contiguous_slice_of_the_same_batch(tokens_dir):
    from memopt.data.tokens import Batches

    train = TokenData(tokens_dir).train
    whole = Batches(train, 32, 6, 7, "cpu").next()[0]
    parts = [Batches(train, 32, 6, 7, "cpu", part=(r, 2)).next()[0] for r in range(2)]
    assert torch.equal(torch.cat(parts), whole) and not torch.equal(parts[0], parts[1])


@pytest.mark.slow  # torchrun-style ranks in processes of their own (pytest -m slow)
def test_a_parallel_search_and_cell_run_as_one_job_on_two_ranks(tokens_dir, tmp_path, capsys):
    from memopt.run.worker import run_job

    cfg = study(tokens_dir, zero3={"parallel": "fsdp2", "shard": "full", "gpus": 2})
    cfg.pop("tokens_dir")
    worker = {"enabled": True, "idle_s": 5}  # a parallel job never uses the warm worker
    common = {"cfg": cfg, "technique": "zero3", "tokens_dir": str(tokens_dir), "threads": 2}
    search, exact, cell = tmp_path / "s/zero3.json", tmp_path / "e.json", tmp_path / "c.json"
    run_job(worker, "search_file", common | {"out": str(search), "exactness_out": str(exact)},
            tmp_path / "search.log")  # fmt: skip
    found = json.loads(search.read_text())
    assert found["status"] in ("ok", "capped") and found["max_batch"] >= 1
    assert found["spec"]["gpus"] == 2 and len(json.loads(exact.read_text())["losses"]) == 2
    log = (tmp_path / "search.log").read_text()
    assert "on 2 ranks (torchrun" in log and "[search zero3] trial" in log
    run_job(worker, "cell_file", common | {"entry": "2", "search_dir": str(search.parent),
            "out": str(cell)}, tmp_path / "cell.log")  # fmt: skip
    res = json.loads(cell.read_text())
    b = 2  # per GPU (on a CPU the cell's tracked memory at the search's maximum may not fit)
    assert res["status"] == "ok" and res["batch_size"] == b and res["gpus"] == 2
    assert res["effective_batch"] == 2 * b and res["tokens_per_step"] == 2 * b * 32
    assert [r["rank"] for r in res["ranks"]] == [0, 1]
    assert res["peak_allocated_mib"] == max(r["peak_allocated_mib"] for r in res["ranks"])
    assert res["precision_flags"]["parallel"] == "fsdp2"


@pytest.mark.slow  # torchrun-style ranks in processes of their own (pytest -m slow)
def test_a_failing_rank_fails_the_job_and_writes_nothing(tokens_dir, tmp_path):
    from memopt.run.worker import run_job

    cfg = study(tokens_dir, ddp={"parallel": "ddp", "gpus": 2})
    cfg.pop("tokens_dir")
    out = tmp_path / "c.json"
    args = {"cfg": cfg, "technique": "ddp", "tokens_dir": str(tokens_dir), "threads": 2,
            "entry": "max", "search_dir": str(tmp_path / "nowhere"), "out": str(out)}  # fmt: skip
    with pytest.raises(SystemExit):  # the ranks' error was printed; the job exits 1
        run_job({"enabled": False, "idle_s": 1}, "cell_file", args, tmp_path / "cell.log")
    assert "needs the search result" in (tmp_path / "cell.log").read_text()
    assert not out.exists()


def test_a_parallel_technique_outside_torchrun_is_refused(tokens_dir):
    cfg = study(tokens_dir, ddp={"parallel": "ddp", "gpus": 2})
    with pytest.raises(MemoptError, match="needs 2 processes"):
        trained(cfg, "ddp")


@pytest.mark.parametrize(
    "knobs, message",
    [
        ({"gpus": 2}, "gpus: 2 is not allowed with techniques.t.parallel 'none'; allowed: 1"),
        ({"parallel": "ddp"}, "gpus: 1 is not allowed with techniques.t.parallel 'ddp'"),
        ({"parallel": "ddp", "shard": "full", "gpus": 2}, "shard: 'full' is not allowed with"),
        ({"parallel": "fsdp2", "gpus": 2}, "shard: 'none' is not allowed with"),
        ({"parallel": "fsdp2", "shard": "full", "gpus": 2, "compile": True}, "compile: true"),
        ({"parallel": "ddp", "gpus": 2, "optimizer": "sgd"}, "optimizer: 'sgd' is not allowed"),
        ({"parallel": "ddp", "gpus": 2, "precision": "fp16"}, "precision: 'fp16' is not allowed"),
        ({"parallel": "ddp", "gpus": 3}, "gpus: 3 does not divide exactness.batch (8)"),
    ],
)
def test_impossible_parallel_knobs_are_refused_when_the_config_is_read(knobs, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        validate_config({"device": "cpu", "techniques": {"t": knobs}, "baseline": "t"})


def test_a_job_leases_all_its_gpus_or_none(monkeypatch, tmp_path):
    monkeypatch.setenv(lease.LOCK_DIR_ENV, str(tmp_path))
    monkeypatch.setenv(lease.FAKE_ENV, "a,b,c")
    with lease.gpu_lease(count=2) as pair:
        assert [g.key for g in pair] == ["a", "b"]
        assert (lease.os.environ["CUDA_VISIBLE_DEVICES"], lease.os.environ[lease.LEASE_ENV]) == (
            "a,b",
            "a,b",
        )
        # Two of three are taken: a job that needs two gets none, and holds none meanwhile.
        assert lease._try_lease(tmp_path, lease.candidates(), 2) is None
        with lease.gpu_lease() as third:
            assert third.key == "c"
    with pytest.raises(MemoptError, match="needs 4 GPUs .* may use 3"), lease.gpu_lease(count=4):
        pass


@pytest.mark.slow  # torchrun-style ranks in processes of their own (pytest -m slow)
def test_a_parallel_cell_out_of_memory_is_recorded_after_a_relaunch(tokens_dir, tmp_path):
    from memopt.run.worker import run_job

    cfg = study(tokens_dir, ddp={"parallel": "ddp", "gpus": 2})
    cfg.pop("tokens_dir")
    out = tmp_path / "c.json"
    args = {"cfg": cfg, "technique": "ddp", "tokens_dir": str(tokens_dir), "threads": 2,
            "entry": "600", "search_dir": str(tmp_path), "out": str(out)}  # fmt: skip
    run_job({"enabled": False, "idle_s": 1}, "cell_file", args, tmp_path / "cell.log")
    res = json.loads(out.read_text())
    assert res["status"] == "oom" and res["error"].startswith("rank ") and "budget" in res["error"]
    log = (tmp_path / "cell.log").read_text()
    assert "out of memory at batch 600" in log and "launch 2" in log
