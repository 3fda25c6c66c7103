"""fedfilter: individual, lifelong privacy filters for the clients of a Flower federation.

The public API, as a Flower app uses it (the pair mirrors Flower's own ``fixedclipping_mod`` +
``DifferentialPrivacyClientSideFixedClipping``)::

    from fedfilter import individual_filter_mod, IndividualFilterStrategy

    client_app = ClientApp(mods=[individual_filter_mod])                 # on every device
    # distributed noise over Flower's SecAgg+: ClientApp(mods=[secure_aggregation_mod, individual_filter_mod])
    strategy = IndividualFilterStrategy(FedAvg(), noise_multiplier=1.0, clip=0.5)  # on the server

Also here: ``enrol_device`` (the one way to give a device its budget, from the owner's node-config
settings), ``BudgetLedger`` (a device's durable budget, to read it), ``make_filter`` (the filters),
``plan_rounds`` (how many rounds a budget buys) and ``AdaptiveClipping`` (the strategy's
``adaptive_clipping=``: the clip follows a quantile of the update norms, each device paying for its
bit). Every name is defined in the module ``__module__``
names and imported on first use, so that ``import fedfilter`` (and ``fedfilter rounds``) loads neither
Flower, numpy nor torch. ``pip install fedfilter`` is what a device or a coordinator needs;
``fedfilter[app]`` adds torch and the demo's libraries (pyproject's extras).

Examples
--------
How many full-clip rounds a device with budget (epsilon, delta) = (4, 1e-5) gets at noise
multiplier 10, and its filter admitting the first:

>>> import fedfilter
>>> fedfilter.plan_rounds("gdp", epsilon=4.0, delta=1e-5, noise_multiplier=10.0).rounds
85
>>> filt = fedfilter.make_filter("gdp", 4.0, 1e-5)
>>> bool(filt.admits(filt.initial_state(), filt.charge(sensitivity=1.0, noise_std=10.0)))
True
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# name -> module that defines it (tests/test_public_api.py checks each name's __module__)
_PUBLIC = {
    "individual_filter_mod": "fedfilter.client.filter_mod",
    "enrol_device": "fedfilter.client.settings.node_config",
    "secure_aggregation_mod": "fedfilter.client.secagg.mod",
    "IndividualFilterStrategy": "fedfilter.coordinator.strategy",
    "BudgetLedger": "fedfilter.client.ledger.budget",
    "make_filter": "fedfilter.privacy.filters",
    "plan_rounds": "fedfilter.planning.rounds",
    "AdaptiveClipping": "fedfilter.protocol.adaptive_clip",
}
__all__ = [
    "AdaptiveClipping",
    "BudgetLedger",
    "IndividualFilterStrategy",
    "enrol_device",
    "individual_filter_mod",
    "make_filter",
    "plan_rounds",
    "secure_aggregation_mod",
    "__version__",
]

if TYPE_CHECKING:
    from fedfilter.client.filter_mod import individual_filter_mod
    from fedfilter.client.ledger.budget import BudgetLedger
    from fedfilter.client.secagg.mod import secure_aggregation_mod
    from fedfilter.client.settings.node_config import enrol_device
    from fedfilter.coordinator.strategy import IndividualFilterStrategy
    from fedfilter.planning.rounds import plan_rounds
    from fedfilter.privacy.filters import make_filter
    from fedfilter.protocol.adaptive_clip import AdaptiveClipping


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'fedfilter' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
