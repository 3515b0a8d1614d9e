"""The `parallel`, `shard` and `gpus` knobs: data parallelism over several GPUs, with or without
ZeRO-style sharding of the model state.

A parallel technique's training job runs as `gpus` processes (ranks), started by torchrun
(memopt.run.distributed) on the GPUs the job leased (memopt.runtime.lease), one GPU each; on a CPU (the
tests) over the gloo backend. Every rank draws the same global batch (`gpus` x the batch entry
sequences, from the same seed) and trains its own contiguous slice of it; gradients are averaged
across the ranks, so a step computes what one process computes on the global batch (the tests
check it parameter for parameter). The batch entry, the search's maximum and the memory figures
are per GPU; throughput counts every rank's tokens.

- ddp, shard none: DistributedDataParallel. Every rank holds the weights (W), gradients (G) and
  optimizer state (O).
- ddp, shard optimizer (ZeRO-1): torch's ZeroRedundancyOptimizer. Each rank keeps the AdamW state
  of 1/N of the parameters, updates them and broadcasts them: W + G + O/N.
- fsdp2, shard grads (ZeRO-2): fully_shard on every block and the root, reshard_after_forward
  false: weights, gradients and state are stored sharded (W/N + G/N + O/N), the weights are
  gathered once per step and stay whole through the backward pass (+W while a step runs).
- fsdp2, shard full (ZeRO-3): reshard_after_forward true: a block's weights are gathered for its
  forward pass and again for its backward pass, so only about one block's are whole at a time.

The ranks must take every decision alike, or they wait forever on each other's collectives: the
timing cells stop when rank 0 says so, and a search trial's peak is the largest rank's. A rank
that runs out of memory may leave the others waiting in a collective it will never join, so it
records what it was doing in the launch's state folder and ends the launch at once; memopt.run.distributed
then starts the ranks again: a search goes on from the trials recorded so far (the failed one
among them, as not fitting), a cell records `oom`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import torch.distributed as dist

from memopt.errors import MemoptError

STATE_ENV = "MEMOPT_PARALLEL_STATE"  # the launch's state folder (memopt.run.distributed)
OOM_EXIT = 75


def active() -> bool:
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    return dist.get_rank() if active() else 0


def world() -> int:
    return dist.get_world_size() if active() else 1


def is_main() -> bool:
    """The rank that prints progress and writes the job's result."""
    return rank() == 0


def check_launched(spec: dict) -> None:
    """A parallel technique runs under torchrun with one process per GPU, and only so."""
    want = spec["gpus"] if spec["parallel"] != "none" else 1
    if world() != want:
        raise MemoptError(
            f"parallel {spec['parallel']!r} with gpus {spec['gpus']} needs {want} processes "
            f"(torchrun, which the workflow's jobs start themselves); this one is one of "
            f"{world()}"
        )


def wrap(model: torch.nn.Module, spec: dict, device: str) -> torch.nn.Module:
    """The model as the technique's parallel mode trains it (after precision and checkpointing,
    before compile: torchtitan's order)."""
    mode = spec["parallel"]
    if mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        ids = [torch.cuda.current_device()] if device == "cuda" else None
        # Gradients are views into DDP's reduction buckets: no second copy of them.
        return DistributedDataParallel(model, device_ids=ids, gradient_as_bucket_view=True)
    if mode == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(device, (world(),))
        reshard = spec["shard"] == "full"
        for block in model.blocks:
            fully_shard(block, mesh=mesh, reshard_after_forward=reshard)
        fully_shard(model, mesh=mesh, reshard_after_forward=reshard)  # embeddings, final norm
    return model


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The decoder inside DDP (FSDP2 keeps the decoder's class)."""
    return getattr(model, "module", model)


def zero_optimizer(groups: list[dict], optimizer_class, **defaults):
    """ZeRO-1: each rank holds the optimizer state of its share of the parameters."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    return ZeroRedundancyOptimizer(groups, optimizer_class=optimizer_class, **defaults)


def _device() -> torch.device:
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def agree(flag: bool) -> bool:
    """Rank 0's decision, on every rank."""
    if not active():
        return flag
    t = torch.tensor([int(flag)], device=_device())
    dist.broadcast(t, 0)
    return bool(t.item())


def barrier() -> None:
    if active():
        dist.barrier()


def _reduce(value: float, op) -> float:
    t = torch.tensor([value], dtype=torch.float64, device=_device())
    dist.all_reduce(t, op=op)
    return float(t.item())


def max_over_ranks(value: float | None) -> float | None:
    """The largest rank's value (None stays None: every rank has it or none does)."""
    if not active() or value is None:
        return value
    return _reduce(value, dist.ReduceOp.MAX)


def min_over_ranks(value: float) -> float:
    return value if not active() else _reduce(value, dist.ReduceOp.MIN)


def mean_over_ranks(t: torch.Tensor) -> torch.Tensor:
    """The mean over the ranks of a tensor (each rank's loss of its slice: the global batch's
    loss, the slices being equal)."""
    if not active():
        return t
    t = t.detach().to(_device(), torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)  # gloo has no AVG
    return (t / world()).float()


def gather(obj) -> list:
    """Every rank's object, in rank order (on every rank)."""
    if not active():
        return [obj]
    out = [None] * world()
    dist.all_gather_object(out, obj)
    return out


def per_rank(result: dict, device: str) -> dict:
    """A cell's result with every rank's memory and GPU (`ranks`); its peaks become the largest
    rank's. Unchanged outside torchrun."""
    if not active():
        return result
    cuda = device == "cuda"
    mine = {
        "rank": rank(),
        "gpu_uuid": str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)
        if cuda
        else None,
        "peak_allocated_mib": result["peak_allocated_mib"],
        "peak_reserved_mib": result["peak_reserved_mib"],
        "memory_breakdown": result["memory_breakdown"],
        "median_step_ms": result["step_time_ms"]["median"],
    }
    ranks = gather(mine)
    result["ranks"] = ranks
    for key in ("peak_allocated_mib", "peak_reserved_mib"):
        values = [r[key] for r in ranks if r[key] is not None]
        result[key] = max(values) if values else None
    return result


def _state() -> Path | None:
    folder = os.environ.get(STATE_ENV)
    return Path(folder) if active() and folder else None


def out_of_memory(err: BaseException, batch: int, seconds: float) -> None:
    """Under torchrun: record this rank's out-of-memory error and end the launch (see above).
    Does nothing in a single process, where out of memory is handled as a result."""
    state = _state()
    if state is None:
        return
    record = {"rank": rank(), "batch": batch, "seconds": seconds, "error": str(err)[:500]}
    tmp = state / f"oom.{rank()}.tmp"
    tmp.write_text(json.dumps(record))
    tmp.replace(state / "oom.json")  # one rank's record, whole
    print(f"[rank {rank()}] out of memory at batch {batch}: ending this launch", flush=True)
    os._exit(OOM_EXIT)


def previous_oom() -> dict | None:
    """The out-of-memory record of the launch before this one, if any."""
    state = _state()
    path = state / "oom.json" if state else None
    return json.loads(path.read_text()) if path and path.exists() else None


def saved(name: str):
    """What an earlier launch of this job saved under `name` (None if nothing)."""
    state = _state()
    path = state / f"{name}.json" if state else None
    return json.loads(path.read_text()) if path and path.exists() else None


def save(name: str, value) -> None:
    """Keep `value` for a later launch of this job (rank 0 writes)."""
    state = _state()
    if state is not None and is_main():
        tmp = state / f"{name}.tmp"
        tmp.write_text(json.dumps(value))
        tmp.replace(state / f"{name}.json")


def oom_trial(record: dict) -> dict:
    """A search trial that ran out of memory in an earlier launch, as a trial record."""
    return {
        "batch": record["batch"],
        "fits": False,
        "out_of_memory": True,
        "peak_mib": None,
        "peak_reserved_mib": None,
        "last_step_ms": None,
        "seconds": record["seconds"],
        "compile_cache": None,
        "out_of_memory_on_rank": record["rank"],
    }
