"""CI's share of the fuzzing: every target on the seed corpus kept in the repo (in-process,
deterministic), then a few seconds of coverage-guided atheris per target (``bench/fuzz.py``
in a child process, starting from the same corpus). The long runs are ``bench/fuzz.py
--all --seconds 600``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import fuzz_targets as ft
import pytest

ROOT = Path(__file__).resolve().parents[2]
CORPUS = Path(__file__).parent / "corpus"
#: seconds of atheris per target in CI
CI_SECONDS = 2

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module", autouse=True)
def targets_ready():
    ft.setup()
    yield
    ft.cleanup()


def test_every_target_has_a_seed_corpus_in_the_repo():
    assert set(ft.TARGETS) == set(ft.SEEDS)
    for name in ft.TARGETS:
        files = list((CORPUS / name).glob("*"))
        assert len(files) >= 3, f"tests/fuzz/corpus/{name} has {len(files)} inputs"
    # the seeds the targets define are all in the repo (bench/fuzz.py --write-seeds)
    import hashlib

    for name, data in ft.all_seeds():
        assert (CORPUS / name / ("seed-" + hashlib.sha1(data).hexdigest()[:16])).exists(), name


@pytest.mark.parametrize("name", sorted(ft.TARGETS))
def test_target_on_its_corpus(name):
    fn = ft.TARGETS[name]
    files = sorted((CORPUS / name).glob("*"))
    for f in files:
        try:
            fn(f.read_bytes())
        except BaseException as e:
            raise AssertionError(f"{name} fails on {f.relative_to(ROOT)}: {e!r}") from e


@pytest.mark.parametrize("name", sorted(ft.TARGETS))
def test_atheris_briefly(name, tmp_path):
    import atheris  # noqa: F401  (a dev dependency: missing, this fails rather than skips)

    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "fuzz.py"),
            "--target",
            name,
            "--seconds",
            str(CI_SECONDS),
            "--work-dir",
            str(tmp_path),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=CI_SECONDS + 90,
    )
    out = r.stdout[r.stdout.index("{") :] if "{" in r.stdout else ""
    assert r.returncode == 0 and out, f"{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    (res,) = json.loads(out)["targets"]
    assert res["result"] == "ok" and res["runs"] > 0, res
