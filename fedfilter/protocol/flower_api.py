"""Every name fedfilter takes from Flower's internals, in one place, so a Flower upgrade is one file.

Flower's documented app API (``flwr.app``, ``flwr.clientapp``, ``flwr.serverapp``,
``flwr.serverapp.strategy``) is imported directly where it is used. Everything else (the SecAgg+
constants and workflow, the legacy ``flwr.common``/``flwr.server`` types, the SuperNode runtime,
``flwr.cli``, loggers and constants) moves between releases without notice, so the rest of the
package imports it from here: ``from fedfilter.protocol.flower_api import ErrorCode``.

A name resolves on first use (module ``__getattr__``), from the first of its known locations that
imports: the place it has in Flower 1.41/1.42, then where Flower 1.43 moves it (its legacy and
compatibility code goes to ``flwr.compat``). Importing this module loads no Flower module, and a
name loads only the Flower module it lives in, so imports that are lazy (inside a function) stay
as cheap as they were. The ``TYPE_CHECKING`` block names the same first locations for mypy; a test
holds the two lists equal.

Examples
--------
>>> from fedfilter.protocol import flower_api
>>> flower_api.ErrorCode.__name__
'ErrorCode'
>>> flower_api.LOCATIONS["LegacyStrategy"][0]
('flwr.server.strategy', 'Strategy')
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Export name -> the places it may live, (module, attribute), tried in order.
LOCATIONS: dict[str, tuple[tuple[str, str], ...]] = {
    # Message types and the default message lifetime (also exported by flwr.app).
    "DEFAULT_TTL": (("flwr.app.constants", "DEFAULT_TTL"), ("flwr.app", "DEFAULT_TTL")),
    "MessageType": (("flwr.app.message_type", "MessageType"), ("flwr.app", "MessageType")),
    # Constants, logging and configuration.
    "ErrorCode": (("flwr.common.constant", "ErrorCode"),),
    "SType": (("flwr.common.constant", "SType"),),
    "SubStatus": (("flwr.common.constant", "SubStatus"),),
    "FLOWER_LOGGER": (("flwr.common.logger", "FLOWER_LOGGER"),),
    "log": (("flwr.common.logger", "log"),),
    "get_flwr_home": (("flwr.common.config", "get_flwr_home"),),
    "parse_config_args": (("flwr.common.config", "parse_config_args"),),
    "message_to_proto": (("flwr.common.serde", "message_to_proto"),),
    # The log lines Flower's Strategy.start prints first (the strategy's own loop repeats them).
    "log_strategy_start_info": (("flwr.serverapp.strategy.strategy_utils", "log_strategy_start_info"),),
    # SecAgg+: the record keys and stages both sides share, the device's mod, the coordinator's workflow.
    "Key": (("flwr.common.secure_aggregation.secaggplus_constants", "Key"),),
    "RECORD_KEY_CONFIGS": (("flwr.common.secure_aggregation.secaggplus_constants", "RECORD_KEY_CONFIGS"),),
    "RECORD_KEY_STATE": (("flwr.common.secure_aggregation.secaggplus_constants", "RECORD_KEY_STATE"),),
    "Stage": (("flwr.common.secure_aggregation.secaggplus_constants", "Stage"),),
    "share_keys_plaintext_separate": (
        ("flwr.common.secure_aggregation.secaggplus_utils", "share_keys_plaintext_separate"),
    ),
    "secaggplus_mod": (("flwr.client.mod", "secaggplus_mod"), ("flwr.clientapp.mod", "secaggplus_mod")),
    "SecAggPlusState": (
        ("flwr.client.mod.secure_aggregation.secaggplus_mod", "SecAggPlusState"),
        ("flwr.clientapp.mod.secure_aggregation.secaggplus_mod", "SecAggPlusState"),
    ),
    "SecAggPlusWorkflow": (
        ("flwr.server.workflow", "SecAggPlusWorkflow"),
        ("flwr.compat.server.workflow", "SecAggPlusWorkflow"),
    ),
    "WorkflowState": (
        ("flwr.server.workflow.secure_aggregation.secaggplus_workflow", "WorkflowState"),
        ("flwr.compat.server.workflow.secure_aggregation.secaggplus_workflow", "WorkflowState"),
    ),
    # Legacy (pre-Message) types the SecAgg+ workflow still speaks.
    "Code": (("flwr.common", "Code"), ("flwr.compat.common.typing", "Code")),
    "FitIns": (("flwr.common", "FitIns"), ("flwr.compat.common.typing", "FitIns")),
    "FitRes": (("flwr.common", "FitRes"), ("flwr.compat.common.typing", "FitRes")),
    "Parameters": (("flwr.common", "Parameters"), ("flwr.compat.common.typing", "Parameters")),
    "Status": (("flwr.common", "Status"), ("flwr.compat.common.typing", "Status")),
    "ndarrays_to_parameters": (
        ("flwr.common", "ndarrays_to_parameters"),
        ("flwr.compat.common.parameter", "ndarrays_to_parameters"),
    ),
    "parameters_to_ndarrays": (
        ("flwr.common", "parameters_to_ndarrays"),
        ("flwr.compat.common.parameter", "parameters_to_ndarrays"),
    ),
    "fitres_to_recorddict": (
        ("flwr.compat.common.recorddict_compat", "fitres_to_recorddict"),
        ("flwr.common.recorddict_compat", "fitres_to_recorddict"),
    ),
    "LegacyContext": (("flwr.server", "LegacyContext"), ("flwr.compat.server", "LegacyContext")),
    "ServerConfig": (("flwr.server", "ServerConfig"), ("flwr.compat.server", "ServerConfig")),
    "ClientManager": (
        ("flwr.server.client_manager", "ClientManager"),
        ("flwr.compat.server.client_manager", "ClientManager"),
    ),
    "ClientProxy": (
        ("flwr.server.client_proxy", "ClientProxy"),
        ("flwr.compat.server.client_proxy", "ClientProxy"),
    ),
    "GridClientProxy": (
        ("flwr.server.compat.grid_client_proxy", "GridClientProxy"),
        ("flwr.compat.server.grid_client_proxy", "GridClientProxy"),
    ),
    "LegacyStrategy": (("flwr.server.strategy", "Strategy"), ("flwr.compat.server.strategy", "Strategy")),
    # The SuperNode runtime a device runs its ClientApp in (Fleet API over HTTP).
    "build_fab_from_disk": (("flwr.cli.build", "build_fab_from_disk"),),
    "install_from_fab": (("flwr.cli.install", "install_from_fab"),),
    "get_load_client_app_fn": (("flwr.clientapp.utils", "get_load_client_app_fn"),),
    "AcquireTaskRequest": (("flwr.proto.runtime_pb2", "AcquireTaskRequest"),),
    "start_parent_process_monitor": (("flwr.supercore.app_utils", "start_parent_process_monitor"),),
    "SUPERNODE_UVICORN_DEFAULT_PORT": (("flwr.supercore.constant", "SUPERNODE_UVICORN_DEFAULT_PORT"),),
    "TaskType": (("flwr.supercore.constant", "TaskType"),),
    "UVICORN_DEFAULT_HOST": (("flwr.supercore.constant", "UVICORN_DEFAULT_HOST"),),
    "HeartbeatSender": (("flwr.supercore.heartbeat", "HeartbeatSender"),),
    "make_task_heartbeat_fn_http": (("flwr.supercore.heartbeat", "make_task_heartbeat_fn_http"),),
    "RuntimeTokenHttpInterceptor": (("flwr.supercore.interceptors", "RuntimeTokenHttpInterceptor"),),
    "RuntimeVersionHttpInterceptor": (("flwr.supercore.interceptors", "RuntimeVersionHttpInterceptor"),),
    "SuperExecAuthHttpInterceptor": (("flwr.supercore.interceptors", "SuperExecAuthHttpInterceptor"),),
    "make_simple_http_retry_invoker": (("flwr.supercore.retry", "make_simple_http_retry_invoker"),),
    "RuntimeHttpClient": (("flwr.supercore.runtime", "RuntimeHttpClient"),),
    "validate_and_resolve_root_certificates": (("flwr.supercore.tls", "validate_and_resolve_root_certificates"),),
    "pull_task_input": (("flwr.supernode.runtime.run_clientapp", "pull_task_input"),),
    "push_message": (("flwr.supernode.runtime.run_clientapp", "push_message"),),
    "push_task_output": (("flwr.supernode.runtime.run_clientapp", "push_task_output"),),
}


def resolve(name: str) -> Any:
    """The Flower object exported here as ``name``, from the first of its locations that imports.

    Parameters
    ----------
    name : str
        A key of ``LOCATIONS``.

    Returns
    -------
    Any
        The object (class, function, constant) Flower defines there.

    Raises
    ------
    AttributeError
        ``name`` is not a Flower name this module exports.
    ImportError
        No location holds it in the installed Flower (the message names the version and the name).

    Examples
    --------
    >>> resolve("RECORD_KEY_CONFIGS") == resolve("RECORD_KEY_CONFIGS")
    True
    >>> resolve("no_such_name")
    Traceback (most recent call last):
    ...
    AttributeError: fedfilter.protocol.flower_api exports no Flower name 'no_such_name'
    """
    try:
        locations = LOCATIONS[name]
    except KeyError:
        raise AttributeError(f"{__name__} exports no Flower name {name!r}") from None
    last_error: Exception | None = None
    for module_name, attribute in locations:
        try:
            value = getattr(importlib.import_module(module_name), attribute)
        except (ImportError, AttributeError) as error:
            last_error = error
            continue
        # Not cached here: each import reads Flower's module as it is then, as a direct import would
        # (tests replace Flower's functions on its modules; Python caches the modules themselves).
        return value
    raise ImportError(
        f"Flower {_installed_flower_version()} has no {name!r} at any location fedfilter knows "
        f"({', '.join(f'{module}.{attribute}' for module, attribute in locations)}): "
        f"add its new location to {__name__}.LOCATIONS."
    ) from last_error


def _installed_flower_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("flwr")
    except PackageNotFoundError:
        return "(not installed)"


if not TYPE_CHECKING:  # hidden from mypy, which then refuses a name this module does not export

    def __getattr__(name: str) -> Any:
        # PEP 562: `from fedfilter.protocol.flower_api import X` resolves X here, on first use.
        if name.startswith("__"):
            raise AttributeError(name)
        return resolve(name)

    def __dir__() -> list[str]:
        return sorted({*globals(), *LOCATIONS})


if TYPE_CHECKING:  # the first location of each name in LOCATIONS (a test holds them equal)
    from flwr.app.constants import DEFAULT_TTL as DEFAULT_TTL
    from flwr.app.message_type import MessageType as MessageType
    from flwr.cli.build import build_fab_from_disk as build_fab_from_disk
    from flwr.cli.install import install_from_fab as install_from_fab
    from flwr.client.mod import secaggplus_mod as secaggplus_mod
    from flwr.client.mod.secure_aggregation.secaggplus_mod import SecAggPlusState as SecAggPlusState
    from flwr.clientapp.utils import get_load_client_app_fn as get_load_client_app_fn
    from flwr.common import Code as Code
    from flwr.common import FitIns as FitIns
    from flwr.common import FitRes as FitRes
    from flwr.common import Parameters as Parameters
    from flwr.common import Status as Status
    from flwr.common import ndarrays_to_parameters as ndarrays_to_parameters
    from flwr.common import parameters_to_ndarrays as parameters_to_ndarrays
    from flwr.common.config import get_flwr_home as get_flwr_home
    from flwr.common.config import parse_config_args as parse_config_args
    from flwr.common.constant import ErrorCode as ErrorCode
    from flwr.common.constant import SType as SType
    from flwr.common.constant import SubStatus as SubStatus
    from flwr.common.logger import FLOWER_LOGGER as FLOWER_LOGGER
    from flwr.common.logger import log as log
    from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS as RECORD_KEY_CONFIGS
    from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_STATE as RECORD_KEY_STATE
    from flwr.common.secure_aggregation.secaggplus_constants import Key as Key
    from flwr.common.secure_aggregation.secaggplus_constants import Stage as Stage
    from flwr.common.secure_aggregation.secaggplus_utils import (
        share_keys_plaintext_separate as share_keys_plaintext_separate,
    )
    from flwr.common.serde import message_to_proto as message_to_proto
    from flwr.compat.common.recorddict_compat import fitres_to_recorddict as fitres_to_recorddict
    from flwr.proto.runtime_pb2 import AcquireTaskRequest as AcquireTaskRequest
    from flwr.server import LegacyContext as LegacyContext
    from flwr.server import ServerConfig as ServerConfig
    from flwr.server.client_manager import ClientManager as ClientManager
    from flwr.server.client_proxy import ClientProxy as ClientProxy
    from flwr.server.compat.grid_client_proxy import GridClientProxy as GridClientProxy
    from flwr.server.strategy import Strategy as LegacyStrategy  # noqa: F401 (exported under this name)
    from flwr.server.workflow import SecAggPlusWorkflow as SecAggPlusWorkflow
    from flwr.server.workflow.secure_aggregation.secaggplus_workflow import WorkflowState as WorkflowState
    from flwr.serverapp.strategy.strategy_utils import log_strategy_start_info as log_strategy_start_info
    from flwr.supercore.app_utils import start_parent_process_monitor as start_parent_process_monitor
    from flwr.supercore.constant import SUPERNODE_UVICORN_DEFAULT_PORT as SUPERNODE_UVICORN_DEFAULT_PORT
    from flwr.supercore.constant import UVICORN_DEFAULT_HOST as UVICORN_DEFAULT_HOST
    from flwr.supercore.constant import TaskType as TaskType
    from flwr.supercore.heartbeat import HeartbeatSender as HeartbeatSender
    from flwr.supercore.heartbeat import make_task_heartbeat_fn_http as make_task_heartbeat_fn_http
    from flwr.supercore.interceptors import RuntimeTokenHttpInterceptor as RuntimeTokenHttpInterceptor
    from flwr.supercore.interceptors import RuntimeVersionHttpInterceptor as RuntimeVersionHttpInterceptor
    from flwr.supercore.interceptors import SuperExecAuthHttpInterceptor as SuperExecAuthHttpInterceptor
    from flwr.supercore.retry import make_simple_http_retry_invoker as make_simple_http_retry_invoker
    from flwr.supercore.runtime import RuntimeHttpClient as RuntimeHttpClient
    from flwr.supercore.tls import validate_and_resolve_root_certificates as validate_and_resolve_root_certificates
    from flwr.supernode.runtime.run_clientapp import pull_task_input as pull_task_input
    from flwr.supernode.runtime.run_clientapp import push_message as push_message
    from flwr.supernode.runtime.run_clientapp import push_task_output as push_task_output
