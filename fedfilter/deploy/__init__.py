"""Flower's own processes on this machine, all bound to 127.0.0.1.

- ``processes``: ``ManagedProcess`` (one child process group, logged, always stopped),
  ``free_ports``, ``tool`` (Flower's console scripts), ``flower_env`` (a process's ``FLWR_HOME``).
- ``tls``: a throw-away CA and server certificate, SuperNode authentication keys.
- ``flower_config``: flat TOML for ``--node-config``/``--run-config``, an app's run config, the
  CLI's ``[superlink.NAME]`` connection.
- ``cluster``: ``FlowerCluster``, a SuperLink (Deployment Engine with TLS and node auth, or a
  simulation SuperLink), its SuperNodes and ``flwr run ... --stream``.
- ``command``: ``deploy_local``, the ``fedfilter deploy-local`` deployment itself.
"""

from fedfilter.deploy.cluster import CONNECTION, RUN_COMPLETED, FlowerCluster, RunResult, SuperNodeHandle
from fedfilter.deploy.command import BUILTIN_APP_DIR, DeployOptions, deploy_local
from fedfilter.deploy.processes import LOOPBACK, DeploymentError, ManagedProcess, flower_env, free_ports, tool

__all__ = [
    "BUILTIN_APP_DIR",
    "CONNECTION",
    "LOOPBACK",
    "RUN_COMPLETED",
    "DeployOptions",
    "DeploymentError",
    "FlowerCluster",
    "ManagedProcess",
    "RunResult",
    "SuperNodeHandle",
    "deploy_local",
    "flower_env",
    "free_ports",
    "tool",
]
