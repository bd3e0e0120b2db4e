"""The fixtures the worker tests share: one worker process per module with its client and a source
(``worker_fixtures``: ``worker``, ``client``, ``source``), a server and processes per fault test
(``fault_fixtures``: ``own_server``, ``rds``, ``procs``) and the 3-master cluster with a queue server
and a cluster worker beside it (``cluster_fixtures``: ``cluster``, ``cluster_client``,
``cluster_registry``, ``queue_server``, ``cluster_worker``, ``queue_client``). A test module's own
fixture of the same name overrides them.
"""

from cluster_fixtures import cluster_client_fixture as cluster_client_fixture
from cluster_fixtures import cluster_fixture as cluster_fixture
from cluster_fixtures import cluster_registry_fixture as cluster_registry_fixture
from cluster_fixtures import cluster_worker_fixture as cluster_worker_fixture
from cluster_fixtures import queue_client_fixture as queue_client_fixture
from cluster_fixtures import queue_server_fixture as queue_server_fixture
from fault_fixtures import own_server_fixture as own_server_fixture
from fault_fixtures import procs_fixture as procs_fixture
from fault_fixtures import rds_fixture as rds_fixture
from worker_fixtures import client_fixture as client_fixture
from worker_fixtures import source_fixture as source_fixture
from worker_fixtures import worker_fixture as worker_fixture
