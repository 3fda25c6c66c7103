"""Groups of clients for the disparate-impact view of a dropout study.

Individual filters let each client stop on its own, so whoever spends fastest (large updates,
small budgets) leaves first, and the model may then forget what those clients held. DP training
is already known to cost under-represented and harder groups more accuracy (Bagdasaryan,
Poursaeed and Shmatikov, "Differential Privacy Has Disparate Impact on Model Accuracy",
NeurIPS 2019, arXiv 1905.12101); a study should show whether individual drop-out adds to it.

Two groupings, each a ``(n_clients, n_groups)`` weight matrix ``W``: a group's share "still
contributing" is ``sum_i W[i, g] alive_i / sum_i W[i, g]``.

* ``label`` (IID / Dirichlet splits of a labelled data set): group = class; ``W[i, c]`` = client
  ``i``'s training examples of class ``c``. So the share is the share of class ``c``'s training data
  held by clients that can still contribute. The group's accuracy is the test accuracy on class ``c``
  (the engine's ``group_by="label"``).
* ``size`` (natural splits: FEMNIST writers, Shakespeare roles): group = quartile of the number of
  training examples (writers with little data vs much); ``W[i, g]`` = 1 for its quartile. The group's
  accuracy is the example-weighted mean of its clients' accuracy on their own training data (the
  engine's ``group_by="client"``: an oracle statistic the coordinator never sees).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Grouping:
    kind: str  # label | size
    names: list[str]
    weights: np.ndarray  # (n_clients, n_groups)
    sizes: np.ndarray  # (n_clients,) training examples per client

    @property
    def engine_group_by(self) -> str:
        return "label" if self.kind == "label" else "client"

    def share(self, alive: np.ndarray) -> np.ndarray:
        """Per group: the weighted share of clients in ``alive`` (bool per client)."""
        total = self.weights.sum(axis=0)
        return (alive.astype(np.float64) @ self.weights) / np.where(total > 0, total, 1.0)

    def accuracy(self, group_accuracy: dict[str, float] | None, client_ids: list[str]) -> dict[str, float] | None:
        """Per group accuracy from the engine's ``group_accuracy`` of one evaluation."""
        if group_accuracy is None:
            return None
        if self.kind == "label":
            return {g: float(group_accuracy[g]) for g in self.names if g in group_accuracy}
        acc = np.array([group_accuracy.get(c, np.nan) for c in client_ids], dtype=np.float64)
        out = {}
        for j, g in enumerate(self.names):
            w = self.weights[:, j] * self.sizes
            ok = (w > 0) & np.isfinite(acc)
            out[g] = float(np.sum(w[ok] * acc[ok]) / np.sum(w[ok])) if ok.any() else float("nan")
        return out

    def exhaustion_summary(self, exhausted_round: np.ndarray, rounds: int) -> dict[str, dict]:
        """Per group: first and (weighted) median round its clients ran out; None = not within ``rounds``."""
        r = np.where(exhausted_round > 0, exhausted_round, np.inf).astype(np.float64)
        out = {}
        for j, g in enumerate(self.names):
            w = self.weights[:, j]
            sel = w > 0
            first = float(r[sel].min()) if sel.any() else np.inf
            order = np.argsort(r[sel], kind="stable")
            cum = np.cumsum(w[sel][order])
            median = float(r[sel][order][np.searchsorted(cum, cum[-1] / 2)]) if sel.any() else np.inf
            out[g] = {
                "first_exhausted_round": None if not np.isfinite(first) else int(first),
                "median_exhausted_round": None if not np.isfinite(median) else int(median),
                "weight": float(w.sum()),
                "clients": int(sel.sum()),
            }
        return out


def make_grouping(
    kind: str, train_data: list[tuple[np.ndarray, np.ndarray]], num_classes: int, full_sizes=None
) -> Grouping:
    """The grouping ``kind`` (``label`` or ``size``) of a task's clients.

    ``full_sizes``: each client's number of training examples before any cap on what the study
    trains on (``max_examples_per_client``); the ``size`` quartiles are of these, since a writer's
    volume of data is what characterises it.
    """
    sizes = np.array([len(y) for _, y in train_data], dtype=np.float64)
    volume = sizes if full_sizes is None else np.asarray(full_sizes, dtype=np.float64)
    if kind == "label":
        w = np.zeros((len(train_data), num_classes))
        for i, (_, y) in enumerate(train_data):
            w[i] = np.bincount(np.asarray(y, dtype=np.int64), minlength=num_classes)[:num_classes]
        keep = w.sum(axis=0) > 0
        names = [str(c) for c in range(num_classes) if keep[c]]
        return Grouping("label", names, w[:, keep], sizes)
    if kind != "size":
        raise ValueError(f"grouping must be 'label' or 'size'. Found {kind!r}.")
    n_groups = int(min(4, len(np.unique(volume))))
    edges = np.quantile(volume, np.linspace(0, 1, n_groups + 1)[1:-1]) if n_groups > 1 else np.array([])
    which = np.searchsorted(edges, volume, side="right")
    names, cols = [], []
    for g in range(n_groups):
        sel = which == g
        if not sel.any():
            continue
        names.append(f"Q{g + 1} ({int(volume[sel].min())}-{int(volume[sel].max())} examples)")
        cols.append(sel.astype(np.float64))
    return Grouping("size", names, np.stack(cols, axis=1), sizes)
