"""A fault test that fails midway leaves no run behind: every `forge-exp` it started and did not see end is killed."""

import pytest

from tests.faults.helpers import Run


@pytest.fixture(autouse=True)
def _stop_runs():
    yield
    while Run.started:
        Run.started.pop().stop()
