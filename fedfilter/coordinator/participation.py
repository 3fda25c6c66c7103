"""Which nodes a round asks, and how often each has been asked against what its plan paid for.

A device's plan pays for a number of asks (``planning/participation.py``); asked more often, it
spends its budget early and shrinks or stops its last updates. ``Participation`` is the plan's
part the coordinator keeps (how nodes are chosen, the asks paid for, the public seed);
``AskCounter`` applies it round after round:

* ``balanced``: the inner strategy still decides how many nodes a round asks and builds their
  messages (Flower's FedAvg samples them with ``sample_nodes``); the counter then re-addresses those
  messages to the next nodes of balanced passes (``BalancedSchedule``) over the sorted node ids the
  grid has at the first round, shuffled from the public seed. A scheduled node that is not
  connected is skipped (said in the log) and the connected node asked least so far stands in; a
  node that joins later is asked only as such a stand-in (said once). The inner strategy's messages
  must be the same for every node (FedAvg's family builds them so);
* ``uniform`` and ``every-round``: the inner strategy's own sampling, counted.

Either way every ask is counted per node id (in memory only: the public ledger keeps nothing per
node), and a node asked more often than its plan paid for is named in a WARNING with its count;
the round's public record counts such nodes (``ASKED_BEYOND_PLAN``). Nothing here binds a device:
each checks every request against its owner's policy and pays from its own budget.

Examples
--------
>>> counter = AskCounter(Participation(mode="every-round", asks_planned=1))
>>> counter.count([3, 4], round_id=1), counter.count([3], round_id=2), counter.asks
(0, 1, {3: 2, 4: 1})
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import Message

from fedfilter.checks import int_in, short_repr
from fedfilter.planning.participation import BalancedSchedule
from fedfilter.planning.strategy_plan import PARTICIPATIONS
from fedfilter.protocol.flower_api import log

__all__ = ["ASKED_BEYOND_PLAN", "AskCounter", "Participation"]

ASKED_BEYOND_PLAN = "asked-beyond-plan"  # the round record's count of nodes asked more often than planned


@dataclass(frozen=True)
class Participation:
    """How the strategy chooses the nodes it asks, and how many asks each device's plan paid for.

    Parameters
    ----------
    mode : {"balanced", "uniform", "every-round"}
        ``balanced``: balanced passes over the node ids; otherwise the inner strategy's sampling.
    asks_planned : int
        The asks each device's plan paid for (``fedfilter plan``'s ``participation.asks_planned``).
    population : int, optional
        The devices the plan counted (a grid with another number is said in the log).
    seed : int, optional
        The public seed of the balanced passes' shuffles.

    Examples
    --------
    >>> Participation("balanced", 3).problems(), Participation("sometimes", 0).problems()
    ... # doctest: +NORMALIZE_WHITESPACE
    ([], ["participation mode must be one of ('balanced', 'uniform', 'every-round'). Found 'sometimes'.",
          'participation asks_planned must be an integer >= 1. Found 0.'])
    """

    mode: str
    asks_planned: int
    population: int | None = None
    seed: int = 0

    def problems(self) -> list[str]:
        """Every bad field, named with its value (empty when valid).

        Examples
        --------
        >>> Participation("uniform", 2, population=0).problems()
        ['participation population must be an integer >= 1 or None. Found 0.']
        """
        out = []
        if self.mode not in PARTICIPATIONS:
            out.append(f"participation mode must be one of {PARTICIPATIONS}. Found {short_repr(self.mode)}.")
        if not int_in(self.asks_planned, 1, 2**62):
            out.append(f"participation asks_planned must be an integer >= 1. Found {short_repr(self.asks_planned)}.")
        if self.population is not None and not int_in(self.population, 1, 2**62):
            found = short_repr(self.population)
            out.append(f"participation population must be an integer >= 1 or None. Found {found}.")
        if not int_in(self.seed, 0, 2**63 - 1):
            out.append(f"participation seed must be an integer >= 0. Found {short_repr(self.seed)}.")
        return out

    @classmethod
    def from_plan(cls, part: Mapping[str, Any]) -> Participation:
        """The plan's ``participation`` object (``mode``, ``asks_planned``, ``population``, ``seed``).

        Parameters
        ----------
        part : mapping
            ``fedfilter plan --json``'s ``strategy.participation``.

        Examples
        --------
        >>> Participation.from_plan({"mode": "balanced", "asks_planned": 4, "population": 50, "seed": 0})
        Participation(mode='balanced', asks_planned=4, population=50, seed=0)
        """
        fields: Any = part  # checked by problems(), each field named with its value
        return cls(fields.get("mode"), fields.get("asks_planned"), fields.get("population"), fields.get("seed", 0))


class AskCounter:
    """One run's asks: the balanced passes' choice of nodes, and the count per node id against the plan.

    Parameters
    ----------
    participation : Participation
        The plan's participation.

    Examples
    --------
    >>> counter = AskCounter(Participation("balanced", asks_planned=1, seed=0))
    >>> sorted(counter.choose([5, 6, 7, 8], 2, round_id=1) + counter.choose([5, 6, 7, 8], 2, round_id=2))
    [5, 6, 7, 8]
    """

    def __init__(self, participation: Participation) -> None:
        self.participation = participation
        self.asks: dict[int, int] = {}  # node id -> times asked this run
        self._ids: list[int] | None = None  # the node ids the schedule walks (the grid's at the first round)
        self._schedule: BalancedSchedule | None = None
        self._said: set[str] = set()

    def _say_once(self, key: str, level: int, msg: str, *args: object) -> None:
        if key not in self._said:
            self._said.add(key)
            log(level, msg, *args)

    def choose(self, connected: Iterable[int], wanted: int, *, round_id: int) -> list[int]:
        """The ``wanted`` node ids this round asks (balanced passes; absent nodes skipped, stand-ins asked).

        Parameters
        ----------
        connected : iterable of int
            The node ids connected now (``grid.get_node_ids()``).
        wanted : int
            How many the round asks (the inner strategy's count).
        round_id : int
            The round, for the log.

        Examples
        --------
        >>> counter = AskCounter(Participation("balanced", asks_planned=2))
        >>> len(set(counter.choose([1, 2, 3], 3, round_id=1)))
        3
        """
        present = sorted({int(n) for n in connected})
        wanted = min(wanted, len(present))
        if wanted <= 0:
            return []
        if self._schedule is None:
            self._ids = present
            self._schedule = BalancedSchedule(len(present), wanted, np.random.default_rng(self.participation.seed))
            population = self.participation.population
            if population is not None and population != len(present):
                log(
                    WARNING,
                    "fedfilter: balanced passes over the %d nodes connected at round %d; the plan counted a "
                    "population of %d, so each is asked about %.3g times as often as planned.",
                    len(present),
                    round_id,
                    population,
                    population / len(present),
                )
        assert self._ids is not None
        if wanted != self._schedule.per_round:
            self._say_once(
                f"per-round-{wanted}",
                WARNING,
                "fedfilter: round %d asks %d nodes, the balanced passes %d: the rest are stand-ins or wait.",
                round_id,
                wanted,
                self._schedule.per_round,
            )
        scheduled = [self._ids[i] for i in self._schedule.next_round()]
        connected_now = set(present)
        chosen = [n for n in scheduled if n in connected_now][:wanted]
        absent = [n for n in scheduled if n not in connected_now]
        if absent:
            log(
                INFO,
                "fedfilter: round %d skips scheduled nodes not connected: %s (stand-ins asked).",
                round_id,
                absent,
            )
        if len(chosen) < wanted:
            taken, known = set(chosen), set(self._ids)
            for n in present:
                if n not in known:
                    self._say_once(
                        f"late-{n}",
                        INFO,
                        "fedfilter: node %d joined after the balanced passes were drawn: asked only as a stand-in.",
                        n,
                    )
            spare = sorted((n for n in present if n not in taken), key=lambda n: (self.asks.get(n, 0), n))
            chosen += spare[: wanted - len(chosen)]
        return chosen

    def address(self, messages: list[Message], connected: Iterable[int], *, round_id: int) -> list[Message]:
        """``messages`` re-addressed to the nodes ``choose`` picks (balanced mode; else as they are).

        Parameters
        ----------
        messages : list of flwr.app.Message
            The inner strategy's train messages (one per node it sampled).
        connected : iterable of int
            The node ids connected now.
        round_id : int
            The round.

        Examples
        --------
        >>> AskCounter(Participation("uniform", 3)).address([], [1, 2], round_id=1)
        []
        """
        if self.participation.mode != "balanced" or not messages:
            return messages
        nodes = self.choose(connected, len(messages), round_id=round_id)
        for msg, node in zip(messages, nodes):
            msg.metadata.dst_node_id = node
        return messages[: len(nodes)]

    def count(self, asked: Iterable[int], *, round_id: int) -> int:
        """Count one round's asks; warn for each node asked beyond its plan; return how many were.

        Parameters
        ----------
        asked : iterable of int
            The node ids the round asks.
        round_id : int
            The round, for the log.

        Examples
        --------
        >>> AskCounter(Participation("uniform", 1)).count([1, 1], round_id=1)  # asked twice: beyond a plan of one
        1
        """
        beyond = 0
        for node in asked:
            node = int(node)
            self.asks[node] = times = self.asks.get(node, 0) + 1
            if times > self.participation.asks_planned:
                beyond += 1
                log(
                    WARNING,
                    "fedfilter: round %d asks node %d for the %d-th time; its plan paid for %d asks, so its budget "
                    "may not pay for this update in full (the device shrinks or skips it; nothing is overspent).",
                    round_id,
                    node,
                    times,
                    self.participation.asks_planned,
                )
        return beyond

    def take(self, messages: list[Message], connected: Iterable[int], *, round_id: int) -> tuple[list[Message], int]:
        """``address`` then ``count``: the round's messages and how many of its nodes are asked beyond the plan.

        Parameters
        ----------
        messages : list of flwr.app.Message
            The inner strategy's train messages.
        connected : iterable of int
            The node ids connected now.
        round_id : int
            The round.

        Examples
        --------
        >>> AskCounter(Participation("uniform", 1)).take([], [1], round_id=1)
        ([], 0)
        """
        messages = self.address(messages, connected, round_id=round_id)
        return messages, self.count((m.metadata.dst_node_id for m in messages), round_id=round_id)
