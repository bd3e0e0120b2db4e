"""The ``sessionfork`` command line: the click group (``app``) and its commands, one module per family.

An entry point: the only package that reads ``os.environ``.
"""

from __future__ import annotations

import logging
import os

from . import admin, bundle_commands, merge_commands, queue_commands, session_commands
from .app import cli

__all__ = ["cli", "main"]
# Importing them registers their commands on ``cli``.
_COMMANDS = (admin, bundle_commands, merge_commands, queue_commands, session_commands)


def main() -> None:
    """Console entry point: settings from the process environment."""

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cli(obj=dict(os.environ), prog_name="sessionfork")


