"""Bayesian optimisation for autotune: a Gaussian process over the points tried so far, and the next point to try
chosen by expected improvement.

The Gaussian process comes from scikit-learn, an optional extra (``pip install -c constraints.txt -e '.[autotune]'``
in hora's checkout); it is imported only when a search is built, so ``import hora`` stays numpy-only. Points live in
the unit cube: each continuous dimension scaled to [0, 1], each on/off dimension 0 or 1.
"""

from __future__ import annotations

import importlib.util
import math
import warnings
from typing import Any

import numpy as np

from hora.errors import ConfigError

__all__ = ["BayesianSearch", "require_gaussian_process"]

_CANDIDATES = 2000  # random points scored by expected improvement per proposal


def require_gaussian_process() -> None:
    """Raise :class:`ConfigError` unless scikit-learn can be imported (autotune's Gaussian process needs it)."""
    try:
        found = importlib.util.find_spec("sklearn") is not None
    except (ImportError, ValueError):  # a module set to None in sys.modules, or a broken package
        found = False
    if not found:
        raise ConfigError(
            "HORA_AUTOTUNE=1 (hora run --autotune) needs scikit-learn for its Gaussian process, and it is not "
            "installed; install it with pip install -c constraints.txt -e '.[autotune]' in hora's checkout (or "
            "scikit-learn>=1.3), or turn autotune off"
        )


class BayesianSearch:
    """Proposes points in ``[0, 1]^d``; the last ``binary`` of the ``d`` dimensions only take 0 or 1.

    Args:
        continuous: how many continuous dimensions come first.
        binary: how many on/off dimensions follow.
        noise: the Gaussian process's ``alpha`` on scores normalised to mean 0 and variance 1.
        seed: of the random candidates (rank 0 alone proposes, so this only makes runs repeatable).
    """

    def __init__(self, continuous: int, binary: int, noise: float, seed: int = 0) -> None:
        require_gaussian_process()
        from sklearn.exceptions import ConvergenceWarning
        from sklearn.gaussian_process import GaussianProcessRegressor
        from sklearn.gaussian_process.kernels import ConstantKernel, Matern

        self._convergence_warning = ConvergenceWarning
        self.continuous, self.binary = continuous, binary
        kernel = ConstantKernel(1.0, (1e-3, 1e3)) * Matern(length_scale=0.3, length_scale_bounds=(0.05, 10.0), nu=2.5)
        self._gp: Any = GaussianProcessRegressor(kernel=kernel, alpha=max(noise, 1e-6), normalize_y=True)
        self._rng = np.random.default_rng(seed)
        self.xs: list[np.ndarray] = []
        self.ys: list[float] = []

    def tell(self, x: np.ndarray, score: float) -> None:
        self.xs.append(np.asarray(x, float))
        self.ys.append(float(score))

    def best(self) -> tuple[np.ndarray, float]:
        i = int(np.argmax(self.ys))
        return self.xs[i], self.ys[i]

    def ask(self) -> np.ndarray:
        """The candidate with the highest expected improvement over the best score seen."""
        cands = self._rng.random((_CANDIDATES, self.continuous + self.binary))
        cands[:, self.continuous :] = np.round(cands[:, self.continuous :])
        if not self.xs:
            return cands[0]
        ys = np.asarray(self.ys)
        scale = float(ys.std()) or 1.0
        y = (ys - ys.mean()) / scale  # the GP also normalises; this keeps its optimiser's numbers near 1
        with warnings.catch_warnings():  # a kernel parameter at its bound on few noisy samples is expected
            warnings.simplefilter("ignore", self._convergence_warning)
            self._gp.fit(np.stack(self.xs), y)
        mean, std = self._gp.predict(cands, return_std=True)
        return cands[int(np.argmax(expected_improvement(mean, std, float(y.max()))))]


def expected_improvement(mean: np.ndarray, std: np.ndarray, best: float, xi: float = 0.01) -> np.ndarray:
    """E[max(f - best - xi, 0)] for f ~ N(mean, std^2), elementwise (numpy only: no scipy needed)."""
    std = np.maximum(std, 1e-9)
    z = (mean - best - xi) / std
    cdf = 0.5 * (1.0 + np.vectorize(math.erf)(z / math.sqrt(2.0)))
    pdf = np.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)
    return (mean - best - xi) * cdf + std * pdf
