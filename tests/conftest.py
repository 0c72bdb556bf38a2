import pytest_asyncio

from nsqpy.nsqd.nsqd import NSQD
from nsqpy.nsqd.options import Options


def make_options(tmp_path, **kw):
    base = dict(tcp_address="127.0.0.1:0", http_address="127.0.0.1:0", data_path=str(tmp_path))
    base.update(kw)
    return Options(**base)


@pytest_asyncio.fixture
async def nsqd(tmp_path):
    async with NSQD(make_options(tmp_path)) as d:
        yield d
