"""The package as a user gets it: ``python -m build`` makes an sdist and a wheel (the wheel
built from the sdist, so the sdist is complete too); the wheel, installed into a fresh venv
with no source tree in sight, runs nsqd on its compiled hot paths (a PUB/SUB/FIN round trip),
nsqadmin's pages and ``nsq_spark --help`` (no pyspark: the spark extra is not installed); the
sdist installs without a C compiler and runs on the pure-Python hot paths."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tarfile
import urllib.request
import zipfile
from pathlib import Path

import pytest
from e2e.proc import DaemonProcess, split_host_port
from support import RawClient, find_stats, nsqd_stats, wait_until

from nsqpy.protocol import commands

pytestmark = pytest.mark.timeout(600)

ROOT = Path(__file__).resolve().parents[2]
#: what the daemons' start-up log says about nsqpy._speedups (nsqd.py, _speedups.describe())
COMPILED_LINE = "per-message hot paths compiled (C)"
PURE_LINE = "per-message hot paths pure Python"


def run(argv: list[str | Path], timeout: float = 300, **kw: object) -> subprocess.CompletedProcess[str]:
    """Run to completion; a non-zero exit fails the test with the output."""
    p = subprocess.run(
        [str(a) for a in argv],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        **kw,
    )  # type: ignore[call-overload]
    assert p.returncode == 0, (
        f"{argv} exited {p.returncode}\n--- stdout:\n{p.stdout}\n--- stderr:\n{p.stderr}"
    )
    return p


def clean_env(venv: Path, **extra: str) -> dict[str, str]:
    """This environment minus whatever could put the source tree or the project's venv on the
    path, with ``venv``'s bin first on PATH."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV", "NSQPY_PURE_PYTHON")
    }
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env.update(extra)
    return env


def make_venv(venv: Path, package: Path, cwd: Path, **env: str) -> dict[str, str]:
    """A fresh venv with ``package`` (and its dependencies, from the index or pip's cache)."""
    run([sys.executable, "-m", "venv", venv], timeout=120)
    environ = clean_env(venv, **env)
    run(
        [venv / "bin" / "python", "-m", "pip", "install", "--disable-pip-version-check", "-q", package],
        env=environ,
        cwd=cwd,
    )
    return environ


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the sdist, the wheel) built by ``python -m build``."""
    out = tmp_path_factory.mktemp("dist")
    # no PYTHONPATH: the build backend runs in its own venv (setuptools>=77), not on ours
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    run([sys.executable, "-m", "build", "--outdir", out, ROOT], timeout=300, env=env)
    sdists, wheels = sorted(out.glob("nsqpy-*.tar.gz")), sorted(out.glob("nsqpy-*.whl"))
    assert len(sdists) == 1 and len(wheels) == 1, sorted(out.iterdir())
    return sdists[0], wheels[0]


def test_the_archives_hold_the_package_data_and_the_metadata(dist):
    sdist, wheel = dist
    with tarfile.open(sdist) as t:
        names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    for needed in (
        "setup.py",
        "pyproject.toml",
        "LICENSE",
        "README.md",
        "src/nsqpy/_speedups/_hot.c",
        "src/nsqpy/_speedups/_hot.pyi",
        "src/nsqpy/py.typed",
        "src/nsqpy/nsqadmin/static/index.html",
    ):
        assert needed in names, needed
    # no build of the developer's own (scripts/setup.sh builds _hot in place) rides along
    assert not [n for n in names if n.endswith(".so")]
    static = {n for n in names if n.startswith("src/nsqpy/nsqadmin/static/")}
    in_tree = {
        str(p.relative_to(ROOT)) for p in (ROOT / "src/nsqpy/nsqadmin/static").rglob("*") if p.is_file()
    }
    assert in_tree <= static
    with zipfile.ZipFile(wheel) as z:
        files = set(z.namelist())
        meta_name = next(n for n in files if n.endswith(".dist-info/METADATA"))
        meta = z.read(meta_name).decode()
    assert any(n.startswith("nsqpy/_speedups/_hot.") and n.endswith(".so") for n in files), files
    assert {"nsqpy/_speedups/_hot.pyi", "nsqpy/py.typed"} <= files
    assert {"nsqpy/" + n.removeprefix("src/nsqpy/") for n in in_tree} <= files
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in files)
    for line in (
        "License-Expression: MIT",
        "Requires-Python: >=3.11",
        "Classifier: Framework :: AsyncIO",
        "Classifier: Programming Language :: Python :: 3.13",
        "Classifier: Topic :: System :: Networking",
        "Project-URL: Source, ",
        "Provides-Extra: spark",
    ):
        assert line in meta, line


async def round_trip(tcp: str) -> bytes:
    """PUB a message, SUB it, FIN it; the body received."""
    host, port = split_host_port(tcp)
    pub = await RawClient.connect(port, host)
    assert await pub.pub("wheel", b"from the wheel") == (0, b"OK")
    sub = await RawClient.connect(port, host)
    await sub.sub("wheel", "ch", rdy=1)
    msg = await sub.read_message()
    sub.send(commands.fin(msg.id))
    await pub.close()
    await sub.close()
    return bytes(msg.body)


def finished(http: str) -> bool:
    """The round trip's message was FINished: delivered once, none left queued or in flight
    (closing the connection without the FIN would have requeued it)."""
    ch = find_stats(nsqd_stats(http), "wheel", "ch") or {}
    return (ch.get("message_count"), ch.get("depth"), ch.get("in_flight_count")) == (1, 0, 0)


def test_the_wheel_in_a_fresh_venv_runs_nsqd_compiled_nsqadmin_and_nsq_spark(dist, tmp_path):
    _, wheel = dist
    venv, cwd = tmp_path / "venv", tmp_path / "cwd"
    cwd.mkdir()
    env = make_venv(venv, wheel, cwd)
    bin_dir = venv / "bin"

    where = run(
        [bin_dir / "python", "-c", "import nsqpy, nsqpy._speedups as s; print(nsqpy.__file__, s.compiled)"],
        env=env,
        cwd=cwd,
    ).stdout.split()
    assert Path(where[0]).is_relative_to(venv / "lib"), where
    assert where[1] == "True", where
    version = run([bin_dir / "nsqd", "--version"], env=env, cwd=cwd).stdout
    assert version.startswith("nsqd v1.3.0 (nsqpy "), version

    args = ["--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0", f"--data-path={tmp_path}"]
    with DaemonProcess("nsqd", args, tmp_path / "logs", cwd=str(cwd), bin_dir=bin_dir, env=env) as nsqd:
        addrs = nsqd.start().wait_for_addresses(("TCP", "HTTP"))
        wait_until(lambda: "hot paths" in nsqd.stderr() + nsqd.stdout(), what="the start-up log")
        assert COMPILED_LINE in nsqd.stderr() + nsqd.stdout(), nsqd.describe()
        assert asyncio.run(round_trip(addrs["TCP"])) == b"from the wheel"
        wait_until(lambda: finished(addrs["HTTP"]), what="the FIN in /stats")

        admin_args = ["--http-address=127.0.0.1:0", f"--nsqd-http-address={addrs['HTTP']}"]
        with DaemonProcess(
            "nsqadmin", admin_args, tmp_path / "logs", cwd=str(cwd), bin_dir=bin_dir, env=env
        ) as admin:
            http = admin.start().wait_for_addresses(("HTTP",))["HTTP"]
            for page, needle in (("/", b"<html"), ("/static/js/main.js", b"import")):
                with urllib.request.urlopen(f"http://{http}{page}", timeout=10) as r:
                    assert r.status == 200 and needle in r.read(), page
            with urllib.request.urlopen(f"http://{http}/api/topics", timeout=10) as r:
                assert "wheel" in json.loads(r.read())["topics"]
        assert nsqd.stop() == 0, nsqd.describe()

    spark = subprocess.run(
        [bin_dir / "nsq_spark", "--help"], capture_output=True, text=True, env=env, cwd=cwd, timeout=60
    )
    assert spark.returncode == 0, spark.stderr
    assert "archive" in spark.stderr + spark.stdout
    find = "import importlib.util as u; print(u.find_spec('pyspark'))"
    assert run([bin_dir / "python", "-c", find], env=env, cwd=cwd).stdout.strip() == "None"


def test_the_sdist_installs_without_a_compiler_and_runs_pure_python(dist, tmp_path):
    sdist, _ = dist
    venv, cwd = tmp_path / "venv", tmp_path / "cwd"
    cwd.mkdir()
    # every compile the extension's build tries runs /bin/false: the optional extension fails
    env = make_venv(venv, sdist, cwd, CC="/bin/false", CXX="/bin/false")
    env.pop("CC")
    env.pop("CXX")
    site = venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    assert not list((site / "nsqpy" / "_speedups").glob("_hot*.so"))
    p = run(
        [venv / "bin" / "python", "-c", "import nsqpy._speedups as s; print(s.__file__, s.compiled)"],
        env=env,
        cwd=cwd,
    )
    where, compiled = p.stdout.split()
    assert Path(where).is_relative_to(site) and compiled == "False", p.stdout
    assert "running the pure-Python ones" in p.stderr
    version = run([venv / "bin" / "nsqd", "--version"], env=env, cwd=cwd).stdout
    assert version.startswith("nsqd v1.3.0 (nsqpy "), version

    args = ["--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0", f"--data-path={tmp_path}"]
    with DaemonProcess("nsqd", args, tmp_path / "logs", cwd=str(cwd), bin_dir=venv / "bin", env=env) as nsqd:
        addrs = nsqd.start().wait_for_addresses(("TCP", "HTTP"))
        wait_until(lambda: "hot paths" in nsqd.stderr() + nsqd.stdout(), what="the start-up log")
        assert PURE_LINE in nsqd.stderr() + nsqd.stdout(), nsqd.describe()
        assert asyncio.run(round_trip(addrs["TCP"])) == b"from the wheel"
        assert nsqd.stop() == 0, nsqd.describe()
