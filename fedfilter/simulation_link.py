"""A Flower Simulation Engine behind ``flwr run``, on 127.0.0.1, with personal budgets per device.

``flwr run APP CONNECTION`` with Flower's ``:local:`` connection spawns a SuperLink that runs
``uv sync`` (fails offline) and keeps running detached. Instead this starts its own::

    flower-superlink --insecure --simulation --disable-runtime-dependency-installation \\
        --host 127.0.0.1 --port PORT            # with its own FLWR_HOME

writes the connection to that ``FLWR_HOME/config.toml`` (``[superlink.flwrrun]``, ``insecure``),
sets the simulation's size on that SuperLink (``flwr federation simulation-config @none/default
flwrrun --num-supernodes N --client-resources-num-cpus 1``: the same ``SimulationConfig`` that
``flwr run ... --federation-config "num-supernodes=N client-resources-num-cpus=1"`` sends with one
run; here it is set once, so ``FlowerCluster.run_app`` runs ``flwr run APP flwrrun --stream``
unchanged), and runs the app against it. The ``options.`` table of a connection is deprecated in
Flower 1.41, and ``[tool.flwr.federations]`` in an app's ``pyproject.toml`` is no longer read:
``flwr run`` migrates it into ``config.toml`` and comments it out.

Simulated nodes get only ``partition-id``/``num-partitions`` from Flower. Their device settings
(ledger directory, personal budget, ...) come from a device-settings file the person running the
simulation writes (``fedfilter.client.device_settings``), named in ``FEDFILTER_DEVICE_SETTINGS``
in this process's environment: the SuperLink inherits it, and from it ``flwr-simulation`` and the
Ray workers that run the ClientApps. The coordinator's run config cannot set it.

The process handling is ``fedfilter.deploy_local``'s (``FlowerCluster``, ``ManagedProcess``): every
process started here is stopped when the context exits, also on Ctrl-C or an error.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from fedfilter.client.device_settings import ENV_VAR
from fedfilter.deploy_local import (
    LOOPBACK,
    FlowerCluster,
    ManagedProcess,
    _tool,
    free_ports,
    toml_value,
)

__all__ = ["SIMULATION_CONNECTION", "SimulationLink", "federation_options", "federation_config_arg"]

SIMULATION_CONNECTION = "flwrrun"
SIMULATION_FEDERATION = "@none/default"  # the one federation of a SuperLink without accounts
_SUPERLINK_READY = r"Uvicorn running on https?://\S+"


def federation_options(num_supernodes: int, num_cpus: int = 1) -> dict[str, Any]:
    """The simulation's size, as ``flwr run --federation-config`` keys (Flower 1.41: both ints)."""
    for key, value in (("num-supernodes", num_supernodes), ("client-resources-num-cpus", num_cpus)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{key} must be an integer >= 1. Found {value!r}.")
    return {"num-supernodes": num_supernodes, "client-resources-num-cpus": num_cpus}


def federation_config_arg(options: dict[str, Any]) -> str:
    """``options`` as the value of ``flwr run --federation-config`` (for people typing it)."""
    return " ".join(f"{key}={value}" for key, value in options.items())


class SimulationLink(FlowerCluster):
    """A SuperLink in simulation mode on 127.0.0.1 and its ``flwr`` connection; ``run_app`` as in
    ``FlowerCluster``. ``device_settings`` (a file, see ``fedfilter.client.device_settings``) is put
    in the SuperLink's environment; ``None`` leaves the environment as it is.
    """

    def __init__(
        self,
        root: Path,
        *,
        num_supernodes: int,
        num_cpus: int = 1,
        device_settings: Path | None = None,
        grace_s: float = 10.0,
        echo: Callable[[str], None] | None = None,
    ):
        super().__init__(root, connection=SIMULATION_CONNECTION, node_auth=False, grace_s=grace_s, echo=echo)
        self.options = federation_options(num_supernodes, num_cpus)
        self.device_settings = None if device_settings is None else Path(device_settings).resolve()

    def _env(self, home: Path) -> dict[str, str]:
        env = super()._env(home)
        env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # Ray on 127.0.0.1 only (FLOWER_NOTES.md)
        if self.device_settings is not None:
            env[ENV_VAR] = str(self.device_settings)
        return env

    def start(self, timeout: float = 60.0) -> None:
        """The SuperLink (simulation runtime, no TLS: loopback only) and the CLI connection."""
        self.home.mkdir(parents=True, exist_ok=True)
        (self.port,) = free_ports(1)
        argv = [
            _tool("flower-superlink"),
            "--insecure",
            "--simulation",
            "--disable-runtime-dependency-installation",
            "--host",
            LOOPBACK,
            "--port",
            str(self.port),
        ]
        self.superlink = self._track(
            ManagedProcess(
                "flower-superlink",
                argv,
                log_path=self.logs_dir / "superlink.log",
                env=self._env(self.home),
                cwd=self.home,
            )
        )
        self.superlink.wait_for_log(_SUPERLINK_READY, timeout)
        self.write_connection()
        self.configure_simulation()
        self.echo(
            f"SuperLink (simulation) listening on {self.address}, "
            f"{federation_config_arg(self.options)}; log {self.superlink.log_path}"
        )

    def configure_simulation(self) -> None:
        """The simulation's size on this SuperLink, for every run it starts."""
        args = []
        for key, value in self.options.items():
            args += [f"--{key}", str(value)]
        self._flwr_json("federation", "simulation-config", SIMULATION_FEDERATION, self.connection, *args)

    def write_connection(self) -> Path:
        """``[superlink.flwrrun]`` in ``FLWR_HOME/config.toml``: the address, no TLS (loopback)."""
        config = self.home / "config.toml"
        config.write_text(
            "[superlink]\n"
            f"default = {toml_value(self.connection)}\n\n"
            f"[superlink.{self.connection}]\n"
            f"address = {toml_value(self.address)}\n"
            "insecure = true\n",
            encoding="utf-8",
        )
        return config
