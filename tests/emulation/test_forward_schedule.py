"""CPU emulation of the persistent forward's schedule (native/cuda/forward.cu: forward_schedule.cuh,
forward_kernel.cuh, forward_plan.cuh), so CI checks the plan without a GPU: which CTA and warp takes
each item, the per-warp weight ring's issue order, and the dependency counters -- every item done
exactly once, no stage starting before the one it reads from is complete, and no deadlock, for many
stage shapes, grid sizes and interleavings.

The emulated rules are those files', line for line:
  * GEMV step s of a stage with rotation rot: CTA s % n_ctas, warp (s // n_ctas + rot) % W;
    a warp's steps are first_step(v) = v * n_ctas + cta (v = (warp - rot) mod W), then + n_ctas * W.
  * ATTN item i: CTA i % n_ctas (the whole CTA), items cta, cta + n_ctas, ...
  * rot of a GEMV stage = (sum over earlier GEMV stages of ceil(n_items / n_ctas)) mod W.
  * a CTA with an item in stage k waits for counters[k - 1] == n_ctas, runs its items, then arrives
    (counters[k] += 1); a CTA without items arrives at once.
  * the weight ring: a warp issues its GEMV steps in (stage, step) order, S ahead of its compute.
"""
import math
import random

import pytest

GEMV, ATTN = 0, 2


def rotations(stages, n_ctas, n_warps):
    rots, rot = [], 0
    for kind, n_items in stages:
        rots.append(rot if kind != ATTN else 0)
        if kind != ATTN:
            rot = (rot + math.ceil(n_items / n_ctas)) % n_warps
    return rots


def warp_items(kind, n_items, rot, cta, warp, n_ctas, n_warps):
    """The items (cta, warp) runs in a stage, in order (ATTN: the CTA's, for every warp)."""
    if kind == ATTN:
        return list(range(cta, n_items, n_ctas))
    v = (warp - rot) % n_warps
    return list(range(v * n_ctas + cta, n_items, n_ctas * n_warps))


def layer_stages(rng, n_layers):
    """A random program shaped like forward.cu's: per layer QKV, ATTN, O, GU, DOWN; then LM."""
    st = []
    for _ in range(n_layers):
        st += [(GEMV, rng.randint(1, 600)), (ATTN, rng.randint(1, 400)), (GEMV, rng.randint(1, 400)),
               (GEMV, rng.randint(1, 3000)), (GEMV, rng.randint(1, 500))]
    return st + [(GEMV, rng.randint(1, 20000))]


CASES = [(n_layers, n_ctas, n_warps, seed) for seed, (n_layers, n_ctas, n_warps) in enumerate([
    (1, 1, 16), (2, 3, 16), (3, 132, 16), (2, 132, 12), (4, 7, 12), (2, 82, 16), (1, 128, 16), (3, 46, 16),
    (2, 170, 12), (5, 13, 16)])]


@pytest.mark.parametrize("n_layers,n_ctas,n_warps,seed", CASES)
def test_every_item_is_run_exactly_once(n_layers, n_ctas, n_warps, seed):
    rng = random.Random(seed)
    stages = layer_stages(rng, n_layers)
    rots = rotations(stages, n_ctas, n_warps)
    for (kind, n_items), rot in zip(stages, rots):
        seen = []
        for cta in range(n_ctas):
            if kind == ATTN:
                seen += warp_items(kind, n_items, rot, cta, 0, n_ctas, n_warps)
                continue
            for warp in range(n_warps):
                seen += warp_items(kind, n_items, rot, cta, warp, n_ctas, n_warps)
        assert sorted(seen) == list(range(n_items))
        # "a CTA has items iff cta < n_items" (forward_kernel.cuh tests only that before waiting)
        for cta in range(n_ctas):
            has = any(warp_items(kind, n_items, rot, cta, w, n_ctas, n_warps) for w in range(n_warps))
            assert has == (cta < n_items)


@pytest.mark.parametrize("n_layers,n_ctas,n_warps,seed", CASES)
def test_load_is_balanced_across_ctas(n_layers, n_ctas, n_warps, seed):
    stages = layer_stages(random.Random(seed), n_layers)
    for (kind, n_items), rot in zip(stages, rotations(stages, n_ctas, n_warps)):
        per_cta = [sum(len(warp_items(kind, n_items, rot, c, w, n_ctas, n_warps)) for w in range(n_warps))
                   if kind != ATTN else len(warp_items(kind, n_items, rot, c, 0, n_ctas, n_warps))
                   for c in range(n_ctas)]
        assert max(per_cta) - min(per_cta) <= 1


def ring_issue_order(stages, rots, cta, warp, n_ctas, n_warps):
    """forward_schedule.cuh's Ring cursor: ring_seek / ring_issue over the GEMV stages."""
    gemv = [(i, n) for i, (k, n) in enumerate(stages) if k == GEMV]
    out, gs, step = [], 0, -1
    while True:
        while gs < len(gemv):
            i, n = gemv[gs]
            if step < 0:
                step = ((warp - rots[i]) % n_warps) * n_ctas + cta
            if step < n:
                break
            gs, step = gs + 1, -1
        if gs == len(gemv):
            return out
        out.append((gemv[gs][0], step))
        step += n_ctas * n_warps


@pytest.mark.parametrize("n_layers,n_ctas,n_warps,seed", CASES)
def test_weight_ring_issues_in_compute_order(n_layers, n_ctas, n_warps, seed):
    stages = layer_stages(random.Random(seed), n_layers)
    rots = rotations(stages, n_ctas, n_warps)
    for cta in {0, n_ctas // 2, n_ctas - 1}:
        for warp in range(n_warps):
            computed = [(i, s) for i, (kind, n) in enumerate(stages) if kind == GEMV
                        for s in warp_items(kind, n, rots[i], cta, warp, n_ctas, n_warps)]
            assert ring_issue_order(stages, rots, cta, warp, n_ctas, n_warps) == computed


def run_protocol(stages, n_ctas, rng, stall=0.0):
    """Interleave the CTAs at random (a CTA may also be descheduled: `stall`); returns the order in which
    (stage, cta) item batches ran and asserts each ran only after its dependency was complete."""
    n = len(stages)
    counters = [0] * n
    pos = [0] * n_ctas                       # the stage each CTA is at
    done_items = [0] * n                     # CTAs whose items of stage k are done
    log = []
    steps = 0
    while any(p < n for p in pos):
        steps += 1
        assert steps < 100 * n * n_ctas + 1000, "no progress: deadlock"
        ready = []
        for c in range(n_ctas):
            k = pos[c]
            if k == n:
                continue
            has = c < stages[k][1]
            if has and k > 0 and counters[k - 1] < n_ctas:
                continue                     # spinning on counters[k - 1]
            ready.append(c)
        assert ready, "every unfinished CTA is waiting: deadlock"
        c = rng.choice(ready)
        if rng.random() < stall:
            continue
        k = pos[c]
        if c < stages[k][1]:
            # the dependency: every stage before k is complete (all CTAs arrived)
            assert all(counters[j] == n_ctas for j in range(k)), f"stage {k} ran before an earlier stage finished"
            log.append((k, c))
        done_items[k] += 1
        counters[k] += 1                     # arrive
        pos[c] += 1
    assert counters == [n_ctas] * n
    return log


@pytest.mark.parametrize("n_layers,n_ctas,n_warps,seed", CASES)
def test_counters_order_every_stage_and_never_deadlock(n_layers, n_ctas, n_warps, seed):
    rng = random.Random(1000 + seed)
    stages = layer_stages(rng, n_layers)
    for trial in range(3):
        log = run_protocol(stages, n_ctas, rng, stall=0.3 * trial)
        ran = {}
        for k, c in log:
            ran.setdefault(k, set()).add(c)
        for k, (_, n_items) in enumerate(stages):
            assert ran.get(k, set()) == set(range(min(n_items, n_ctas)))


def test_a_stage_with_items_on_few_ctas_still_orders_the_next():
    """Tiny stages (a decode step's attention at depth 0 uses a handful of CTAs): CTAs without items race
    ahead, yet the next stage's CTAs still start only after the tiny stage is done."""
    stages = [(GEMV, 500), (ATTN, 2), (GEMV, 300), (GEMV, 2000), (GEMV, 300), (ATTN, 1), (GEMV, 9000)]
    rng = random.Random(7)
    for _ in range(50):
        run_protocol(stages, 132, rng, stall=0.5)


def ring_place(off, n, ring):
    """forward_schedule.cuh ring_place: the virtual offset an entry of n bytes starts at."""
    return off if off % ring + n <= ring else off - off % ring + ring


@pytest.mark.parametrize("seed", range(12))
def test_weight_ring_places_entries_without_overlap(seed):
    """forward_schedule.cuh's byte ring: ring_fill issues entries while they fit behind the oldest unconsumed one
    (at most 8 in flight); ring_front / ring_pop re-derive each entry's place. Every entry lies inside one
    pass of the ring, never overlaps an entry in flight, and the consumer reads it where it was written."""
    rng = random.Random(seed)
    ring = 16 * rng.randint(300, 900)
    sizes = [16 * rng.randint(20, ring // 16) for _ in range(rng.randint(5, 40))]   # steps of any stage, <= ring
    sizes += [16 * rng.randint(20, min(400, ring // 16)) for _ in range(300)]
    issued = consumed = head = tail = 0
    live = {}                                    # entry -> (start, end) physical, while in flight
    where = {}
    while consumed < len(sizes):
        while issued - consumed < 8 and issued < len(sizes):          # ring_fill
            if issued == consumed:
                head = tail = 0
            n = sizes[issued]
            at = ring_place(head, n, ring)
            if at + n - tail > ring:
                break
            lo, hi = at % ring, at % ring + n
            assert hi <= ring
            for a, b in live.values():
                assert hi <= a or b <= lo, "an entry overwrote one still in flight"
            live[issued] = (lo, hi)
            where[issued] = lo
            head = at + n
            issued += 1
        assert issued > consumed, "nothing in flight and nothing issuable: the ring is too small"
        n = sizes[consumed]                                              # ring_front / ring_pop
        assert ring_place(tail, n, ring) % ring == where[consumed]
        tail = ring_place(tail, n, ring) + n
        del live[consumed]
        consumed += 1
