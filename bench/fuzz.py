#!/usr/bin/env python3
"""Coverage-guided fuzzing of nsqpy's parsers with atheris (libFuzzer), one target at a time.

The targets are ``tests/fuzz/fuzz_targets.py``'s (``--list``); each runs in its own process
(libFuzzer ends the process when it stops) for ``--seconds``, starting from the seed corpus
in ``tests/fuzz/corpus/<target>/`` (read only) plus a working corpus (``--work-dir``, a temp
directory by default) where new inputs go. A crash, a hang (``--timeout`` per input) or an
out-of-memory is written to ``<work-dir>/<target>/artifacts/`` and reported; the exit status
is non-zero if any target failed.

    nice -n 19 .venv/bin/python bench/fuzz.py --all --seconds 600        # the long runs
    .venv/bin/python bench/fuzz.py --target v2_commands --seconds 5       # a quick look
    .venv/bin/python bench/fuzz.py --write-seeds                          # regenerate the corpus
    .venv/bin/python bench/fuzz.py --reproduce v2_commands crash-1234     # run one input

Prints one line per target (runs, execs/s, coverage, corpus size, result) and, with
``--json``, a JSON document of the same on stdout. Run it under ``nice -n 19`` next to
benchmarks.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FUZZ_DIR = ROOT / "tests" / "fuzz"
CORPUS = FUZZ_DIR / "corpus"


def _targets():
    sys.path.insert(0, str(FUZZ_DIR))
    import fuzz_targets

    return fuzz_targets


def run_child(
    name: str,
    seconds: float,
    work: Path,
    timeout: int,
    max_len: int,
    rss_mb: int,
    runs: int | None,
    inputs: list[str],
) -> None:
    """In the child process: instrument nsqpy, then hand the target to libFuzzer."""
    import atheris

    # bench/ (this script's directory) has a profile.py that would shadow the stdlib's
    here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]
    sys.path.insert(0, str(FUZZ_DIR))
    with atheris.instrument_imports(include=["nsqpy"]):
        import fuzz_targets

        fuzz_targets.setup()
    fn = fuzz_targets.TARGETS[name]
    args = [
        sys.argv[0],
        f"-timeout={timeout}",
        f"-rss_limit_mb={rss_mb}",
        f"-max_len={max_len}",
        "-print_final_stats=1",
    ]
    if inputs:
        args += inputs  # reproduce: run these files once each
    else:
        corpus = work / "corpus"
        art = work / "artifacts"
        corpus.mkdir(parents=True, exist_ok=True)
        art.mkdir(parents=True, exist_ok=True)
        args += [f"-artifact_prefix={art}/", f"-max_total_time={max(1, int(seconds))}"]
        if runs is not None:
            args.append(f"-runs={runs}")
        args += [str(corpus), str(CORPUS / name)]
    atheris.Setup(args, fn)
    atheris.Fuzz()


_DONE = re.compile(r"Done (\d+) runs in (\d+) second")
_STATUS = re.compile(r"#(\d+)\s+\w+\s+cov: (\d+) ft: (\d+) corp: (\d+)/(\S+)")
_EXECS = re.compile(r"stat::number_of_executed_units:\s*(\d+)")


def fuzz_target(
    name: str, seconds: float, work: Path, timeout: int, max_len: int, rss_mb: int, runs: int | None = None
) -> dict:
    """Run one target in a child process; returns its figures."""
    tdir = work / name
    tdir.mkdir(parents=True, exist_ok=True)
    log_path = tdir / "fuzz.log"
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        name,
        "--seconds",
        str(seconds),
        "--work-dir",
        str(tdir),
        "--timeout",
        str(timeout),
        "--max-len",
        str(max_len),
        "--rss-limit-mb",
        str(rss_mb),
    ]
    if runs is not None:
        cmd += ["--runs", str(runs)]
    start = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        try:
            code = proc.wait(timeout=seconds + max(60, 3 * timeout))
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
    wall = time.monotonic() - start
    text = log_path.read_text(errors="replace")
    execs = 0
    m = _EXECS.search(text) or _DONE.search(text)
    if m:
        execs = int(m.group(1))
    status = _STATUS.findall(text)
    cov = ft = corp = 0
    if status:
        _, cov_s, ft_s, corp_s, _ = status[-1]
        cov, ft, corp = int(cov_s), int(ft_s), int(corp_s)
    artifacts = (
        sorted(str(p) for p in (tdir / "artifacts").glob("*")) if (tdir / "artifacts").exists() else []
    )
    ok = code == 0 and not artifacts
    return {
        "target": name,
        "seconds": round(wall, 1),
        "runs": execs,
        "execs_per_s": round(execs / wall) if wall else 0,
        "cov": cov,
        "ft": ft,
        "corpus": corp,
        "exit": code,
        "artifacts": artifacts,
        "result": "ok" if ok else "FAILED",
        "log": str(log_path),
        "tail": "" if ok else text[-3000:],
    }


def write_seeds() -> int:
    """(Re)write ``tests/fuzz/corpus/<target>/seed-<sha1>`` from the targets' seed lists."""
    ft = _targets()
    n = 0
    for name, data in ft.all_seeds():
        d = CORPUS / name
        d.mkdir(parents=True, exist_ok=True)
        p = d / ("seed-" + hashlib.sha1(data).hexdigest()[:16])
        if not p.exists():
            p.write_bytes(data)
            n += 1
    return n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", action="append", default=[], help="a target (repeatable)")
    ap.add_argument("--all", action="store_true", help="every target, one after the other")
    ap.add_argument("--list", action="store_true", help="list the targets")
    ap.add_argument("--seconds", type=float, default=600.0, help="per target (600)")
    ap.add_argument("--runs", type=int, default=None, help="stop after this many inputs as well")
    ap.add_argument("--timeout", type=int, default=10, help="seconds one input may take (10)")
    # above nsqd's 16 KiB command line limit, so that an over-long line can be generated
    ap.add_argument("--max-len", type=int, default=20000, help="longest input (20000 bytes)")
    ap.add_argument("--rss-limit-mb", type=int, default=2048)
    ap.add_argument("--work-dir", default="", help="working corpus and artifacts (a temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the temp work dir")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--write-seeds", action="store_true", help="write the seed corpus and exit")
    ap.add_argument("--reproduce", nargs="+", metavar=("TARGET", "FILE"), help="run inputs once")
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)
    a = ap.parse_args()

    if a.child:
        run_child(a.child, a.seconds, Path(a.work_dir), a.timeout, a.max_len, a.rss_limit_mb, a.runs, [])
        return 0
    if a.write_seeds:
        print(f"{write_seeds()} new seed files under {CORPUS}")
        return 0
    if a.reproduce:
        name, *files = a.reproduce
        run_child(name, 0, Path("."), a.timeout, a.max_len, a.rss_limit_mb, None, files)
        return 0
    ft = _targets()
    if a.list:
        for name, fn in ft.TARGETS.items():
            print(f"{name:16} {(fn.__doc__ or '').strip().splitlines()[0]}")
        return 0
    names = list(ft.TARGETS) if a.all else a.target
    unknown = [n for n in names if n not in ft.TARGETS]
    if not names or unknown:
        ap.error(f"unknown target(s) {unknown}" if unknown else "give --target NAME or --all")
    tmp = None
    if a.work_dir:
        work = Path(a.work_dir)
    else:
        tmp = work = Path(tempfile.mkdtemp(prefix="nsqpy-fuzz-"))
    results = []
    try:
        for name in names:
            r = fuzz_target(name, a.seconds, work, a.timeout, a.max_len, a.rss_limit_mb, a.runs)
            results.append(r)
            print(
                f"{name:16} {r['result']:6} {r['seconds']:7.1f}s {r['runs']:>10} runs "
                f"{r['execs_per_s']:>6}/s cov {r['cov']:>5} ft {r['ft']:>6} corpus {r['corpus']:>5}",
                flush=True,
            )
            if r["result"] != "ok":
                print(r["tail"], file=sys.stderr)
                for p in r["artifacts"]:
                    print(f"  artifact: {p}", file=sys.stderr)
    finally:
        if tmp is not None and not a.keep and all(r["result"] == "ok" for r in results):
            shutil.rmtree(tmp, ignore_errors=True)
        elif tmp is not None:
            print(f"work dir kept: {tmp}", file=sys.stderr)
    if a.json:
        json.dump({"targets": results}, sys.stdout, indent=1)
        print()
    return 0 if all(r["result"] == "ok" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
