"""The root conftest: shared fixtures, and markers given by directory so that a fast loop can
leave the slow suites out (``bash scripts/test.sh -m "not spark and not browser"``)."""

from pathlib import Path

import pytest
import pytest_asyncio

from nsqpy.nsqd.nsqd import NSQD
from nsqpy.nsqd.options import Options

#: tests/<dir> → the marker its tests carry (registered in pyproject.toml)
DIRECTORY_MARKERS = {
    "e2e": "e2e",
    "spark": "spark",
    "interop": "interop",
    "browser": "browser",
    "reliability": "reliability",
    "fuzz": "fuzz",
    "packaging": "packaging",
}

_TESTS = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        try:
            top = Path(item.path).relative_to(_TESTS).parts[0]
        except ValueError:
            continue
        marker = DIRECTORY_MARKERS.get(top)
        if marker is not None:
            item.add_marker(marker)


def make_options(tmp_path, **kw):
    base = dict(tcp_address="127.0.0.1:0", http_address="127.0.0.1:0", data_path=str(tmp_path))
    base.update(kw)
    return Options(**base)


@pytest_asyncio.fixture
async def nsqd(tmp_path):
    async with NSQD(make_options(tmp_path)) as d:
        yield d
