"""The asyncio scheduler client, public home: ``from sessionfork.aio import AsyncClient``.

Importing it loads no RQ (the client enqueues RQ jobs with a script of its own) and no worker.
"""

from .clients.aio import AsyncClient
from .protocol.requests import ForkOptions, Variant

__all__ = ["AsyncClient", "ForkOptions", "Variant"]
