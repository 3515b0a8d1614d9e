"""What every training job does around its work: out of memory and divergence become a status,
memory is freed, and the result is stamped with its provenance.

`guarded(work, ...)` runs `work()` (a dict of measurements, status `ok`) and returns it, or, when
the work ran out of memory or its loss became non-finite, a result with status `oom` or `diverged`
and every measurement in `measured` set to null. Any other error is raised. Under torchrun, a rank
out of memory records it and ends the launch (memopt.runtime.parallel). Searches, cells and quality
runs use it, so the three agree on what a failed run records.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from memopt.config import config_hash
from memopt.runtime import parallel
from memopt.runtime.divergence import Diverged
from memopt.runtime.measure import is_oom, provenance
from memopt.runtime.step import free_memory


def guarded(
    work: Callable[[], dict],
    device: str,
    batch: int,
    measured: Iterable[str] = (),
    oom_prefix: str = "",
    keep_host_cache: bool = False,
) -> dict:
    """work()'s result, or its failure as a result (status oom or diverged, `measured` null). The
    exception is not kept (its traceback would keep the model and optimizer alive past
    free_memory); memory is freed either way."""
    t0 = time.perf_counter()
    try:
        out = work()
    except Diverged as err:
        out = {"status": "diverged", "diverged_step": err.step, "error": str(err),
               "loss_curve": err.curve}  # fmt: skip
    except Exception as err:
        if not is_oom(err):
            raise
        parallel.out_of_memory(err, batch, time.perf_counter() - t0)  # ends a parallel launch
        out = {"status": "oom", "error": oom_prefix + str(err).splitlines()[0][:500]}
    if out.get("status") != "ok":
        out = failure(out, measured)
    # A search keeps the pinned buffers of a trial that fitted for the next one; a failed one's
    # (up to the host budget, in sizes the next trials need not reuse) are given back.
    free_memory(device, host_cache=not (keep_host_cache and out.get("status") == "ok"))
    return out


def failure(fields: dict, measured: Iterable[str] = ()) -> dict:
    """A result without measurements: each of `measured` null, no loss curve, then `fields`
    (status, error, and what the failure knows)."""
    return dict.fromkeys(measured) | {"loss_curve": []} | fields


def stamp(result: dict, cfg: dict, spec: dict, device: str, keys: Iterable[str]) -> dict:
    """The result with its provenance: versions, GPU, commit, and the hash of the config sections
    `keys` it depends on with the technique's knobs."""
    result["provenance"] = provenance(device) | {
        "config_hash": config_hash({k: cfg[k] for k in keys} | {"technique": spec})
    }
    return result
