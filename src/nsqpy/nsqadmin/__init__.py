"""nsqadmin: the web UI and JSON API over a cluster's nsqlookupd and nsqd (NSQ 1.3.0's),
with live rates and history from its own sampler (:mod:`nsqpy.nsqadmin.series`)."""

from .nsqadmin import NSQAdmin
from .options import Options

__all__ = ["NSQAdmin", "Options"]
