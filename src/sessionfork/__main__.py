"""``python -m sessionfork``: the CLI."""

from .cli import main

main()
