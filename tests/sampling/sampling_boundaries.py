"""The float32-boundary oracle shared by the GPU sampler test (tests/gpu/test_sampling_gpu.py) and
its CPU emulation (tests/sampling/test_sampling_threshold_emulation.py): where a float64 reference choice
could legitimately differ from a correct float32 sampler's."""
import numpy as np

from flashd.daemon.sampling import apply_penalties, uniform

VAL_TOL = 4e-6    # relative: a float32 p (exp2f of a rounded log2 argument) vs float64
MASS_TOL = 1e-5   # absolute, on normalised mass: float32 sums over up to 262144 terms


def boundaries(logits, history, params, step):
    """(borderline, loose) for the float64 reference's choice at `step`.

    borderline: some decision -- the top_k cut, the top_p cut (by mass), a value near tau or
    min_p, or u against the cumulative mass -- lies within float32 rounding of its boundary, so a
    correct float32 sampler may legitimately pick another token. loose: a superset of the kept ids
    that any such rounding could produce (the token must be one of them even then).
    """
    x = apply_penalties(logits, history, params) / params.temperature
    n = x.size
    border = False
    keep = np.ones(n, bool)
    loose = np.ones(n, bool)
    if 0 < params.top_k < n:
        theta = np.partition(x, n - params.top_k)[n - params.top_k]
        tol = VAL_TOL * (1 + abs(theta))
        border |= bool(np.any((np.abs(x - theta) < tol) & (x != theta)))
        keep = x >= theta
        loose = x >= theta - tol
    p = np.where(keep, np.exp(x - x.max()), 0.0)
    p /= p.sum()
    pl = np.where(loose, np.exp(x - x.max()), 0.0)
    pl /= pl.sum()
    if params.top_p < 1.0:
        desc = np.sort(p[keep])[::-1]
        cum = np.cumsum(desc)
        cut = min(int(np.searchsorted(cum, params.top_p, side="left")), desc.size - 1)
        border |= abs(cum[cut] - params.top_p) < MASS_TOL or (cut > 0 and abs(cum[cut - 1] - params.top_p) < MASS_TOL)
        tau = desc[cut]
        border |= bool(np.any((np.abs(desc - tau) < VAL_TOL * tau) & (desc != tau)))
        keep &= p >= tau
        desc_l = np.sort(pl[loose])[::-1]
        cut_l = min(int(np.searchsorted(np.cumsum(desc_l), min(params.top_p + 1e-4, 1.0), side="left")),
                    desc_l.size - 1)
        loose &= pl >= desc_l[cut_l] * (1 - 1e-4)
    if params.min_p > 0.0:
        thr = params.min_p * p.max()
        border |= bool(np.any(np.abs(p[keep] - thr) < VAL_TOL * thr))
        keep &= p >= thr
        loose &= pl >= params.min_p * pl.max() * (1 - 1e-4)
    cum = np.cumsum(p[keep] / p[keep].sum())
    border |= bool(np.min(np.abs(cum - uniform(params.seed, step))) < MASS_TOL)
    return border, loose
