"""Efficiency curves: the achieved fraction of a device's peak against problem size, fitted with scipy.

A curve is a function of the work of one op call (FLOPs for compute ops, bytes for memory ops) and the
peak rate it is measured against (FLOP/s or bytes/s). Size enters as the *ideal time* tau = work /
peak, the seconds the op would take at peak: a GEMM that would take 5 us at peak runs at a poor
fraction on any device (launch and fill dominate), which lets a curve measured on one device speak
for another of the same family.

Two shapes:
- `saturating`: f(tau) = e_max / (1 + (tau_half / tau) ** alpha). With alpha = 1 this is exactly a
  fixed per-call cost plus work at e_max of peak: t = tau / e_max + tau_half / e_max.
- `hierarchy` (memory ops): the fraction steps down from `e_near` (working set in cache) to `e_far`
  (in DRAM/HBM) around `capacity_bytes`, as steeply as `sharpness` says, times the same per-call
  saturation with alpha = 1:
  f = (e_far + (e_near - e_far) / (1 + (work / capacity) ** sharpness)) / (1 + tau_half / tau).

Fits minimise the squared log-ratio of measured to fitted fraction (relative errors, so 64-byte and
1-GiB points weigh alike); each fit keeps its residuals.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from advisor.calibration.checked import (SHOWN_CHARS, Fields, MalformedProfile, as_float, describe, each, shown,
                                         signed_number)

CURVE_KINDS = ("saturating", "hierarchy")

_PARAMETERS = {
    "saturating": ("e_max", "tau_half_s", "alpha"),
    "hierarchy": ("e_far", "e_near", "capacity_bytes", "sharpness", "tau_half_s"),
}
MAY_BE_ZERO = ("tau_half_s",)
"""The one parameter that may be 0 (no per-call latency: a one-point fit); the others must be above 0."""


@dataclass(frozen=True)
class Curve:
    """Achieved fraction of peak as a function of the work of one call; see the module docstring."""

    kind: str
    params: tuple[tuple[str, float], ...]
    """(name, value) in the order of the kind's parameters: seconds for tau_half_s, bytes for capacity."""

    def __post_init__(self) -> None:
        assert self.kind in CURVE_KINDS, self.kind
        assert tuple(name for name, _ in self.params) == _PARAMETERS[self.kind], self.params

    @classmethod
    def saturating(cls, e_max: float, tau_half_s: float, alpha: float = 1.0) -> Curve:
        return cls("saturating", (("e_max", e_max), ("tau_half_s", tau_half_s), ("alpha", alpha)))

    @classmethod
    def hierarchy(cls, e_far: float, e_near: float, capacity_bytes: float, tau_half_s: float,
                  sharpness: float = 2.0) -> Curve:
        return cls(
            "hierarchy",
            (("e_far", e_far), ("e_near", e_near), ("capacity_bytes", capacity_bytes), ("sharpness", sharpness),
             ("tau_half_s", tau_half_s)),
        )

    def param(self, name: str) -> float:
        return dict(self.params)[name]

    @property
    def asymptote(self) -> float:
        """The fraction large problems reach: e_max, or e_far for memory ops beyond the cache."""
        return self.param("e_max" if self.kind == "saturating" else "e_far")

    def efficiency(self, work: float, peak: float) -> float:
        """Fraction of `peak` (FLOP/s or bytes/s) one call of `work` (FLOPs or bytes) achieves."""
        assert work > 0 and peak > 0, (work, peak)
        return float(_evaluate(self.kind, np.array([work]), peak, *[value for _, value in self.params])[0])

    def seconds(self, work: float, peak: float) -> float:
        """Predicted seconds of one call of `work` against `peak`."""
        return work / (peak * self.efficiency(work, peak))

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, **dict(self.params)}

    @classmethod
    def from_dict(cls, data: object) -> Curve:
        """A curve from its to_dict() form; MalformedProfile (a ValueError) names the wrong key."""
        if not isinstance(data, dict):
            raise MalformedProfile("", f"expected a mapping, got {describe(data)}")
        kind = data.get("kind")
        if kind not in CURVE_KINDS:
            raise MalformedProfile("kind", f"unknown curve kind {shown(kind)} "
                                           f"(expected one of {', '.join(CURVE_KINDS)})")
        names = _PARAMETERS[kind]
        unknown = [key for key in data if key not in ("kind", *names)]
        if unknown:
            raise MalformedProfile(unknown[0][:SHOWN_CHARS], f"unknown key {shown(unknown[0])} in a {kind} curve "
                                                             f"(expected {', '.join(names)})")
        missing = [name for name in names if name not in data]
        if missing:
            raise MalformedProfile(missing[0], f"a {kind} curve needs {', '.join(missing)}")
        values = []
        for name in names:
            value = as_float(data[name])
            if value is None or not math.isfinite(value) or value < 0:
                raise MalformedProfile(name, f"{kind} curve parameters must be finite and not negative, "
                                             f"got {shown(data[name])}")
            if value == 0 and name not in MAY_BE_ZERO:
                raise MalformedProfile(name, f"must be above zero, got {data[name]}")
            values.append(value)
        return cls(kind, tuple(zip(names, values)))


def _evaluate(kind: str, work: np.ndarray, peak: float, *params: float) -> np.ndarray:
    tau = work / peak
    if kind == "saturating":
        e_max, tau_half, alpha = params
        return e_max / (1.0 + (tau_half / tau) ** alpha)
    e_far, e_near, capacity, sharpness, tau_half = params
    level = e_far + (e_near - e_far) / (1.0 + (work / capacity) ** sharpness)
    return level / (1.0 + tau_half / tau)


@dataclass(frozen=True)
class Fit:
    """A fitted curve and how well it matches the points it was fitted to."""

    curve: Curve
    residuals: tuple[float, ...]
    """Per point, measured / fitted fraction - 1 (0.05: the point ran 5% faster than the curve says)."""
    rms_log_residual: float
    """Root mean square of log(measured / fitted): 0.05 is about 5% typical error."""
    points: int

    @property
    def max_abs_residual(self) -> float:
        return max((abs(r) for r in self.residuals), default=0.0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "curve": self.curve.to_dict(),
            "residuals": list(self.residuals),
            "rms_log_residual": self.rms_log_residual,
            "points": self.points,
        }

    @classmethod
    def from_dict(cls, data: object) -> Fit:
        """A fit from its to_dict() form; MalformedProfile (a ValueError) names the wrong key."""
        entry = Fields(data, ("curve", "residuals", "rms_log_residual", "points"))
        residuals = entry.read("residuals", lambda value: each(value, signed_number))
        points = entry.integer("points")
        if len(residuals) != points:
            raise MalformedProfile("residuals", f"{len(residuals)} residuals for {points} points")
        return cls(entry.read("curve", Curve.from_dict), residuals, entry.number("rms_log_residual"), points)


def fit_curve(kind: str, work: Sequence[float], fraction: Sequence[float], peak: float,
              capacity_guess: float | None = None) -> Fit:
    """Fit a curve of `kind` to measured fractions of `peak` at these works (FLOPs or bytes per call).

    Fewer points than parameters constrain less: with 2-3 points a saturating curve keeps alpha = 1, a
    hierarchy curve needs 6 for its cache step (else e_near = e_far); one point gives a flat curve.
    A saturating curve's e_max stays within 1.15 times the best fraction measured: the suite's largest
    sizes saturate the device, and points of nearly equal size (CNN convolutions) leave the
    asymptote otherwise unconstrained.
    """
    assert kind in CURVE_KINDS, kind
    x = np.asarray(work, dtype=float)
    y = np.asarray(fraction, dtype=float)
    assert len(x) == len(y) >= 1 and np.all(x > 0) and np.all(y > 0), (work, fraction)
    order = np.argsort(x)
    x, y = x[order], y[order]
    tau = x / peak
    from scipy.optimize import OptimizeWarning  # imported on first fit: see _curve_fit

    with warnings.catch_warnings():  # exact fits leave no covariance to estimate; only the optimum is used
        warnings.simplefilter("ignore", OptimizeWarning)
        if kind == "saturating":
            curve = _fit_saturating(tau, y)
        else:
            curve = _fit_hierarchy(x, tau, y, capacity_guess or float(np.median(x)))
    fitted = _evaluate(curve.kind, x, peak, *[value for _, value in curve.params])
    log_residuals = np.log(y / fitted)
    residuals = np.empty_like(log_residuals)
    residuals[order] = np.expm1(log_residuals)  # back in the caller's order
    return Fit(curve, tuple(float(r) for r in residuals), float(np.sqrt(np.mean(log_residuals**2))), len(x))


def _half_point(tau: np.ndarray, y: np.ndarray) -> float:
    """A first guess of tau_half: the ideal time where the fraction first reaches half its maximum."""
    reached = np.nonzero(y >= 0.5 * y.max())[0]
    return float(tau[reached[0]]) if len(reached) else float(tau[-1])


MAX_ASYMPTOTE_OVER_BEST = 1.15


def _curve_fit(*args: Any, **kwargs: Any) -> Any:
    """scipy.optimize.curve_fit, imported on first use: scipy.optimize takes ~0.45 s to import, and
    estimating (which evaluates fitted curves but never fits one) should not pay it."""
    from scipy.optimize import curve_fit

    return curve_fit(*args, **kwargs)


def _fit_saturating(tau: np.ndarray, y: np.ndarray) -> Curve:
    if len(tau) == 1:
        return Curve.saturating(float(y[0]), 0.0, 1.0)
    best = float(y.max())
    guess = [best * 1.05, max(_half_point(tau, y) * 0.5, 1e-12)]
    if len(tau) < 4:
        model = lambda t, e, h: np.log(e / (1.0 + h / t))  # noqa: E731
        bounds = ([best * 0.5, 0.0], [best * MAX_ASYMPTOTE_OVER_BEST, 10.0])
        (e_max, tau_half), _ = _curve_fit(model, tau, np.log(y), p0=guess, bounds=bounds)
        return Curve.saturating(float(e_max), float(tau_half), 1.0)
    model = lambda t, e, log_h, a: np.log(e / (1.0 + np.exp(a * (log_h - np.log(t)))))  # noqa: E731
    p0 = [guess[0], math.log(guess[1]), 1.0]
    bounds = ([best * 0.5, math.log(1e-12), 0.3], [best * MAX_ASYMPTOTE_OVER_BEST, math.log(10.0), 4.0])
    (e_max, log_half, alpha), _ = _curve_fit(model, tau, np.log(y), p0=p0, bounds=bounds, maxfev=20000)
    return Curve.saturating(float(e_max), float(math.exp(log_half)), float(alpha))


def _fit_hierarchy(x: np.ndarray, tau: np.ndarray, y: np.ndarray, capacity_guess: float) -> Curve:
    peak = float(x[0] / tau[0])
    if len(x) < 6:
        saturating = _fit_saturating(tau, y)
        e = saturating.param("e_max")
        return Curve.hierarchy(e, e, capacity_guess, saturating.param("tau_half_s") if len(x) > 1 else 0.0)

    def model(size: np.ndarray, e_far: float, e_near: float, log_cap: float, sharpness: float,
              log_half: float) -> np.ndarray:
        level = e_far + (e_near - e_far) / (1.0 + (size / math.exp(log_cap)) ** sharpness)
        return np.log(level / (1.0 + math.exp(log_half) / (size / peak)))

    p0 = [float(y[-1]), float(y.max()), math.log(capacity_guess), 2.0,
          math.log(max(_half_point(tau, y) * 0.2, 1e-12))]
    bounds = ([1e-6, 1e-6, math.log(1e3), 0.5, math.log(1e-12)], [20.0, 50.0, math.log(1e11), 8.0, math.log(1.0)])
    p0 = [min(max(v, lo + 1e-6 * abs(hi - lo)), hi - 1e-6 * abs(hi - lo)) for v, lo, hi in zip(p0, *bounds)]
    (e_far, e_near, log_cap, sharpness, log_half), _ = _curve_fit(model, x, np.log(y), p0=p0, bounds=bounds,
                                                                 maxfev=20000)
    return Curve.hierarchy(float(e_far), float(e_near), float(math.exp(log_cap)), float(math.exp(log_half)),
                           float(sharpness))
