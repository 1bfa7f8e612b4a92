"""What the tests of launched jobs share: the scripts folder on the path, and ``job_env``."""

import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).parent / "scripts"
if str(SCRIPTS) not in sys.path:
    sys.path.insert(0, str(SCRIPTS))

from jobs import job_environment  # noqa: E402


@pytest.fixture
def job_env(monkeypatch):
    """The marker of this test's processes (every one is gone at the end, or the test
    fails) and their one-thread settings (:func:`jobs.job_environment`)."""
    with job_environment(monkeypatch) as marker:
        yield marker
