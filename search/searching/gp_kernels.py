"""The GP's kernel parameters, carried from one suggestion to the next as Optuna's GPSampler carries them.

GPSampler fits its kernel (lengthscales, scale, noise) by maximising the marginal likelihood from a
starting point: the previous fit's parameters, which one sampler keeps between suggestions
(`_gprs_cache_list`), or Optuna's defaults for a new sampler. The reproducible searcher makes a
new sampler per trial number (its seed is a function of the seed and n), so every fit started
from the defaults. Plain Optuna with a new GPSampler per trial, Hartmann-6, 30 trials, seeds 0-5: mean best
-2.76 against one sampler's -3.07, and 21 trials at a corner of the box against 5 (docs/search-quality.md,
"The GP path"; over the numeric suite's 9 tasks at 4 at once the difference is within the seeds' spread).

So trial n's sampler starts its fit from the parameters of the latest fit made for a trial below n,
as one sampler would. Those parameters are part of the searcher's record (OrderedSearch.kernels,
searcher.json), so a resumed search starts trial n's fit where the uninterrupted one did: the
config still depends only on the seed and the trials below n.

`_gprs_cache_list` and `_constraints_gprs_cache_list` are GPSampler's own attributes (Optuna 4.2 to
5.1); fit_kernel_params reads three fields of them. Where a release renames them, this does nothing
and the fits start from the defaults, as before.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import optuna

CACHES = ("_gprs_cache_list", "_constraints_gprs_cache_list")  # the objectives' GPs, the constraints' GPs


def kernels_of(sampler: optuna.samplers.BaseSampler) -> dict[str, list[list[Any]]] | None:
    """The kernel parameters the sampler's last fit found, as plain lists (JSON); None if it fit none."""
    if not isinstance(sampler, optuna.samplers.GPSampler):
        return None
    out = {}
    for name in CACHES:
        gprs = getattr(sampler, name, None)
        if gprs:
            out[name] = [[[float(v) for v in g.inverse_squared_lengthscales.detach().reshape(-1)],
                          float(g.kernel_scale), float(g.noise_var)] for g in gprs]
    return out or None


def with_kernels(sampler: optuna.samplers.BaseSampler, saved: dict[str, list[list[Any]]] | None
                 ) -> optuna.samplers.BaseSampler:
    """`sampler`, its next fit starting from `saved` (kernels_of of an earlier sampler); as it is otherwise."""
    if saved is None or not isinstance(sampler, optuna.samplers.GPSampler):
        return sampler
    import torch  # GPSampler's own dependency, imported by it already

    for name, gprs in saved.items():
        if getattr(sampler, name, False) is None:  # the attribute exists, unset, as a new sampler has it
            setattr(sampler, name, [SimpleNamespace(
                inverse_squared_lengthscales=torch.tensor(lengthscales, dtype=torch.float64),
                kernel_scale=torch.tensor(scale, dtype=torch.float64),
                noise_var=torch.tensor(noise, dtype=torch.float64)) for lengthscales, scale, noise in gprs])
    return sampler
