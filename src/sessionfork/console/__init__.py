"""``sessionfork console``: the operators' web app (the ``[console]`` extra: Starlette, Jinja2, uvicorn).

Live outcomes of every shard, search by request or session id, workers and queue depth per shard,
and pause and resume of a shard's queue (with the token; audited). ``app.create_app`` builds the
ASGI app from a ``app.Console``; ``reads`` holds what it reads. Imported only by the CLI's
``console`` command: ``sessionfork`` runs without the extra. ``feed`` is the live views' one
reader of the outcome streams.
"""

from .app import Console, create_app

__all__ = ["Console", "create_app"]
