"""``python -m worker``: the worker process entry (Procfile ``worker:``), same as ``sessionfork worker``.

Settings come from the environment (REDIS_URL, SESSIONFORK_*); extra arguments go to the worker.
"""

import sys

from sessionfork.cli import main

sys.argv = ["sessionfork", "worker", *sys.argv[1:]]
main()
