"""The fixtures the integrations' tests share: the 3-master cluster (``cluster_fixtures``:
``cluster``, ``cluster_client``, ``cluster_registry``). A test module's own fixture of the same name
overrides them.
"""

from cluster_fixtures import cluster_client_fixture as cluster_client_fixture
from cluster_fixtures import cluster_fixture as cluster_fixture
from cluster_fixtures import cluster_registry_fixture as cluster_registry_fixture
