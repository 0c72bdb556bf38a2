"""nsqpy: NSQ, the realtime distributed messaging platform, in Python."""

__version__ = "0.1.0"

#: The NSQ release whose wire protocol, HTTP API and data format nsqpy follows.
#: Daemons report this as their version so tools that compare versions see a 1.3.0 peer.
NSQ_VERSION = "1.3.0"
