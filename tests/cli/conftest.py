"""The fixtures the command line tests share: one worker process per module with its client and a
source (``worker_fixtures``: ``worker``, ``client``, ``source``). A test module's own fixture of the
same name overrides them.
"""

from cluster_fixtures import cluster_client_fixture as cluster_client_fixture
from cluster_fixtures import cluster_fixture as cluster_fixture
from cluster_fixtures import cluster_registry_fixture as cluster_registry_fixture
from worker_fixtures import client_fixture as client_fixture
from worker_fixtures import source_fixture as source_fixture
from worker_fixtures import worker_fixture as worker_fixture
