"""The fixtures the console tests share (``console_fixtures``): ``deployment`` and ``browser``
(module-scoped), ``page`` (one per test). A test module's own fixture of the same name overrides them.
"""

from console_fixtures import browser_fixture as browser_fixture
from console_fixtures import deployment_fixture as deployment_fixture
from console_fixtures import page_fixture as page_fixture
