"""nsqlookupd: the discovery daemon (registration DB, TCP protocol V1, HTTP API)."""

from .nsqlookupd import NSQLookupd
from .options import Options

__all__ = ["NSQLookupd", "Options"]
