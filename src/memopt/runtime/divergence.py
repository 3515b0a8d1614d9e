"""Divergence: a training loss that becomes inf or NaN.

FP16, FP8, low-bit optimizers and large learning rates can make a run diverge. A timing cell or a
quality run whose loss becomes non-finite stops at once and is recorded as `status: diverged`
with the step (counted from 1: the number of optimizer steps taken, the last of which gave the
non-finite loss); its loss curve keeps the finite steps before it. The losses are checked where
the loops read the device anyway (memopt.runtime.step) or every few steps (memopt.jobs.quality), never per
step in a timed region. Under several GPUs every rank checks its slice's losses and the ranks
take the earliest non-finite step of any of them, so all stop alike.
"""

from __future__ import annotations

import torch

from memopt.runtime import parallel


class Diverged(Exception):
    """The training loss became non-finite at `step` (counted from 1); `curve` holds the losses
    of the steps before it."""

    def __init__(self, step: int, loss: float, curve: list[float], what: str = "training loss"):
        self.step, self.loss, self.curve = step, loss, curve
        super().__init__(f"{what} became {loss} at step {step}")


class LossWatch:
    """Checks the losses (0-dim tensors, one per step, in step order) recorded since its last
    check; `check` raises Diverged at the first non-finite one."""

    def __init__(self) -> None:
        self.checked = 0

    def check(self, losses: list[torch.Tensor]) -> None:
        new = losses[self.checked :]
        if not new:
            return
        bad = ~torch.isfinite(torch.stack(new).float())
        index = torch.arange(len(new), device=bad.device)
        first = int(torch.where(bad, index, len(new)).min())  # synchronizes
        first = int(parallel.min_over_ranks(float(first)))
        if first == len(new):
            self.checked = len(losses)
            return
        # The global batch's losses (memopt.runtime.parallel): non-finite at `step` when any rank's is.
        step = self.checked + first + 1
        curve = parallel.mean_over_ranks(torch.stack(losses[:step]).float()).tolist()
        raise Diverged(step, curve[-1], curve[:-1])
