"""A numpy stand-in for the four members of `pwlf.PiecewiseLinFit` that torch's SAC estimator calls.

PyTorch's SAC MILP fits each module's memory/recompute trade-off curve with the `pwlf` package, which is not
installable on this machine (no index carries it). This shim fits the same model — a *continuous* piecewise
linear function with `n_segments` pieces, least squares — by exhaustive search over breakpoints at the data's
x values (the curves have a few dozen points and n_segments <= 2). pwlf optimises the breakpoints
continuously, so the fit can differ slightly; the report says when the shim was used.
"""

from __future__ import annotations

import itertools

import numpy as np
from numpy.typing import NDArray


class PiecewiseLinFit:
    def __init__(self, x: list[float] | NDArray[np.float64], y: list[float] | NDArray[np.float64]) -> None:
        self.x_data = np.asarray(x, dtype=float)
        self.y_data = np.asarray(y, dtype=float)
        self.fit_breaks: NDArray[np.float64] = np.array([self.x_data.min(), self.x_data.max()])
        self.beta: NDArray[np.float64] = np.zeros(2)
        self.slopes: NDArray[np.float64] = np.zeros(1)
        self.intercepts: NDArray[np.float64] = np.zeros(1)

    def _design(self, x: NDArray[np.float64], breaks: NDArray[np.float64]) -> NDArray[np.float64]:
        # pwlf's basis: 1, (x - b0), max(x - b1, 0), ..., which makes the fit continuous at the breaks.
        cols = [np.ones_like(x), x - breaks[0]]
        cols += [np.maximum(x - b, 0.0) for b in breaks[1:-1]]
        return np.column_stack(cols)

    def _lstsq(self, breaks: NDArray[np.float64]) -> tuple[float, NDArray[np.float64]]:
        a = self._design(self.x_data, breaks)
        beta, *_ = np.linalg.lstsq(a, self.y_data, rcond=None)
        resid = self.y_data - a @ beta
        return float(resid @ resid), beta

    def fit(self, n_segments: int) -> NDArray[np.float64]:
        lo, hi = float(self.x_data.min()), float(self.x_data.max())
        inner = sorted(set(self.x_data.tolist()) - {lo, hi})
        best: tuple[float, NDArray[np.float64], NDArray[np.float64]] | None = None
        for combo in itertools.combinations(inner, max(0, n_segments - 1)):
            breaks = np.array([lo, *combo, hi])
            sse, beta = self._lstsq(breaks)
            if best is None or sse < best[0]:
                best = (sse, breaks, beta)
        if best is None:  # fewer distinct points than segments: one line
            breaks = np.array([lo, hi])
            best = (0.0, breaks, self._lstsq(breaks)[1])
        _, self.fit_breaks, self.beta = best
        self.calc_slopes()
        return self.fit_breaks

    def calc_slopes(self) -> NDArray[np.float64]:
        self.slopes = np.cumsum(self.beta[1:])
        # Each piece's line through its left end, written as y = slope * x + intercept.
        left_y = self.predict(self.fit_breaks[:-1])
        self.intercepts = left_y - self.slopes * self.fit_breaks[:-1]
        return self.slopes

    def predict(self, x: list[float] | NDArray[np.float64]) -> NDArray[np.float64]:
        xs = np.asarray(x, dtype=float)
        return self._design(xs, self.fit_breaks) @ self.beta
