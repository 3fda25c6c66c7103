"""A Flower Simulation Engine behind ``flwr run``, on 127.0.0.1, with personal budgets per device.

``flwr run APP CONNECTION`` with Flower's ``:local:`` connection spawns a SuperLink that runs
``uv sync`` (fails offline) and keeps running detached. Instead this starts its own::

    flower-superlink --insecure --simulation --disable-runtime-dependency-installation \\
        --host 127.0.0.1 --port PORT            # with its own FLWR_HOME

writes the connection to that ``FLWR_HOME/config.toml`` (``[superlink.flwrrun]``, ``insecure``),
and runs the app against it with the simulation's size as ``flwr run ... --federation-config``
(``num-supernodes``, ``client-resources-num-cpus``; Flower 1.41 and 1.42 want both as integers).
The ``options.`` table of a connection is deprecated in
Flower 1.41 and 1.42, and ``[tool.flwr.federations]`` in an app's ``pyproject.toml`` is no longer read:
``flwr run`` migrates it into ``config.toml`` and comments it out.

Simulated nodes get only ``partition-id``/``num-partitions`` from Flower. Their device settings
(ledger directory, personal budget, ...) come from a device-settings file the person running the
simulation writes (``fedfilter.client.settings.simulated``), named in ``FEDFILTER_DEVICE_SETTINGS``
in the environment of the SuperLink started here, which ``flwr-simulation`` and the
Ray workers that run the ClientApps inherit. The coordinator's run config cannot set it.

The process handling is ``fedfilter.deploy``'s (``FlowerCluster``, ``ManagedProcess``): every
process started here is stopped when the context exits, also on Ctrl-C or an error.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from fedfilter.client.settings.simulated import ENV_VAR
from fedfilter.deploy.cluster import FlowerCluster, RunResult

__all__ = ["SIMULATION_CONNECTION", "SimulationLink", "federation_options", "federation_config_arg"]

SIMULATION_CONNECTION = "flwrrun"


def federation_options(num_supernodes: int, num_cpus: int = 1) -> dict[str, Any]:
    """The simulation's size, as ``flwr run --federation-config`` keys (Flower 1.41: both ints).

    Parameters
    ----------
    num_supernodes : int
        Simulated nodes (>= 1).
    num_cpus : int, optional
        CPUs per simulated client (>= 1).

    Returns
    -------
    dict
        ``num-supernodes`` and ``client-resources-num-cpus``.

    Raises
    ------
    ValueError
        A value that is not an integer >= 1.

    Examples
    --------
    >>> federation_options(10)
    {'num-supernodes': 10, 'client-resources-num-cpus': 1}
    """
    for key, value in (("num-supernodes", num_supernodes), ("client-resources-num-cpus", num_cpus)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{key} must be an integer >= 1. Found {value!r}.")
    return {"num-supernodes": num_supernodes, "client-resources-num-cpus": num_cpus}


def federation_config_arg(options: dict[str, Any]) -> str:
    """``options`` as the value of ``flwr run --federation-config`` (for people typing it).

    Parameters
    ----------
    options : dict
        ``federation_options``'s result.

    Returns
    -------
    str
        ``key=value`` pairs separated by spaces.

    Examples
    --------
    >>> federation_config_arg(federation_options(10))
    'num-supernodes=10 client-resources-num-cpus=1'
    """
    return " ".join(f"{key}={value}" for key, value in options.items())


class SimulationLink(FlowerCluster):
    """A SuperLink in simulation mode on 127.0.0.1 (no TLS: loopback only) and its ``flwr`` connection.

    ``run_app`` runs an app on ``num_supernodes`` simulated nodes. ``device_settings`` (a file, see
    ``fedfilter.client.settings.simulated``) is put in the SuperLink's environment; ``None`` leaves
    the environment as it is.

    Parameters
    ----------
    root : Path
        The folder for its ``FLWR_HOME``, logs and config files.
    num_supernodes : int
        Simulated nodes.
    num_cpus : int, optional
        CPUs per simulated client.
    device_settings : Path, optional
        The simulated devices' settings file.
    grace_s : float, optional
        Seconds between SIGTERM and SIGKILL when stopping.
    echo : callable, optional
        Called with a line for each event worth showing.

    Examples
    --------
    Nothing starts before the context is entered:

    >>> link = SimulationLink(Path("runs/sim"), num_supernodes=4, device_settings=Path("devices.json"))
    >>> link.options["num-supernodes"], link.superlink_environment()[ENV_VAR].endswith("devices.json")
    (4, True)

    Entering it starts the SuperLink (and Ray, for the run):

    >>> with SimulationLink(Path("runs/sim"), num_supernodes=4) as link:  # doctest: +SKIP
    ...     result = link.run_app(Path("fedfilter/app"), run_config={"num-rounds": 2})
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
        self.options = federation_options(num_supernodes, num_cpus)
        self.device_settings = None if device_settings is None else Path(device_settings).resolve()
        env = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}  # Ray on 127.0.0.1 only (FLOWER_NOTES.md)
        if self.device_settings is not None:
            env[ENV_VAR] = str(self.device_settings)
        super().__init__(
            root,
            connection=SIMULATION_CONNECTION,
            node_auth=False,
            tls=False,
            simulation=True,
            superlink_env=env,
            grace_s=grace_s,
            echo=echo,
        )

    def run_app(self, app_dir: Path, **kwargs: Any) -> RunResult:
        """``FlowerCluster.run_app`` with this simulation's size as ``--federation-config``.

        Parameters
        ----------
        app_dir : Path
            The Flower app directory.
        **kwargs
            ``FlowerCluster.run_app``'s ``run_config``, ``timeout``, ``on_line``, ``on_tick``.

        Returns
        -------
        RunResult
            The run's id, status and output.

        Examples
        --------
        >>> with SimulationLink(Path("runs/sim"), num_supernodes=4) as link:  # doctest: +SKIP
        ...     link.run_app(Path("fedfilter/app"), run_config={"num-rounds": 2}).ok
        True
        """
        return super().run_app(app_dir, federation_config=self.options, **kwargs)
