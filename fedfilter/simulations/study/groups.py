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
    """Groups of a task's clients, as a weight matrix (see the module docstring).

    Parameters
    ----------
    kind : str
        ``label`` (a group per class) or ``size`` (a group per quartile of data size).
    names : list of str
        The groups' names, one per column of ``weights``.
    weights : numpy.ndarray
        ``(n_clients, n_groups)``: client ``i``'s weight in group ``g``.
    sizes : numpy.ndarray
        ``(n_clients,)``: each client's training examples.

    Examples
    --------
    >>> g = make_grouping("label", [(None, np.array([0, 0, 1])), (None, np.array([1]))], num_classes=2)
    >>> g.names, g.weights.tolist()
    (['0', '1'], [[2.0, 1.0], [0.0, 1.0]])
    """

    kind: str  # label | size
    names: list[str]
    weights: np.ndarray  # (n_clients, n_groups)
    sizes: np.ndarray  # (n_clients,) training examples per client

    @property
    def engine_group_by(self) -> str:
        """The engine's ``group_by`` for this grouping: ``label``, or ``client`` for size groups.

        Returns
        -------
        str
            ``label`` or ``client``.

        Examples
        --------
        >>> make_grouping("size", [(None, np.zeros(3)), (None, np.zeros(9))], num_classes=2).engine_group_by
        'client'
        """
        return "label" if self.kind == "label" else "client"

    def share(self, alive: np.ndarray) -> np.ndarray:
        """Per group: the weighted share of clients in ``alive`` (bool per client).

        Parameters
        ----------
        alive : numpy.ndarray of bool
            Per client, whether it can still contribute.

        Returns
        -------
        numpy.ndarray
            One share in [0, 1] per group.

        Examples
        --------
        >>> g = make_grouping("label", [(None, np.array([0, 0, 1])), (None, np.array([1]))], num_classes=2)
        >>> g.share(np.array([False, True])).tolist()  # class 0 only on client 0; class 1 half on each
        [0.0, 0.5]
        """
        total = self.weights.sum(axis=0)
        return (alive.astype(np.float64) @ self.weights) / np.where(total > 0, total, 1.0)

    def accuracy(self, group_accuracy: dict[str, float] | None, client_ids: list[str]) -> dict[str, float] | None:
        """Per group accuracy from the engine's ``group_accuracy`` of one evaluation.

        Label groups take the engine's per-class accuracy; size groups the example-weighted mean of
        their clients' accuracy.

        Parameters
        ----------
        group_accuracy : dict of str to float, or None
            The engine's per-class (``label``) or per-client (``client``) accuracy.
        client_ids : list of str
            The clients' ids, in the order of the weight matrix's rows.

        Returns
        -------
        dict of str to float, or None
            Group name -> accuracy; None when ``group_accuracy`` is.

        Examples
        --------
        >>> g = make_grouping("size", [(None, np.zeros(1)), (None, np.zeros(3))], num_classes=2)
        >>> g.accuracy({"a": 1.0, "b": 0.5}, ["a", "b"])
        {'Q1 (1-1 examples)': 1.0, 'Q2 (3-3 examples)': 0.5}
        """
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
        """Per group: first and (weighted) median round its clients ran out; None = not within ``rounds``.

        Parameters
        ----------
        exhausted_round : numpy.ndarray
            Per client, the round it ran out (0: it did not).
        rounds : int
            The run's rounds.

        Returns
        -------
        dict of str to dict
            Group name -> ``first_exhausted_round``, ``median_exhausted_round``, ``weight``, ``clients``.

        Examples
        --------
        >>> g = make_grouping("label", [(None, np.array([0, 0, 1])), (None, np.array([1]))], num_classes=2)
        >>> g.exhaustion_summary(np.array([3, 0]), rounds=5)["0"]
        {'first_exhausted_round': 3, 'median_exhausted_round': 3, 'weight': 2.0, 'clients': 1}
        """
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

    Parameters
    ----------
    kind : str
        ``label`` or ``size``.
    train_data : list of (x, y)
        Each client's training data (only the labels ``y`` are read).
    num_classes : int
        The task's classes (``label``; classes no client holds are left out).
    full_sizes : array_like, optional
        Each client's number of training examples before any cap on what the study trains on
        (``max_examples_per_client``); the ``size`` quartiles are of these, since a writer's volume of
        data is what characterises it.

    Returns
    -------
    Grouping
        The grouping.

    Raises
    ------
    ValueError
        ``kind`` is neither.

    Examples
    --------
    >>> data = [(None, np.zeros(n)) for n in (1, 2, 3, 4)]
    >>> make_grouping("size", data, num_classes=2).names
    ['Q1 (1-1 examples)', 'Q2 (2-2 examples)', 'Q3 (3-3 examples)', 'Q4 (4-4 examples)']
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
