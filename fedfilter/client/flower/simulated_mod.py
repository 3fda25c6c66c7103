"""The Simulation Engine's stand-in for ``--node-config``: a mod that gives each simulated node its settings."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flwr.app import Context, Message


def simulated_device_config_mod(devices: Mapping[int, Mapping[str, Any]]):
    """A mod that gives each simulated node its device settings, keyed by ``partition-id``.

    The Simulation Engine has no ``--node-config``: this stands in for it. It runs inside the
    ClientApp (on the "device"), before ``individual_filter_mod``; the coordinator never sees it.
    Keys already in ``context.node_config`` win.

    Parameters
    ----------
    devices : mapping of int to mapping
        Each simulated node's settings, keyed by its ``partition-id``.

    Returns
    -------
    callable
        The mod; it passes a ``Context`` with the merged ``node_config`` to the next handler.

    Examples
    --------
    >>> from flwr.app import RecordDict
    >>> mod = simulated_device_config_mod({0: {"budget-epsilon": 4.0}})
    >>> ctx = Context(run_id=1, node_id=7, node_config={"partition-id": 0}, state=RecordDict(), run_config={})
    >>> mod("msg", ctx, lambda msg, context: context.node_config)
    {'budget-epsilon': 4.0, 'partition-id': 0}
    """
    table = {int(k): dict(v) for k, v in devices.items()}

    def mod(msg: Message, context: Context, call_next):
        extra = table.get(int(context.node_config.get("partition-id", -1)), {})
        merged = Context(
            run_id=context.run_id,
            node_id=context.node_id,
            node_config={**extra, **context.node_config},
            state=context.state,
            run_config=context.run_config,
            series_id=getattr(context, "series_id", 0),
        )
        return call_next(msg, merged)

    return mod
