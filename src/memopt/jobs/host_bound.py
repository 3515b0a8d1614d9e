"""The host's limit on a batch of offloaded activations, predicted exactly from the tensors the
search's fitting trials offloaded (memopt.jobs.search passes it to memopt.jobs.bracket as the
`bound` of a search): pinned host memory comes in pieces that no line follows."""

from __future__ import annotations

import math

from memopt.runtime.offload import charged_bytes


def host_bound(trials: list, g: int, budget: int, cap: int, fits: dict, chunk=None) -> int | None:
    """The largest k (batches of k * g) whose offloaded tensors stay within the host's pinned
    budget (pinned_charge's bytes); None before a fit."""
    charged = pinned_charge(trials, g, chunk)
    if charged is None:
        return None
    lo, hi = 0, cap // g + 1  # charged(lo) fits, charged(hi) does not (or past the cap)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if charged(mid) <= budget else (lo, mid)
    return lo


def pinned_charge(trials: list, g: int, chunk=None):
    """charged(k): the pinned host bytes a batch of k * g sequences would take, its offloaded
    tensors each charged as memopt.runtime.offload pins it (pieces, the last rounded up to a
    power of two: a staircase no line follows). From the largest fitting trial's tensors,
    compared with a smaller fit's (at most half as large where there is one): a size both hold
    as often is fixed; a size both hold, more often in the larger, comes more often with the
    batch; a size only the larger holds grows with the batch (the checkpoints). With a chunked
    loss (`chunk`: the sequence length and the loss's chunk, in tokens) a size whose count is a
    multiple of the larger fit's whole chunks is a chunk's: it comes floor(k L / C) times, and
    a part chunk as one tensor of the rest (where the larger fit holds one, of the size its
    rest gives): charged as a whole chunk, a part chunk put the H200 map's llama_1b_1024 bound
    at 433 where 437 fits, and the search walked up to it. None before a fit."""
    done = sorted((t for t in trials if t["fits"] and t["host_tensors"]), key=lambda t: t["batch"])
    if not done:
        return None
    last = done[-1]
    # against a fit at most half as large where there is one: two batches close together hold
    # the same number of loss chunks, and the chunks would look fixed
    half = [t for t in done[:-1] if 2 * t["batch"] <= last["batch"]]
    pair = half[-1] if half else (done[-2] if len(done) > 1 else None)
    before = dict(pair["host_tensors"]) if pair else {}
    scale = g / last["batch"]
    held = dict(last["host_tensors"])
    streams = chunk_streams(held, before, last["batch"], chunk)
    parts = {tail for _, tail in streams.values()}

    def charged(k: int) -> int:
        total = 0
        whole, rest = divmod(k * g * chunk[0], chunk[1]) if streams else (0, 0)
        for size, n in held.items():
            if size in streams:
                part = charged_bytes(-(-size * rest // chunk[1])) if rest else 0  # (up)
                total += streams[size][0] * (whole * charged_bytes(size) + part)
            elif size in parts:
                continue  # a part chunk: with its stream
            elif size not in before:
                total += n * charged_bytes(-(-size * k * g // last["batch"]))  # (up)
            else:
                total += (n if before[size] == n else math.ceil(n * k * scale)) * charged_bytes(
                    size
                )
        return total

    return charged


def chunk_streams(held: dict, before: dict, batch: int, chunk) -> dict:
    """The sizes of a chunked loss's tensors in a fit of `batch` sequences (`held`: size ->
    count, `before`: a smaller fit's): size -> (tensors per chunk, the size of its part chunk
    in that fit, or None)."""
    if chunk is None:
        return {}
    whole, rest = divmod(batch * chunk[0], chunk[1])
    streams = {}
    for size, n in held.items():
        if whole and before.get(size, n) < n and n % whole == 0:
            part = size * rest // chunk[1] if rest else None
            if part is None or (part != size and held.get(part) == n // whole):
                streams[size] = (n // whole, part)
    return streams
