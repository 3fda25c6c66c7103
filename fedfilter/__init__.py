"""fedfilter: individual, lifelong privacy filters for the clients of a Flower federation.

The public API, as a Flower app uses it (the pair mirrors Flower's own ``fixedclipping_mod`` +
``DifferentialPrivacyClientSideFixedClipping``)::

    from fedfilter import individual_filter_mod, IndividualFilterStrategy

    client_app = ClientApp(mods=[individual_filter_mod])                 # on every device
    # distributed noise over Flower's SecAgg+: ClientApp(mods=[secure_aggregation_mod, individual_filter_mod])
    strategy = IndividualFilterStrategy(FedAvg(), noise_multiplier=1.0, clip=0.5)  # on the server

Also here: ``enrol_device`` (the one way to give a device its budget, from the owner's node-config
settings), ``BudgetLedger`` (a device's durable budget, to read it), ``make_filter`` (the filters) and
``plan_rounds`` (how many rounds a budget buys). Every name is defined in the module ``__module__``
names and imported on first use, so that ``import fedfilter`` (and ``fedfilter rounds``) loads neither
Flower, numpy nor torch. ``pip install fedfilter`` is what a device or a coordinator needs;
``fedfilter[app]`` adds torch and the demo's libraries (pyproject's extras).
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# In a source checkout the folders that pyproject's package-dir installs as fedfilter.<folder> sit
# beside this one. Map exactly those (no other folder of the checkout becomes importable: there is no
# fedfilter.tests), ahead of any installed copy, so that a checkout always imports its own code (a
# copy on PYTHONPATH, a git worktree, the mutation benchmark's mutated copy), never another
# checkout's editable install. An installed wheel has them inside this folder and no pyproject.toml
# beside it. tests/cli/test_packaging.py keeps _MAPPED equal to pyproject's package-dir.
_MAPPED = ("client", "coordinator", "privacy", "protocol", "protos", "simulations")
_checkout = Path(__file__).resolve().parent.parent
if (_checkout / "pyproject.toml").is_file() and (_checkout / "client" / "__init__.py").is_file():
    import sys
    from importlib.machinery import ModuleSpec, PathFinder
    from importlib.util import spec_from_file_location

    class _CheckoutFolders:
        """A meta-path finder for the mapped folders of this checkout (and nothing else)."""

        folders = {f"{__name__}.{name}": _checkout / name for name in _MAPPED}

        @classmethod
        def find_spec(
            cls, fullname: str, path: Sequence[str] | None = None, target: object = None
        ) -> ModuleSpec | None:
            where = cls.folders.get(fullname)
            if where is not None:
                return spec_from_file_location(fullname, where / "__init__.py", submodule_search_locations=[str(where)])
            if ".".join(fullname.split(".")[:2]) not in cls.folders or path is None:
                return None
            # A module inside a mapped folder is looked up in this checkout only: an editable install
            # of another checkout must not answer for a module this one does not have.
            spec = PathFinder.find_spec(fullname, path)
            if spec is None:
                raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
            return spec

    sys.meta_path.insert(0, _CheckoutFolders)

# name -> module that defines it (tests/cli/test_public_api.py checks each name's __module__)
_PUBLIC = {
    "individual_filter_mod": "fedfilter.client.filter_mod",
    "enrol_device": "fedfilter.client.settings.node_config",
    "secure_aggregation_mod": "fedfilter.client.secagg.mod",
    "IndividualFilterStrategy": "fedfilter.coordinator.strategy",
    "BudgetLedger": "fedfilter.client.ledger.budget",
    "make_filter": "fedfilter.privacy.filters",
    "plan_rounds": "fedfilter.privacy.planner",
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
    from fedfilter.client.filter_mod import individual_filter_mod
    from fedfilter.client.ledger.budget import BudgetLedger
    from fedfilter.client.secagg.mod import secure_aggregation_mod
    from fedfilter.client.settings.node_config import enrol_device
    from fedfilter.coordinator.strategy import IndividualFilterStrategy
    from fedfilter.privacy.filters import make_filter
    from fedfilter.privacy.planner import plan_rounds


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'fedfilter' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
