"""DepthPolicy (spec=auto): the depth it picks from measured acceptance and step times."""
import pytest

from flashd.daemon.speculative.policy import DepthPolicy, PolicyConfig


def feed(policy, steps):
    """steps: (drafted, accepted, seconds) observed in order (the first sample of a depth is dropped)."""
    for d, a, s in steps:
        policy.observe(d, a, s)


def bootstrap(policy, *, plain_s, deep_s, deep_accepted):
    """The policy's first four choices are 0, 0, max, max; observe them."""
    asked = [policy.depth(policy.max_depth) for _ in range(4)]
    assert asked == [0, 0, policy.max_depth, policy.max_depth]
    feed(policy, [(0, 0, plain_s), (0, 0, plain_s),
                  (policy.max_depth, deep_accepted, deep_s), (policy.max_depth, deep_accepted, deep_s)])


def test_expensive_rows_and_poor_drafts_mean_plain_steps():
    p = DepthPolicy(7)
    # the GPU's numbers (bench/NOTES.md): a plain step 1.3 ms, each verify row 0.6 ms more
    bootstrap(p, plain_s=1.3e-3, deep_s=1.3e-3 + 7 * 0.6e-3, deep_accepted=0)
    assert p.accept_prob(1) == pytest.approx(1 / 4)        # 0 of 2 trials, Beta(1, 1) prior
    assert p.depth(7) == 0


def test_good_drafts_mean_deep_chains():
    p = DepthPolicy(7)
    bootstrap(p, plain_s=1.3e-3, deep_s=1.3e-3 + 7 * 0.2e-3, deep_accepted=7)
    assert p.expected_tokens(7) > 3.5         # p_k = 3/4 after 2 of 2 (the prior is still felt)
    assert 4 <= p.depth(7) < 7                # the later depths are not yet worth their rows
    feed(p, [(7, 7, 1.3e-3 + 7 * 0.2e-3)] * 30)
    assert p.expected_tokens(7) > 6.5
    assert p.depth(7) == 7
    assert p.depth(3) == 3          # the limit (tokens left, context) caps it


def test_cost_interpolates_between_measured_depths_and_extrapolates_flat():
    p = DepthPolicy(8)
    assert p.cost(3) is None
    feed(p, [(0, 0, 9.0), (0, 0, 1.0), (8, 0, 9.0), (8, 0, 5.0)])     # first samples dropped
    assert p.cost(0) == 1.0 and p.cost(8) == 5.0
    assert p.cost(2) == pytest.approx(2.0)
    feed(p, [(4, 0, 9.0), (4, 0, 2.0)])
    assert p.cost(2) == pytest.approx(1.5) and p.cost(6) == pytest.approx(3.5)
    q = DepthPolicy(8)
    feed(q, [(2, 0, 9.0), (2, 0, 3.0)])
    assert q.cost(0) == 3.0 and q.cost(8) == 3.0            # flat beyond the only measured depth


def test_step_time_is_a_moving_average():
    p = DepthPolicy(2, PolicyConfig(ema=0.5))
    feed(p, [(1, 1, 100.0), (1, 1, 4.0), (1, 1, 2.0)])
    assert p.step_s[1] == pytest.approx(3.0)


def test_acceptance_counts_only_reached_depths():
    p = DepthPolicy(4)
    feed(p, [(4, 1, 1.0)])          # depth 1 accepted, depth 2 rejected, depths 3-4 never reached
    assert (p.trials[1:], p.hits[1:]) == ([1, 1, 0, 0], [1, 0, 0, 0])
    feed(p, [(2, 2, 1.0)])          # a proposal shorter than asked: both accepted
    assert (p.trials[1:], p.hits[1:]) == ([2, 2, 0, 0], [2, 1, 0, 0])


def test_plain_runs_are_broken_by_an_exploring_step():
    p = DepthPolicy(4, PolicyConfig(explore_every=3))
    bootstrap(p, plain_s=1.0, deep_s=10.0, deep_accepted=0)
    picks = []
    for _ in range(8):
        d = p.depth(4)
        picks.append(d)
        p.observe(d, 0, 1.0 if d == 0 else 10.0)
    assert 0 in picks and any(d > 0 for d in picks)
    first = next(i for i, d in enumerate(picks) if d > 0)
    assert picks[:first] == [0] * first and first <= 3


def test_bad_input_is_refused():
    with pytest.raises(ValueError):
        DepthPolicy(0)
    with pytest.raises(ValueError):
        PolicyConfig(ema=0.0)
    p = DepthPolicy(3)
    with pytest.raises(ValueError, match="bad step"):
        p.observe(2, 3, 1.0)
    with pytest.raises(ValueError, match="bad step"):
        p.observe(4, 0, 1.0)
    assert p.depth(0) == 0 and p.depth(-1) == 0


def test_plain_steps_are_known_until_the_next_exploration():
    p = DepthPolicy(4, PolicyConfig(explore_every=5))
    assert p.depth(4) == 0 and p.plain_steps(100) == 1          # still measuring: one at a time
    p.observe(0, 0, 1.0)
    bootstrap_rest = [p.depth(4) for _ in range(3)]
    assert bootstrap_rest == [0, 4, 4]
    feed(p, [(0, 0, 1.0), (4, 0, 10.0), (4, 0, 10.0)])
    assert p.depth(4) == 0
    assert p.plain_steps(100) == 5 - p.plain_run and p.plain_steps(2) == 2 and p.plain_steps(0) == 1
    for _ in range(p.plain_steps(100)):
        p.observe(0, 0, 1.0)
    assert p.depth(4) > 0                                       # the burst ends where it explores


def explore_once(p, deep_s):
    """Plain steps until the policy explores; observe that step at deep_s. Returns the plain steps run."""
    n = 0
    while (d := p.depth(p.max_depth)) == 0:
        p.observe(0, 0, 1.0)
        n += 1
    p.observe(d, 0, deep_s)
    return n


def test_exploring_steps_that_lose_come_ever_more_rarely():
    # a cheap exploring step (1 s more than plain) and a 100% share: the doubling decides
    p = DepthPolicy(4, PolicyConfig(explore_every=4, max_explore_every=16, explore_share=1.0))
    bootstrap(p, plain_s=1.0, deep_s=10.0, deep_accepted=0)
    gaps = [explore_once(p, 2.0) for _ in range(5)]
    assert gaps == [4, 8, 16, 16, 16]                # doubling, capped at max_explore_every


@pytest.mark.parametrize("share,deep_s", [(0.01, 10.0), (0.01, 3.0), (0.05, 8.7), (0.2, 3.0)])
def test_losing_exploring_steps_cost_at_most_the_share_of_the_plain_time(share, deep_s):
    """However expensive its drafts, a drafter that keeps losing costs at most explore_share of the time between
    exploring steps (after the first, whose gap is explore_every)."""
    p = DepthPolicy(4, PolicyConfig(explore_every=4, max_explore_every=1 << 20, explore_share=share))
    bootstrap(p, plain_s=1.0, deep_s=deep_s, deep_accepted=0)
    gaps = [explore_once(p, deep_s) for _ in range(4)]
    assert gaps[0] == 4
    for gap in gaps[1:]:
        assert (deep_s - 1.0) / (gap * 1.0) <= share + 1e-12     # the step's extra over plain, per plain second
    assert gaps[1] == max(8, -(-round((deep_s - 1.0) / share, 9) // 1))


def test_explore_share_is_checked():
    for bad in (0.0, -0.1, 1.5):
        with pytest.raises(ValueError, match="explore_share"):
            PolicyConfig(explore_share=bad)


def test_an_exploring_step_that_pays_resets_the_gap():
    p = DepthPolicy(4, PolicyConfig(explore_every=4, max_explore_every=64, ema=1.0, explore_share=1.0))
    bootstrap(p, plain_s=1.0, deep_s=10.0, deep_accepted=0)
    assert [explore_once(p, 2.0) for _ in range(3)] == [4, 8, 16]
    # drafts got better: the next exploring step is all accepted and cheap -> drafting now wins
    while (d := p.depth(4)) == 0:
        p.observe(0, 0, 1.0)
    for _ in range(30):                               # enough hits to lift the acceptance estimate
        p.trials[1:] = [t + 1 for t in p.trials[1:]]
        p.hits[1:] = [h + 1 for h in p.hits[1:]]
    p.observe(d, d, 1.1)
    assert p.explore_gap == 4 and p.depth(4) > 0


def test_explore_gap_bounds_are_checked():
    with pytest.raises(ValueError, match="max_explore_every"):
        PolicyConfig(explore_every=8, max_explore_every=4)
