"""The papers' one noise rule, for every speed comparison of two timed cells (the default study's
same-batch pairs and goals, the map's pairs at a point):

A cell's noise is the relative 95% interval of its mean step time, plus RETRY_NOISE where
cudaMalloc retried in its timed steps: such a cell's interval covers only its own run's mix of
slow (retrying) and fast steps, and another run on the same card draws another mix. Two cells are
within noise of each other when their tokens/s differ by no more than their noises added, as a
share of the faster one's; otherwise the faster is faster.

RETRY_NOISE is the largest change measured between runs of one such cell on one card
(`window512` at llama_128m_4096 on one H100, 221,163 to 251,625 tokens/s: 13.8% of the slower
run, 12.1% of the faster, which is how this rule counts a difference, so 14% covers it;
studies/h100-map-pieces/README.md; on an H200 three cells moved by at most 3.4% of the slower
run: studies/h200-map/README.md). Every compared pair ran on one
card; across cards such cells moved by up to 19% (SPEED_BASIS)."""

from __future__ import annotations

# the changes those H100 runs saw, as studies/h100-map-pieces/README.md gives them (a test reads
# them there): the papers state them beside the rule
SPEED_BASIS = {"across_cards": 0.19, "one_card": 0.14}
RETRY_NOISE = SPEED_BASIS["one_card"]


def _known(value) -> bool:
    return value is not None and value == value  # NaN: not known


def retries(cell: dict) -> float:
    """cudaMalloc retries in a cell's timed steps, from a results row (alloc_retries), a summary
    row (allocator_alloc_retries) or a cell's JSON (allocator_events); 0 where none is known."""
    events = cell.get("allocator_events")
    events = events if isinstance(events, dict) else {}
    for n in (
        cell.get("alloc_retries"),
        cell.get("allocator_alloc_retries"),
        events.get("alloc_retries"),
    ):
        if _known(n):
            return n
    return 0


def rel_interval(cell: dict) -> float:
    """A cell's relative 95% interval of its mean step time: a summary row's
    step_time_ms_rel_ci95, a results row's rel_ci95 or a cell JSON's step_time_ms.rel_ci95; 0
    where none is known."""
    stats = cell.get("step_time_ms")
    stats = stats if isinstance(stats, dict) else {}
    for ci in (cell.get("step_time_ms_rel_ci95"), cell.get("rel_ci95"), stats.get("rel_ci95")):
        if _known(ci):
            return ci
    return 0.0


def cell_noise(cell: dict, retry: float = RETRY_NOISE) -> float:
    """A cell's noise: its relative 95% interval, plus `retry` (RETRY_NOISE; another allowance
    for a sensitivity check) where it retried cudaMalloc in its timed steps."""
    return rel_interval(cell) + (retry if retries(cell) > 0 else 0.0)


def pair_noise(a: dict, b: dict, retry: float = RETRY_NOISE) -> float:
    """Two cells' noises added: the share of the faster one's tokens/s within which they tie."""
    return cell_noise(a, retry) + cell_noise(b, retry)


def speed_verdict(ratio: float, noise: float) -> str | None:
    """ "faster" or "slower" for a tokens/s ratio (one cell's over another's) whose difference is
    more than `noise` (pair_noise) of the faster one's tokens/s, else None (within noise, or no
    ratio: NaN, zero or negative)."""
    if not ratio > 0 or 1 - min(ratio, 1 / ratio) <= noise:
        return None
    return "faster" if ratio > 1 else "slower"


def within_noise(a: dict, b: dict) -> bool:
    """Two timed cells' throughputs are within their noises added of each other (the rule above);
    a cell with no throughput (0) is within noise of none but another such cell."""
    x, y = a["tokens_per_s"], b["tokens_per_s"]
    return abs(x - y) <= pair_noise(a, b) * max(x, y)


def noise_rule(gpu: bool = True) -> dict:
    """The rule as a paper's Method states it: {"md": ..., "tex": ...}. On a CPU (no caching
    allocator, so no retries) the intervals alone."""
    one, across = (f"{100 * SPEED_BASIS[k]:.0f}" for k in ("one_card", "across_cards"))
    text = "Two cells are {within} of each other, everywhere in this paper, when their throughputs "
    if not gpu:
        text += (
            "differ by no more than the relative 95{pc} intervals of their mean step times added."
        )
    else:
        text += (
            "differ by no more than their noises added, as a share of the faster one's; a cell's "
            "noise is the relative 95{pc} interval of its mean step time, plus {one}{pc} where "
            "cudaMalloc retried in its timed steps: such a cell's interval covers only its own run's "
            "mix of slow and fast steps, and reruns of one such cell on one H100 moved it by up to "
            "{one}{pc} ({across}{pc} across H100s; {path})."
        )
    path = "studies/h100-map-pieces/README.md"
    return {
        "md": text.format(within="*within noise*", pc="%", one=one, across=across, path=f"`{path}`"),
        "tex": text.format(within="\\emph{within noise}", pc="\\%", one=one, across=across,
                           path=f"\\texttt{{\\seqsplit{{{path}}}}}"),
    }  # fmt: skip
