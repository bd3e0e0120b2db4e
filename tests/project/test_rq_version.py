"""The suite runs on the RQ major it was asked to run on (``run.py`` runs it on RQ 3 and on RQ 2.12)."""

from __future__ import annotations

import os

import pytest
import rq

from sessionfork.worker.rq_seam.worker import RQ_MAJOR

pytestmark = pytest.mark.rq  # runs again on RQ 2.12 (run.py test)


def test_the_seam_knows_the_installed_rq_major() -> None:
    assert int(rq.__version__.split(".")[0]) == RQ_MAJOR


def test_the_rq_major_asked_for_is_the_one_installed() -> None:
    # run.py sets SESSIONFORK_EXPECT_RQ=2 for its second pass; without it, the current release (3).
    assert int(os.environ.get("SESSIONFORK_EXPECT_RQ", "3")) == RQ_MAJOR
