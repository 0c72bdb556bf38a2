"""Interop fixtures: nsqd from its console script, client libraries in driver subprocesses.

pynsq (Tornado) and gnsq (gevent, which monkey-patches the standard library) run in their
own processes through the driver scripts next to this file, so neither touches the pytest
process; each driver run has a hard timeout and is killed by PID.
"""

from __future__ import annotations

import pytest
from e2e.proc import NsqdProcess


@pytest.fixture
def nsqd_proc(tmp_path):
    """A fresh ``nsqd`` subprocess (console script) on free ports; stopped by PID afterwards."""
    p = NsqdProcess(tmp_path / "nsqd")
    try:
        p.start()
        yield p
        assert p.is_running(), f"nsqd died during the test\n{p.describe()}"
    finally:
        code = p.stop()
    assert code == 0, f"nsqd did not exit cleanly on SIGTERM (code {code})\n{p.describe()}"
