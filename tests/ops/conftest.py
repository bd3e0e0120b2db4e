"""The fixtures the persistence backend tests share (``persist_fixtures``): ``root``, the files'
folder, and ``make_backend``, a backend factory. A test module's own fixture of the same name
overrides them.
"""

from cluster_fixtures import cluster_client_fixture as cluster_client_fixture
from cluster_fixtures import cluster_fixture as cluster_fixture
from cluster_fixtures import cluster_registry_fixture as cluster_registry_fixture
from persist_fixtures import make_backend_fixture as make_backend_fixture
from persist_fixtures import root_fixture as root_fixture
