"""fedfilter: individual, lifelong privacy filters for the clients of a Flower federation.

The public API, as a Flower app uses it (the pair mirrors Flower's own ``fixedclipping_mod`` +
``DifferentialPrivacyClientSideFixedClipping``)::

    from fedfilter import individual_filter_mod, IndividualFilterStrategy

    client_app = ClientApp(mods=[individual_filter_mod])                 # on every device
    # distributed noise over Flower's SecAgg+: ClientApp(mods=[secure_aggregation_mod, individual_filter_mod])
    strategy = IndividualFilterStrategy(FedAvg(), noise_multiplier=1.0, clip=0.5)  # on the server

Also here: ``BudgetLedger`` (a device's durable budget), ``make_filter`` (the filters) and
``plan_rounds`` (how many rounds a budget buys). Names are imported on first use, so that
``import fedfilter`` (and ``fedfilter rounds``) does not load Flower, numpy's friends or torch.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# In a source checkout the folders that pyproject's package-dir installs as fedfilter.client,
# fedfilter.coordinator, fedfilter.protos and fedfilter.simulations sit beside this one: look for
# them there too, so that a checkout always imports its own code (a copy on PYTHONPATH, a git
# worktree, the mutation benchmark's mutated copy), never another checkout's editable install.
# An installed wheel has them inside this folder and no pyproject.toml beside it.
_checkout = Path(__file__).resolve().parent.parent
if (_checkout / "pyproject.toml").is_file() and (_checkout / "client" / "__init__.py").is_file():
    __path__.append(str(_checkout))

# name -> module that defines it
_PUBLIC = {
    "individual_filter_mod": "fedfilter.client.flower_mod",
    "enrol_device": "fedfilter.client.flower_mod",
    "secure_aggregation_mod": "fedfilter.client.secagg_device",
    "IndividualFilterStrategy": "fedfilter.coordinator.strategy",
    "BudgetLedger": "fedfilter.client.ledger",
    "make_filter": "fedfilter.client.privacy.filters",
    "plan_rounds": "fedfilter.client.privacy.planner",
}
__all__ = [
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
    from fedfilter.client.flower_mod import enrol_device, individual_filter_mod
    from fedfilter.client.ledger import BudgetLedger
    from fedfilter.client.privacy.filters import make_filter
    from fedfilter.client.privacy.planner import plan_rounds
    from fedfilter.client.secagg_device import secure_aggregation_mod
    from fedfilter.coordinator.strategy import IndividualFilterStrategy


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'fedfilter' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
