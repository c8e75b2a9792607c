"""The one way posstats' jobs join a Ray cluster (or start an embedded one)."""

from __future__ import annotations

import os
from typing import Any

from posstats.errors import PosstatsError
from posstats.processes import reinstall

__all__ = ["connect_ray"]

NICENESS_ENV = "RAY_worker_niceness"
# Ray's single-machine mode: keeps a loopback node address instead of replacing it by the
# machine's external one. cluster/local_cluster.sh runs its nodes in that mode (every
# listener on 127.0.0.1), and a driver that joins them must resolve addresses the same way.
LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
LOOPBACK = "127.0.0.1"
_LOOPBACK_HOSTS = ("127.", "localhost", "[::1]", "::1")


def _is_loopback(address: str) -> bool:
    host = address.split("://", 1)[-1]
    return host.startswith(_LOOPBACK_HOSTS)


def connect_ray(address: str | None = None, /, *, num_cpus: int | None = None, dashboard: bool | None = False) -> tuple[bool, Any]:
    """Join ``address`` (else ``$RAY_ADDRESS``), or start a local Ray for this process.

    Args:
        address: a cluster's GCS address (``HOST:PORT``) or ``ray://`` URL; None: the
            environment's ``RAY_ADDRESS``, else an embedded local Ray.
        num_cpus: CPUs of an embedded Ray (default: the machine's).
        dashboard: start the dashboard with an embedded Ray (None: Ray's default, on when
            its dependencies are installed).

    Returns:
        ``(started, context)``: whether this call started Ray (the caller then shuts it
        down), and Ray's context (None when Ray was already initialised).

    Raises:
        PosstatsError: the cluster cannot be reached, with what to check (token
            authentication, the address).
    """
    address = address or os.environ.get("RAY_ADDRESS")
    if not address or _is_loopback(address):
        # Ray reads it once, when it is imported; an embedded Ray then listens on 127.0.0.1 only
        os.environ.setdefault(LOOPBACK_ENV, "0")
    import ray

    if ray.is_initialized():
        return False, None
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if address:
        try:
            context = ray.init(address=address, namespace="posstats", log_to_driver=False)
            reinstall()  # ray.init replaced the SIGTERM handler with sys.exit
            return False, context
        except (ConnectionError, RuntimeError) as exc:
            cause = exc.__cause__ or exc
            auth = "Authentication token" in str(cause) or "InvalidAuthToken" in str(cause)
            hint = ("the cluster uses token authentication: set RAY_AUTH_MODE=token and RAY_AUTH_TOKEN "
                    "(or ~/.ray/auth_token) to its token" if auth else
                    "is the cluster running, and is the address its GCS address (HOST:6379)?")
            msg = f"cannot connect to the Ray cluster at {address}: {hint}"
            raise PosstatsError(msg) from None
    # Ray starts worker processes at niceness 15 (meant for clusters shared with
    # latency-sensitive work); on a machine shared with other programs that starves the
    # actors, which are this Ray's only workload. $RAY_worker_niceness still wins when set.
    niceness = os.environ.get(NICENESS_ENV)
    os.environ.setdefault(NICENESS_ENV, "0")
    _stay_on_loopback(ray)
    try:
        context = ray.init(address="local", namespace="posstats", log_to_driver=False, _node_ip_address=LOOPBACK,
                           include_dashboard=dashboard, num_cpus=num_cpus or os.cpu_count() or 1)
    finally:
        if niceness is None:
            os.environ.pop(NICENESS_ENV, None)
    reinstall()  # ray.init replaced the SIGTERM handler with sys.exit
    return True, context


def _stay_on_loopback(ray: Any) -> None:
    """Keep an embedded Ray on 127.0.0.1 even when Ray was imported before
    :data:`LOOPBACK_ENV` was set (Ray reads it into a constant at import): every process it
    starts inherits the variable; the driver's copy of the constant is set to match."""
    os.environ[LOOPBACK_ENV] = "0"
    constants = getattr(getattr(ray, "_private", None), "ray_constants", None)
    if constants is not None and getattr(constants, "ENABLE_RAY_CLUSTER", False):
        constants.ENABLE_RAY_CLUSTER = False
