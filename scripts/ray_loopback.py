"""`ray start` for a worker node beside a head at 127.0.0.1 (scripts/cluster.sh), on 127.0.0.1.

Ray refuses a worker node while RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 and, with it on, resolves
127.0.0.1 to the routable address, where the head does not listen. No public switch keeps
127.0.0.1, so Ray's resolver is replaced: on the pinned Ray only."""

import os
import re
import sys
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def pinned_ray() -> str:
    return re.search(r'"ray\[[^\]]*\]==([^"]+)"', PYPROJECT.read_text()).group(1)


def resolver():
    """Ray's module whose resolve_ip_for_localhost `ray start` calls, or SystemExit in one line
    where this Ray is not the pinned one that has it (tests/test_ray_session.py checks it)."""
    import ray
    from ray._private import services

    if ray.__version__ != pinned_ray() or not callable(getattr(services, "resolve_ip_for_localhost", None)):
        raise SystemExit(
            f"scripts/ray_loopback.py: needs Ray {pinned_ray()} (pyproject.toml) with "
            f"ray._private.services.resolve_ip_for_localhost; this is Ray {ray.__version__}"
        )
    return services


if __name__ == "__main__":
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "1"  # read at ray's import
    resolver().resolve_ip_for_localhost = lambda host: host  # keep 127.0.0.1 as given
    from ray.scripts.scripts import main

    sys.exit(main())
