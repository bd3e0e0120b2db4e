"""The fixtures the command line tests share: one worker process per module with its client and a
source (``worker_fixtures``: ``worker``, ``client``, ``source``). A test module's own fixture of the
same name overrides them.
"""

from worker_fixtures import client_fixture as client_fixture
from worker_fixtures import source_fixture as source_fixture
from worker_fixtures import worker_fixture as worker_fixture
