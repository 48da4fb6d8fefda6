"""`ray start` for a worker node of a cluster whose nodes all run on this machine, on
loopback (scripts/cluster.sh uses it when the head is at 127.0.0.1).

Ray refuses a worker node while RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 (the switch that keeps a
local Ray's IP on loopback), and with it on resolves 127.0.0.1 to the machine's routable
address, where the head does not listen and where the node would then bind. Here the switch
is on and 127.0.0.1 stays 127.0.0.1: the node and everything it starts use the address given.
"""

import os
import sys

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "1"

from ray._private import services  # noqa: E402

services.resolve_ip_for_localhost = lambda host: host  # keep 127.0.0.1 as given

from ray.scripts.scripts import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
