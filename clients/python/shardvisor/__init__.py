"""shardvisor: routing, map reload, node pools and retries for Python apps
on a shardvisor cluster (https://github.com/shardvisor/shardvisor).

The core (this module, routing, keystream, sidecar, notify) is standard
library only. shardvisor.db needs psycopg 3 or psycopg2; shardvisor.django
and shardvisor.sqlalchemy import their frameworks when they are imported.
"""

from .context import current_user, for_user
from .notify import RequestCounter, sd_notify
from .routing import MapError, Node, Route, Router, RoutingTable
from .sidecar import SidecarClient, SidecarError

__version__ = "0.1.0"

__all__ = [
    "MapError",
    "Node",
    "RequestCounter",
    "Route",
    "Router",
    "RoutingTable",
    "SidecarClient",
    "SidecarError",
    "current_user",
    "for_user",
    "sd_notify",
]
