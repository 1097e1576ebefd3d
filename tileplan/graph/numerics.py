"""float64 numerics shared by the graph's reference semantics and the kernels' numpy semantics."""

from __future__ import annotations

import numpy as np

# W. J. Cody, "Rational Chebyshev approximations for the error function",
# Math. Comp. 23 (1969); coefficients as in netlib specfun CALERF. Relative error
# below 1e-15 in float64, vectorised (math.erf per element is too slow for the
# IPU model's full-size runs).
_ERF_A = (3.16112374387056560e00, 1.13864154151050156e02, 3.77485237685302021e02,
          3.20937758913846947e03, 1.85777706184603153e-1)
_ERF_B = (2.36012909523441209e01, 2.44024637934444173e02, 1.28261652607737228e03,
          2.84423683343917062e03)
_ERF_C = (5.64188496988670089e-1, 8.88314979438837594e00, 6.61191906371416295e01,
          2.98635138197400131e02, 8.81952221241769090e02, 1.71204761263407058e03,
          2.05107837782607147e03, 1.23033935479799725e03, 2.15311535474403846e-8)
_ERF_D = (1.57449261107098347e01, 1.17693950891312499e02, 5.37181101862009858e02,
          1.62138957456669019e03, 3.29079923573345963e03, 4.36261909014324716e03,
          3.43936767414372164e03, 1.23033935480374942e03)
_ERF_P = (3.05326634961232344e-1, 3.60344899949804439e-1, 1.25781726111229246e-1,
          1.60837851487422766e-2, 6.58749161529837803e-4, 1.63153871373020978e-2)
_ERF_Q = (2.56852019228982242e00, 1.87295284992346725e00, 5.27905102951428412e-1,
          6.05183413124413191e-2, 2.33520497626869185e-3)
_SQRT_1_PI = 5.6418958354775628695e-1


def erf(x: np.ndarray) -> np.ndarray:
    """float64 erf by Cody's three rational approximations (|x| <= 0.5, <= 4, > 4)."""
    x = np.asarray(x, np.float64)
    y = np.abs(x)
    out = np.empty_like(x)

    small = y <= 0.5
    ys = y[small]
    ysq = ys * ys
    num, den = _ERF_A[4] * ysq, ysq
    for i in range(3):
        num, den = (num + _ERF_A[i]) * ysq, (den + _ERF_B[i]) * ysq
    out[small] = x[small] * (num + _ERF_A[3]) / (den + _ERF_B[3])

    def erfc_tail(yy: np.ndarray, r: np.ndarray) -> np.ndarray:
        ysq16 = np.trunc(yy * 16.0) / 16.0
        delta = (yy - ysq16) * (yy + ysq16)
        return np.exp(-ysq16 * ysq16) * np.exp(-delta) * r

    mid = (y > 0.5) & (y <= 4.0)
    ym = y[mid]
    num, den = _ERF_C[8] * ym, ym
    for i in range(7):
        num, den = (num + _ERF_C[i]) * ym, (den + _ERF_D[i]) * ym
    erfc_mid = erfc_tail(ym, (num + _ERF_C[7]) / (den + _ERF_D[7]))
    out[mid] = np.copysign(1.0 - erfc_mid, x[mid])

    big = y > 4.0
    yb = y[big]
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        inv = 1.0 / (yb * yb)
        num, den = _ERF_P[5] * inv, inv
        for i in range(4):
            num, den = (num + _ERF_P[i]) * inv, (den + _ERF_Q[i]) * inv
        r = inv * (num + _ERF_P[4]) / (den + _ERF_Q[4])
        r = (_SQRT_1_PI - r) / yb
        erfc_big = np.where(yb < 27.0, erfc_tail(yb, r), 0.0)
    out[big] = np.copysign(1.0 - erfc_big, x[big])
    nan = np.isnan(x)
    out[nan] = np.nan
    return out


def sigmoid(x: np.ndarray) -> np.ndarray:
    """float64 logistic ``1 / (1 + exp(-x))`` without overflow or cancellation for either sign."""
    x = np.asarray(x, np.float64)
    with np.errstate(over="ignore"):
        e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))
