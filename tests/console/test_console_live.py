"""The console's live view in a real browser: an outcome is on the page within a second of its fork
(serial: a time bound; the fixtures are ``console_fixtures``'s)."""

from __future__ import annotations

import time

import pytest
from console_fixtures import (
    Deployment,
    browser_fixture,  # noqa: F401
    deployment_fixture,  # noqa: F401
    fork,
    page_fixture,  # noqa: F401
    shot,
)
from playwright.sync_api import Page

pytestmark = pytest.mark.serial  # asserts a time bound


def test_a_live_outcome_appears_within_a_second_of_the_fork(deployment: Deployment, page: Page) -> None:
    page.goto(deployment.url)
    page.wait_for_selector("body[data-live=on]")  # the event stream is open

    reply = fork(deployment, "root", "root-live")
    forked = time.monotonic()
    row = page.wait_for_selector(f'#live tbody tr[data-request="{reply.request_id}"]', timeout=1000)

    assert time.monotonic() - forked < 1.0
    assert row is not None and "root-live" in row.inner_text()
    shot(page, "outcomes")
