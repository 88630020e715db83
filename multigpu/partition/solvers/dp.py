"""Exact chain DP: the cheapest assignment without coupling constraints, in O(n k^2).

V_1(v) = first(v) + node_1(v)
V_i(v) = node_i(v) + min_u [ V_{i-1}(u) + b_{i-1} * alpha(u, v) + beta(u, v) ]
answer = min_u [ V_n(u) + last(u) ]

Each step is one k x k numpy operation, so n = 10,000 and k = 64 take a fraction of
a second. Forbidden choices (pins, exclusions, missing links) are +inf and never win.
"""

from __future__ import annotations

import numpy as np

__all__ = ["solve_chain"]


def solve_chain(
    node: np.ndarray,
    first: np.ndarray,
    last: np.ndarray,
    alpha: np.ndarray,
    beta: np.ndarray,
    blocked: np.ndarray,
    nbytes: np.ndarray,
) -> tuple[np.ndarray, float]:
    """Minimise sum_i node[i, a_i] + first[a_1] + last[a_n] + sum_i edge_i(a_i, a_{i+1}).

    ``nbytes[i]`` (length n-1) are the bytes between layer i and i+1, whose cost on
    pair (u, v) is ``nbytes[i] * alpha[u, v] + beta[u, v]``, or +inf where ``blocked``;
    a (n-1, k, k) ``beta`` gives each edge its own (small transfers priced apart).
    Returns (device column per layer, optimal value); the value is +inf when every
    assignment is forbidden. Ties prefer staying on the previous layer's device, then
    the lowest device index, so results are deterministic.
    """
    n, k = node.shape
    alpha = np.array(alpha, dtype=float)
    beta = np.array(beta, dtype=float)
    diag = (..., np.arange(k), np.arange(k))
    np.fill_diagonal(alpha, 0.0)
    # inf goes into beta only: nbytes * alpha must stay finite (0 * inf is NaN).
    beta[..., np.asarray(blocked, dtype=bool)] = np.inf
    beta[diag] = 0.0
    per_edge = beta.ndim == 3
    back = np.empty((max(n - 1, 0), k), dtype=np.int32)
    value = first + node[0]
    cols = np.arange(k)
    tmp = np.empty((k, k))
    for i in range(1, n):
        np.multiply(alpha, nbytes[i - 1], out=tmp)
        tmp += beta[i - 1] if per_edge else beta
        tmp += value[:, None]
        arg = tmp.argmin(axis=0)
        best = tmp[arg, cols]
        # On a tie, stay on the same device: an equal-cost detour (a zero-FLOP layer
        # hopping over a free link) is never what a user wants to see.
        stay = tmp[cols, cols] <= best
        arg[stay] = cols[stay]
        back[i - 1] = arg
        value = best + node[i]
    total = value + last
    end = int(np.argmin(total))
    best = float(total[end])
    a = np.empty(n, dtype=np.intp)
    a[-1] = end
    for i in range(n - 1, 0, -1):
        a[i - 1] = back[i - 1, a[i]]
    return a, best
