"""The fixtures the core tests share: the 3-master cluster (``cluster_fixtures``: ``cluster``,
``cluster_client``, ``cluster_registry``, and the queue server, cluster worker and client beside it:
``queue_server``, ``cluster_worker``, ``queue_client``) and the process races' (``racing``: ``ctx``,
``spawned``). A test module's own fixture of the same name overrides them.
"""

from cluster_fixtures import cluster_client_fixture as cluster_client_fixture
from cluster_fixtures import cluster_fixture as cluster_fixture
from cluster_fixtures import cluster_registry_fixture as cluster_registry_fixture
from cluster_fixtures import cluster_worker_fixture as cluster_worker_fixture
from cluster_fixtures import queue_client_fixture as queue_client_fixture
from cluster_fixtures import queue_server_fixture as queue_server_fixture
from racing import ctx_fixture as ctx_fixture
from racing import spawned_fixture as spawned_fixture
