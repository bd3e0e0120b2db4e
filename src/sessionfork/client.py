"""The scheduler client, public home: ``from sessionfork.client import Client``.

Importing it loads the queue side's client only: no worker, no fork service.
"""

from .queue.client import Client
from .queue.requests import Variant

__all__ = ["Client", "Variant"]
