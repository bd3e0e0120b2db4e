"""The asyncio scheduler client, public home: ``from sessionfork.aio import AsyncClient``.

Importing it loads no RQ (the client enqueues RQ jobs with a script of its own) and no worker.
"""

from .queue.aio import AsyncClient
from .queue.requests import Variant

__all__ = ["AsyncClient", "Variant"]
