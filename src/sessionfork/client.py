"""The scheduler client, public home: ``from sessionfork.client import Client``.

Importing it loads the queue side's client only: no worker, no fork service.
"""

from .clients.client import Client
from .protocol.requests import ForkOptions, Variant

__all__ = ["Client", "ForkOptions", "Variant"]
