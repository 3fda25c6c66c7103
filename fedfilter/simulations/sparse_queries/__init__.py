"""Sparse linear queries under individual filters (Feldman & Zrnic (2021) Theorem 1.2, Corollary 4.7).

``simulate(SparseQueryConfig(...))`` runs a continual-monitoring simulation twice on the same users:
worst-case accounting (every user pays every day) and the individual filter (users pay only on the
days they are active). ``plots.plot_result`` draws it; ``benchmarks/sparse_queries.py`` prints the
comparison table.
"""

from .simulate import (
    SparseQueryConfig,
    SparseQueryResult,
    exact_exceed_probability,
    gaussian_bound,
    kappa_of,
    noise_for_sparsity,
    simulate,
    theorem_bound,
)

__all__ = [
    "SparseQueryConfig",
    "SparseQueryResult",
    "exact_exceed_probability",
    "gaussian_bound",
    "kappa_of",
    "noise_for_sparsity",
    "simulate",
    "theorem_bound",
]
