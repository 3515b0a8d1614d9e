"""Where a memory curve crosses its limit: the largest batch that fits, proven in few trials.

Torch-free: a trial is a callable, so the strategy is tested on synthetic curves (tests/
test_bracket.py) as well as run on a GPU (memopt.jobs.search).

A trial at k (batches are multiples k of the granularity) either fits, and reports what it used
of each limited resource (the GPU's memory in each phase of the step, and with offloading the
host's pinned memory), or does not fit (on a GPU also when its allocated peak comes within the
allocator's slack of the budget, so the limit is one a line predicts: memopt.jobs.search).
Each resource's use is close to linear in the batch: on
the H100 the peaks of the default study's techniques lie on one line from batch 4 up to their
maximum, to the MiB. A bend comes where the event that sets the peak changes (a fixed cost such
as the optimizer's step at small batches, the activations at large ones), which is why each
phase is its own resource. The search:

1. trains the first batch (1, or 2 where batch 1 is special), then the batch where the line
   from the state that exists before any batch (weights, optimizer state) through that trial
   meets the limit: that line overstates the slope, so the aim is safe and already large;
2. approaches the crossing of the line through the two largest fits (a parabola through the
   three largest once they are all large) from below, by a margin as wide as the last
   prediction's error relative to its length (at first REL_ERROR_START): fits measure and
   misses do not, so a bend is met by a fit;
3. once the crossing is within a step of the last fit, tries the next batch up (then 1, 2, 4
   steps: a curve that bends down keeps saying "this is the boundary");
4. inside a bracket (a fit below a miss), aims at the crossing, a little below it; walks down
   from the miss in doubling steps when the miss refuted the line (near the boundary, right
   after the line's own aim: 1, then 2 below it, the batch or two that fragmentation past the
   allocator's slack costs); bisects when two trials did not shrink the bracket four times (so
   the worst case is bisection).

On synthetic curves (linear, with a small-batch bend, mildly convex or concave, with allocator
rounding and jitter; maxima 1 to 20,000 on an 80 GB card) it proves the maximum in at most 8
trials: tests/test_bracket.py.

The upper bound is the data's (a batch cannot hold more sequences than the training tokens
fill) and an optional cap, never a round number below memory: a search that reaches it says so.
"""

from __future__ import annotations

import math
from collections.abc import Callable

Usage = dict[str, float]  # resource -> peak use (MiB) in one trial that fit

REL_ERROR_START = 0.1  # the first extrapolation's assumed error, relative to its length
MARGIN = 1.5  # the approach stays this many last errors below the crossing
WALK_FRACTION = 32  # a walk down from a miss starts at 1/32 of the bracket
SMALL_FIRST_AIM = 4  # the second trial is at least this many times the first
SHORT_FRACTION = 32  # a guess that does not fit: the search below starts 1/32 under it
SMALL_BRACKET = 16  # a refuted line inside a bracket this narrow: bisection


def _crossing(fits: dict[int, Usage], resource: str, limit: float, state: float | None):
    """(k where `resource` meets `limit`, its slope there) from the fits, or None.

    One fit: the line from `state` (use before any batch) through it. Two or more: the line
    through the two largest; a parabola through the three largest when the smallest of them is
    at least a quarter of the largest (so a small-batch bend below does not count)."""
    ks = sorted(k for k in fits if resource in fits[k])
    if not ks:
        return None
    k2 = ks[-1]
    p2 = fits[k2][resource]
    if len(ks) == 1:
        base = state if state is not None and state < p2 else 0.0
        slope = (p2 - base) / k2
        return (k2 + (limit - p2) / slope, slope) if slope > 0 else None
    k1 = ks[-2]
    slope = (p2 - fits[k1][resource]) / (k2 - k1)
    if slope <= 0:  # flat between the two (rounding): the slope from the smallest fit
        slope = (p2 - fits[ks[0]][resource]) / max(1, k2 - ks[0])
        if slope <= 0:
            return None
    crossing = k2 + (limit - p2) / slope
    if len(ks) >= 3 and 4 * ks[-3] >= k2:
        k0 = ks[-3]
        half_curvature = (slope - (fits[k1][resource] - fits[k0][resource]) / (k1 - k0)) / (k2 - k0)
        slope_at_k2 = slope + half_curvature * (k2 - k1)
        disc = slope_at_k2**2 + 4 * half_curvature * (limit - p2)
        if slope_at_k2 > 0 and disc >= 0:  # the root's stable form: exact as curvature -> 0
            return k2 + 2 * (limit - p2) / (slope_at_k2 + math.sqrt(disc)), slope_at_k2
    return crossing, slope


def predicted_boundary(fits, limits: dict[str, float], state: dict | None = None, bound=None):
    """The largest (fractional) k every resource keeps within its limit, and within what
    `bound(fits)` allows (a limit the caller predicts exactly), or None."""
    state = state or {}
    found = [_crossing(fits, r, limit, state.get(r)) for r, limit in limits.items()]
    found = [c[0] for c in found if c is not None]
    if bound is not None and (exact := bound(fits)) is not None:
        found.append(exact + 0.5)  # the largest allowed k: the boundary lies half a step on
    return min(found) if found else None


def prove_max(
    test: Callable[[int], Usage | None],
    ceiling: int,
    limits: dict[str, float],
    state: dict | None = None,
    first: int = 1,
    bound: Callable[[dict], int | None] | None = None,
    guess: int | None = None,
) -> dict:
    """The largest k <= ceiling that fits with k + 1 not fitting (_from_below says how, and
    what the arguments are), trying first `guess`, a predicted maximum (memopt.plan), then the
    batch after it: a right prediction is proven in 2 trials. A low one goes on from the batch
    after it; a high one from 1/32 below it, else from `first` below that. With a `bound`,
    the fit at half of that first fit comes next (a bound from one fit is not exact). On the
    synthetic curves of tests/test_bracket.py: at most 8 trials from a guess 90% low to 3%
    high, 10 from one higher."""
    if guess is None or not first < guess <= ceiling:  # (at `first`: the search's own start)
        return _from_below(test, ceiling, limits, state, first, bound)
    order = []

    def tried(k: int) -> Usage | None:
        usage = test(k)
        order.append((k, usage is not None))
        return usage

    def on_from(k: int, usage: Usage, top: int) -> dict:  # a fit at k: the search up to top
        known, seed = {k: usage}, {}
        if bound is not None and k // 2 >= max(1, first):
            # A bound predicted from one fit's tensors cannot tell the sizes that grow with the
            # batch from the fixed ones (memopt.jobs.host_bound), and a wrong bound
            # walks down from miss to miss: the fit at half of k (the memory line's, run at
            # the end otherwise) comes first, so the bound is exact from the start.
            if (half := tried(k // 2)) is not None:
                seed[k // 2] = half
        return _from_below(lambda j: known.pop(j) if j in known else tried(j), top, limits,
                           state, k, bound, large_first=k >= SMALL_BRACKET, seed=seed)  # fmt: skip

    if tried(guess) is None:  # high: a little below it (a prediction is rarely far
        # off), else the search from its first batch below that
        below = guess - max(1, guess // SHORT_FRACTION)
        if below > first and (near := tried(below)) is not None:
            found = on_from(below, near, guess - 1)
        else:
            top = below - 1 if below > first else guess - 1
            found = _from_below(tried, top, limits, state, first, bound) if top >= 1 else {
                "lo": 0, "hi": None, "first_guess": None}  # fmt: skip
            guess = below if below > first else guess
        hi = guess if found["hi"] is None else found["hi"]
        return {**found, "hi": hi, "order": order}
    if guess == ceiling or (after := tried(guess + 1)) is None:
        return {"lo": guess, "hi": None if guess == ceiling else guess + 1,
                "first_guess": None, "order": order}  # fmt: skip
    found = on_from(guess + 1, after, ceiling)  # low: on from the batch after it
    return {**found, "order": order}


def _from_below(test, ceiling, limits, state, first, bound, large_first=False, seed=None) -> dict:
    """The largest k <= ceiling with test(k) fitting and test(k + 1) not (or k = ceiling).

    `test(k)` -> use per resource, or None when k does not fit; `limits`: what each resource may
    use; `state`: each resource's use before any batch, where known; `first`: the first trial;
    `bound(fits)`: the largest k a limit that the caller predicts exactly allows (the host's
    pinned memory: memopt.jobs.search), or None; `large_first`: the first trial is a guess's,
    already large (the next aims at the line from the state, not at 4 times it); `seed`: fits
    made before, below `first`.
    Returns lo (the largest fit, 0: none), hi (the smallest miss, None: none up to the ceiling),
    the first prediction from two fits, and the trials in order as (k, fitted).
    """
    fits: dict[int, Usage] = dict(seed or {})
    order: list[tuple[int, bool]] = []
    lo, hi = max(fits, default=0), None

    def run(k: int) -> bool:
        nonlocal lo, hi
        usage = test(k)
        order.append((k, usage is not None))
        if usage is None:
            hi = k if hi is None else min(hi, k)
        else:
            fits[k] = usage
            lo = max(lo, k)
        return usage is not None

    k = min(first, ceiling)
    if k >= 1 and not run(k) and k > 1:
        run(1)
    rel_error, walk, walks, widths, first_guess = REL_ERROR_START, 0, 0, [], None
    down = None  # batches walked down since the line's own aim missed (None: it did not)
    while lo > 0 and lo < ceiling and (hi is None or hi - lo > 1):
        exact = None if bound is None else bound(fits)  # once per trial: it may search
        crossing = predicted_boundary(fits, limits, state, lambda _, e=exact: e)
        if first_guess is None and len(fits) >= 2:
            first_guess = crossing
        on_miss = None  # what `down` becomes if this aim misses
        if crossing is None:  # nothing grows with the batch: double, or bisect
            aim = 2 * lo if hi is None else lo + (hi - lo) // 2
        elif hi is None and exact is not None and exact + 0.5 == crossing and exact > lo:
            aim = exact  # the exactly predicted limit binds: its largest k itself
        elif hi is None:
            aim, walk, walks = _approach(
                crossing, lo, len(fits), rel_error, walk, walks, large_first
            )
            on_miss = 0
        else:
            widths.append(hi - lo)
            aim, walk, on_miss = _inside(crossing, lo, hi, rel_error, walk, widths, down)
        aim = max(lo + 1, min(aim, ceiling if hi is None else hi - 1))
        start, fitted = lo, run(aim)
        down = None if fitted else on_miss
        if crossing is None or crossing - start < 1:
            continue
        if fitted:  # how far the crossing moved, relative to how far it was extrapolated
            after = predicted_boundary(fits, limits, state, bound)
            if after is not None:
                rel_error = abs(after - crossing) / (crossing - start)
        elif aim < crossing:  # a miss below the crossing: it was off by at least that much
            rel_error = max(rel_error, (crossing - aim) / (crossing - start))
    return {"lo": lo, "hi": hi, "first_guess": first_guess, "order": order}


def _approach(crossing, lo, n_fits, rel_error, walk, walks, large_first=False):
    """The next aim while no batch has missed: (aim, walk, walks)."""
    if n_fits == 1 and crossing >= lo + 1:  # the line from the state: safe, and large
        return max(int(crossing), lo + 1 if large_first else SMALL_FIRST_AIM * lo), 0, 0
    gap = crossing - lo
    margin = MARGIN * rel_error * gap
    if gap < 1:  # the line says lo is the boundary: is it? Steps of 1, 1, 2, 4, ...
        walk = 2 * walk if walks >= 2 else 1
        return lo + walk, walk, walks + 1
    if margin >= gap / 2:  # the line is not to be trusted that far: halfway
        return lo + max(1, int(gap / 2)), 0, 0
    return int(crossing - margin), 0, 0


def _inside(crossing, lo, hi, rel_error, walk, widths, down=None):
    """The next aim inside the bracket lo < k < hi: (aim, walk, what `down` becomes if it
    misses: 0 for the line's own aim, None for none)."""
    middle = lo + (hi - lo) // 2
    if crossing < lo + 1:
        return lo + 1, walk, None
    refuted_near = crossing >= hi and hi - lo <= SMALL_BRACKET  # near the boundary
    if refuted_near and down is not None and down < 2:
        # Refuted near the boundary right after the line's own aim missed: down from that
        # miss by 1, then 2, as fragmentation past the allocator's slack costs a batch or two
        # (the map's llama_1b_1024 `ckpt_offload`: the line said 431, which ran out of memory
        # with 351 MiB reserved but unallocated; 430 fit); then as below
        return max(middle, hi - 1 - down), walk, down + 1
    if len(widths) >= 3 and widths[-1] * 4 > widths[-3]:
        return middle, walk, None
    if refuted_near:
        return middle, walk, None  # (a staircase, rounding): bisect
    if crossing >= hi:  # the miss refuted the line: walk down from it in doubling steps
        walk = 2 * walk if walk < 0 else -max(1, (hi - lo) // WALK_FRACTION)
        return max(middle, hi + walk), walk, None
    return int(crossing - 0.5 * rel_error * (crossing - lo)), walk, 0  # the line's own aim
