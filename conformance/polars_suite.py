"""Run Polars' own unit-test suite natively and on shoal, and report the difference.

Not part of the package and not run in CI. The Polars tests are never copied into the
repository: they are extracted from a pola-rs/polars git repository (a bare git dir or a
checkout, ``--polars-repo`` or ``POLARS_REPO``) into a cache directory (``--cache`` or
``POLARS_SUITE_DIR``, default ``~/.cache/shoal-conformance/polars``), with
``git archive <ref> py-polars/tests py-polars/pyproject.toml`` (the pyproject carries
Polars' pytest settings: markers, warnings as errors, import mode).

Steps (run in this order by ``all``):

``setup``
    extract the snapshot and create the suite's own virtual environment (pytest 9.0.3:
    9.2 breaks the suite's collection; pytest-xdist, pytest-timeout, hypothesis, the
    suite's test dependencies that install here, and shoal from this repository, editable).
``native``
    run the suite once on Polars (``--paths``, default ``tests/unit``) and keep the ids
    of the tests that pass (``runs/native/passed.txt``).
``strict``
    run the natively passing tests with every default-engine ``LazyFrame.collect`` on
    ``shoal.DistEngine(runner="local", raise_on_fail=True)``, 3 partitions per in-memory
    frame and after each exchange, file scans split every ``--scan-bytes`` bytes
    (``conformance/shoal_pytest_plugin.py``).
``fallback``
    run the tests that failed ``strict`` again, with fallback to Polars allowed.
``report``
    print the numbers and the failures grouped by cause; write ``results.json`` to the
    cache directory and, with ``--notes``, the top groups as Markdown.

``repro NODEID...`` runs single tests on shoal (strict, one process, long tracebacks).
Each run's records are one JSON line per test under ``<cache>/runs/<step>/``.
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

#: Polars' default marker expression (its pyproject's addopts), repeated explicitly.
MARKERS = (
    "not slow and not write_disk and not release and not docs and not hypothesis "
    "and not benchmark and not ci_only"
)

#: pytest 9.2 breaks the collection of the 1.43 suite; 9.0.3 is what Polars pins.
CORE_REQUIREMENTS = ["pytest==9.0.3", "pytest-xdist", "pytest-timeout", "hypothesis"]

#: Polars' test dependencies (py-polars/requirements-dev.txt, without build and lint
#: tools and polars-cloud); each is optional: a test whose module is missing is skipped or
#: fails natively, and only natively passing tests are run on shoal.
OPTIONAL_REQUIREMENTS = [
    "numpy", "pandas", "pyarrow", "pydantic", "pytz", "numba", "sqlalchemy",
    "adbc-driver-manager", "adbc-driver-sqlite", "aiosqlite", "connectorx", "boto3",
    "cloudpickle", "fsspec", "s3fs", "pyiceberg", "pyiceberg-core", "fastexcel",
    "openpyxl", "xlsx2csv", "xlsxwriter", "deltalake", "zstandard", "altair",
    "great-tables", "gevent", "matplotlib", "orjson", "moto[server]", "flask", "flask-cors",
    "azure-identity",
]  # fmt: skip


def log(msg: str) -> None:
    print(f"[polars-suite {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# --------------------------------------------------------------------------- snapshot


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True
    ).stdout.strip()


def snapshot(args: argparse.Namespace) -> dict[str, str]:
    """Extract ``py-polars/tests`` of the Polars repository at ``args.ref`` into the cache
    (once per commit) and return {commit, version, root}."""
    if not args.polars_repo:
        sys.exit(
            "polars-suite: name the pola-rs/polars repository (bare git dir or checkout) "
            "with --polars-repo or POLARS_REPO"
        )
    repo = Path(args.polars_repo)
    commit = _git(repo, "rev-parse", f"{args.ref}^{{commit}}")
    pyproject = _git(repo, "show", f"{commit}:py-polars/pyproject.toml")
    match = re.search(r'^version\s*=\s*"([^"]+)"', pyproject, re.M)
    version = match.group(1) if match else "unknown"
    root = args.cache / "src" / commit[:12]
    if not (root / "py-polars" / "tests" / "unit").is_dir():
        tmp = root.with_name(root.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        archive = subprocess.Popen(
            [
                "git",
                "-C",
                str(repo),
                "archive",
                commit,
                "py-polars/tests",
                "py-polars/pyproject.toml",
            ],
            stdout=subprocess.PIPE,
        )
        subprocess.run(["tar", "-x", "-C", str(tmp)], stdin=archive.stdout, check=True)
        if archive.wait() != 0:
            sys.exit(f"polars-suite: git archive of {commit} failed")
        shutil.rmtree(root, ignore_errors=True)
        tmp.rename(root)
    info = {"commit": commit, "version": version, "root": str(root / "py-polars")}
    log(f"Polars test snapshot: {repo} at {commit} (py-polars {version}) in {info['root']}")
    return info


# ------------------------------------------------------------------------------- venv


def venv_python(args: argparse.Namespace) -> Path:
    return args.cache / "venv" / "bin" / "python"


def setup_venv(args: argparse.Namespace) -> None:
    """Create the suite's virtual environment if missing; (re)install shoal from REPO."""
    py = venv_python(args)
    pip = [str(py), "-m", "pip", "install", "-q"]
    done = py.parent.parent / ".shoal-suite-complete"
    if not done.exists():
        if not py.exists():
            log(f"creating {py.parent.parent}")
            subprocess.run([args.python, "-m", "venv", str(py.parent.parent)], check=True)
        subprocess.run([*pip, "-e", str(REPO), *CORE_REQUIREMENTS], check=True)
        polars = subprocess.run(
            [str(py), "-c", "import polars; print(polars.__version__)"],
            check=True, capture_output=True, text=True,
        ).stdout.strip()  # fmt: skip
        pins = args.cache / "constraints.txt"
        pins.write_text(f"polars=={polars}\npytest==9.0.3\n")
        # One at a time: together, pip's resolver backtracks for a long time (moto), and
        # one package that does not install here must not stop the others.
        for req in OPTIONAL_REQUIREMENTS:
            if subprocess.run([*pip, "-c", str(pins), req]).returncode != 0:
                log(f"optional test dependency {req} did not install; its tests skip")
        done.write_text("")
    where = subprocess.run(
        [str(py), "-c", "import shoal; print(shoal.__file__)"], capture_output=True, text=True
    ).stdout.strip()
    if not where.startswith(str(REPO)):
        log(f"installing shoal from {REPO} (editable) into the suite's venv")
        subprocess.run([*pip, "--no-deps", "-e", str(REPO)], check=True)


def versions(args: argparse.Namespace) -> dict[str, str]:
    code = (
        "import json, importlib.metadata as m\n"
        "out = {}\n"
        "for d in ['polars', 'pyarrow', 'pytest', 'pytest-xdist', 'hypothesis', 'ray']:\n"
        "    try: out[d] = m.version(d)\n"
        "    except Exception: out[d] = None\n"
        "print(json.dumps(out))"
    )
    run = subprocess.run([str(venv_python(args)), "-c", code], capture_output=True, text=True)
    return json.loads(run.stdout) if run.returncode == 0 else {}


def shoal_commit() -> str:
    try:
        commit = _git(REPO, "rev-parse", "HEAD")
        dirty = _git(REPO, "status", "--porcelain", "--untracked-files=no")
        return commit + ("+dirty" if dirty else "")
    except Exception:
        return "unknown"


# ------------------------------------------------------------------------------- runs


def run_dir(args: argparse.Namespace, step: str) -> Path:
    """``<cache>/runs/<step>``; shoal runs get ``-<tag>`` with ``--tag`` (to keep several)."""
    if args.tag and step != "native":
        step = f"{step}-{args.tag}"
    return args.cache / "runs" / step


def read_records(directory: Path) -> dict[str, dict[str, Any]]:
    records: dict[str, dict[str, Any]] = {}
    for path in sorted(directory.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                rec = json.loads(line)
                records[rec["nodeid"]] = rec
    return records


def run_pytest(
    args: argparse.Namespace,
    snap: dict[str, str],
    step: str,
    targets: list[str],
    extra: list[str],
    only: list[str] | None = None,
) -> dict[str, dict[str, Any]]:
    """Run pytest on ``targets`` (paths or node ids relative to py-polars/) in the suite's
    venv; return the per-test records."""
    out = run_dir(args, step)
    if out.exists():
        prev = out.with_name(out.name + ".prev")
        shutil.rmtree(prev, ignore_errors=True)
        out.rename(prev)
    out.mkdir(parents=True)
    cmd = [
        str(venv_python(args)), "-m", "pytest", "-p", "shoal_pytest_plugin",
        "-p", "no:cacheprovider", "-q", "-n", str(args.workers), "-m", MARKERS,
        f"--timeout={args.timeout}", "--continue-on-collection-errors",
        "--shoal-record", str(out), *extra,
    ]  # fmt: skip
    if only is not None:
        if not args.random_order:
            only = sorted(only)
        (out / "select.txt").write_text("\n".join(only) + "\n")
        cmd += ["--shoal-only", str(out / "select.txt")]
    cmd += targets
    # Only shoal's own SHOAL_* settings: shoal warns about any other SHOAL_* variable
    # (ShoalWarning), and Polars' suite turns warnings into errors.
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHOAL_")}
    env["PYTHONPATH"] = str(HERE)
    env.pop("POLARS_ENGINE_AFFINITY", None)
    meta: dict[str, Any] = {
        "step": step,
        "polars_snapshot": snap,
        "shoal_commit": shoal_commit(),
        "versions": versions(args),
        "command": " ".join(cmd[1:] if len(cmd) < 60 else [*cmd[1:40], "..."]),
        "targets": targets if len(targets) < 50 else f"{len(targets)} files",
        "started": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }
    log(f"{step}: pytest in {snap['root']} ({len(only) if only is not None else 'all'} tests)")
    (out / "meta.json").write_text(json.dumps(meta, indent=1))
    t0 = time.monotonic()
    stopped = False
    with (out / "pytest.log").open("w") as logfile:
        proc = subprocess.Popen(
            cmd,
            cwd=snap["root"],
            env=env,
            stdout=logfile,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            rc = proc.wait(timeout=args.time_limit or None)
        except subprocess.TimeoutExpired:  # stop the run: Ctrl-C to pytest and its workers
            stopped = True
            log(f"{step}: time limit of {args.time_limit} s reached, stopping the run")
            os.killpg(proc.pid, signal.SIGINT)
            try:
                rc = proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                rc = proc.wait()
    meta.update(
        stopped_at_time_limit=stopped,
        returncode=rc,
        seconds=round(time.monotonic() - t0),
        finished=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    )
    (out / "meta.json").write_text(json.dumps(meta, indent=1))
    records = read_records(out)
    counts = collections.Counter(r["outcome"] for r in records.values())
    log(f"{step}: exit {rc} after {meta['seconds']} s: {dict(counts)}")
    return records


def _files(ids: list[str]) -> list[str]:
    return sorted({i.split("::", 1)[0] for i in ids})


def _in_paths(nodeid: str, paths: list[str]) -> bool:
    return any(
        nodeid == p or nodeid.startswith(p.rstrip("/") + "/") or nodeid.startswith(p + "::")
        for p in paths
    )


def step_native(args: argparse.Namespace, snap: dict[str, str]) -> None:
    records = run_pytest(args, snap, "native", args.paths, [])
    passed = sorted(n for n, r in records.items() if r["outcome"] == "passed")
    (run_dir(args, "native") / "passed.txt").write_text("\n".join(passed) + "\n")
    eligible = [n for n in passed if records[n].get("eligible", 0) > 0]
    (run_dir(args, "native") / "eligible.txt").write_text("\n".join(eligible) + "\n")
    log(f"native: {len(passed)} tests pass, {len(eligible)} of them call LazyFrame.collect")


def native_eligible(args: argparse.Namespace) -> set[str]:
    """Natively passing tests that make at least one default-engine ``LazyFrame.collect``
    (the plugin routes only those calls: a test without one never reaches shoal)."""
    path = run_dir(args, "native") / "eligible.txt"
    return set(path.read_text().splitlines()) if path.exists() else set(native_passed(args))


def native_passed(args: argparse.Namespace) -> list[str]:
    path = run_dir(args, "native") / "passed.txt"
    if not path.exists():
        sys.exit("polars-suite: run the 'native' step first")
    ids = [line for line in path.read_text().splitlines() if line]
    return [i for i in ids if _in_paths(i, args.paths)]


def shoal_flags(args: argparse.Namespace) -> list[str]:
    return [
        "--shoal-engine",
        f"--shoal-partitions={args.partitions}",
        f"--shoal-scan-bytes={args.scan_bytes}",
    ]


def step_strict(args: argparse.Namespace, snap: dict[str, str]) -> None:
    if args.unselected:  # every test under --paths, before (or while) the native run ends
        run_pytest(args, snap, "strict", args.paths, shoal_flags(args))
        return
    ids = native_passed(args)
    if not args.all_tests:
        eligible = native_eligible(args)
        ids = [i for i in ids if i in eligible]
    if args.sample:
        ids = sample(ids, args.sample)
    if args.random_order:  # any prefix of the run is a uniform sample
        ids = sorted(ids, key=_sha1)
    run_pytest(args, snap, "strict", _files(ids), shoal_flags(args), only=ids)


def _sha1(nodeid: str) -> str:
    return hashlib.sha1(nodeid.encode()).hexdigest()


def sample(ids: list[str], n: int) -> list[str]:
    """``n`` of ``ids``, chosen by the SHA-1 of each id: uniform, and the same every time."""
    return sorted(sorted(ids, key=_sha1)[:n])


def step_fallback(args: argparse.Namespace, snap: dict[str, str]) -> None:
    strict = read_records(run_dir(args, "strict"))
    ids = sorted(n for n, r in strict.items() if r["outcome"] in ("failed", "error"))
    native = set(native_passed(args))
    ids = [i for i in ids if i in native]
    if args.random_order:
        ids = sorted(ids, key=_sha1)
    if not ids:
        log("fallback: no strict failures to rerun")
        return
    flags = [
        *shoal_flags(args),
        "--shoal-fallback",
        "-W",
        "ignore::shoal_polars.ShoalFallbackWarning",
    ]
    run_pytest(args, snap, "fallback", _files(ids), flags, only=ids)


def step_repro(args: argparse.Namespace, snap: dict[str, str]) -> None:
    cmd = [
        str(venv_python(args)), "-m", "pytest", "-p", "shoal_pytest_plugin",
        "-p", "no:cacheprovider", "-m", MARKERS, "--tb=long", "-x",
        *shoal_flags(args), *args.nodeids,
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHOAL_")}
    env["PYTHONPATH"] = str(HERE)
    sys.exit(subprocess.run(cmd, cwd=snap["root"], env=env).returncode)


# ----------------------------------------------------------------------------- report

_QUOTED = re.compile(r"'[^'\n]{0,200}'|\"[^\"\n]{0,200}\"|`[^`\n]{0,200}`")
_NUMBER = re.compile(r"(?<![A-Za-z_0-9.])-?\d+(\.\d+)?(e-?\d+)?(?![A-Za-z_0-9])")
_SPACE = re.compile(r"\s+")
_PATH = re.compile(r"(?:[A-Za-z]+:/*)?(?:/[^\s/'\"]+){2,}/?")


def _short_type(name: str) -> str:
    name = (
        name.rsplit(".", 1)[-1]
        if "[" not in name
        else name.split("[", 1)[0].rsplit(".", 1)[-1] + "[" + name.split("[", 1)[1]
    )
    return name.replace("polars.exceptions.", "")


def group_key(rec: dict[str, Any]) -> tuple[str, str]:
    """(exception class, normalised message) of a failed test: for shoal's
    UnsupportedError the first unsupported part without its position in the plan; else
    the message's first line with quoted values and numbers blanked."""
    err = rec.get("error") or {}
    etype = _short_type(err.get("type", "?"))
    msg = err.get("message", "")
    if "shoal cannot run this Polars query" in msg:
        parts = [p.strip()[2:] for p in msg.splitlines()[1:] if p.strip().startswith("- ")]
        # "Select: expression Function(x): reason" -> "expression Function(x): reason"
        return etype, _normal_part(parts[0] if parts else msg)
    if etype in ("AssertionError",) or msg.startswith(
        ("DataFrames are different", "Series are different")
    ):
        line = msg.strip().splitlines()[0] if msg.strip() else ""
        line = re.sub(r"\(column [^)]*\)", "(column ?)", line)
        m = re.match(r"(DataFrames|Series) are different \(([^)]*)\)", line)
        if m:
            what = re.sub(r"column '[^']*'", "column ?", m.group(2))
            return etype, f"{m.group(1)} are different ({_NUMBER.sub('N', what)})"
        return etype, _SPACE.sub(" ", _NUMBER.sub("N", _QUOTED.sub("'?'", line)))[:160]
    line = next((ln for ln in msg.strip().splitlines() if ln.strip()), "")
    line = _PATH.sub("<path>", line)
    line = _QUOTED.sub("'?'", line)
    line = _NUMBER.sub("N", line)
    return etype, _SPACE.sub(" ", line).strip()[:160]


def _normal_part(part: str) -> str:
    """One unsupported part of shoal's message, without the plan node that holds the
    expression, literal values, quoted names and numbers."""
    part = re.sub(r"^[A-Za-z]+(\[[^\]]*\])?: (?=expression)", "", part)
    part = re.sub(r"Literal\(.*?\)(?=:)", "Literal(...)", part)
    part = _QUOTED.sub("'?'", part)
    return _SPACE.sub(" ", _NUMBER.sub("N", part))[:200]


def unsupported_parts(rec: dict[str, Any]) -> list[str]:
    msgs = [(rec.get("error") or {}).get("message", ""), *rec.get("fallback_reasons", [])]
    out: list[str] = []
    for msg in msgs:
        if "shoal cannot run this Polars query" not in msg:
            continue
        for p in msg.splitlines()[1:]:
            p = p.strip()
            if p.startswith("- "):
                key = _normal_part(p[2:])
                if key not in out:
                    out.append(key)
    return out


def groups_of(records: dict[str, dict[str, Any]], ids: list[str]) -> list[dict[str, Any]]:
    groups: dict[tuple[str, str], list[str]] = collections.defaultdict(list)
    for i in ids:
        groups[group_key(records[i])].append(i)
    out = []
    for (etype, msg), members in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        sample = members[0]
        err = records[sample].get("error") or {}
        lines = [ln.strip() for ln in err.get("message", "").splitlines() if ln.strip()]
        if len(lines) > 1 and lines[0].startswith("shoal cannot run this Polars query"):
            lines = lines[1:]  # the first unsupported part, not the heading
        first = lines[0] if lines else ""
        out.append(
            {
                "count": len(members),
                "type": etype,
                "cause": msg,
                "sample": sample,
                "sample_message": first[:300],
                "when": records[sample].get("when", "call"),
                "where": (err.get("where") or [""])[-1],
                "tests": members,
            }
        )
    return out


def step_report(args: argparse.Namespace, snap: dict[str, str]) -> dict[str, Any]:
    native_ids = native_passed(args)
    strict = read_records(run_dir(args, "strict"))
    fallback = read_records(run_dir(args, "fallback")) if run_dir(args, "fallback").exists() else {}
    meta = {
        s: json.loads((run_dir(args, s) / "meta.json").read_text())
        for s in ("native", "strict", "fallback")
        if (run_dir(args, s) / "meta.json").exists()
    }
    eligible = native_eligible(args)
    # A natively passing test without a default-engine collect runs exactly as natively
    # under the plugin: the strict run skips it and it counts as passing.
    no_collect = [i for i in native_ids if i not in eligible and i not in strict]
    ran = [i for i in native_ids if i in strict]
    missing = [i for i in native_ids if i not in strict and i in eligible]
    passed = [i for i in ran if strict[i]["outcome"] == "passed"]
    failed = [i for i in ran if strict[i]["outcome"] in ("failed", "error")]
    other = [i for i in ran if i not in passed and i not in failed]
    routed = [i for i in ran if strict[i].get("reached", 0) > 0]
    routed_pass = [i for i in routed if strict[i]["outcome"] == "passed"]
    unrouted_fail = [i for i in failed if strict[i].get("reached", 0) == 0]
    fb_ran = [i for i in failed if i in fallback]
    fb_failed = [i for i in fb_ran if fallback[i]["outcome"] in ("failed", "error")]
    fb_fell_back = [i for i in fb_ran if fallback[i].get("fallbacks", 0) > 0]
    part_counts: collections.Counter[str] = collections.Counter()
    for i in failed:
        part_counts.update(unsupported_parts(strict[i]))
    pct = lambda a, b: round(100.0 * len(a) / len(b), 1) if b else 0.0  # noqa: E731
    strict_meta = meta.get("strict", {})
    partial = bool(missing) and (bool(args.sample) or strict_meta.get("stopped_at_time_limit"))
    summary = {
        "native_passed": len(native_ids),
        "sample": args.sample or None,
        "no_collect": len(no_collect),
        "strict_ran": len(ran),
        "strict_not_run": len(missing),
        "strict_passed": len(passed),
        "strict_failed": len(failed),
        "strict_other": len(other),
        "strict_passed_pct": pct(passed, ran),
        "strict_passed_all": len(passed) + len(no_collect),
        "strict_passed_all_pct": pct(passed + no_collect, native_ids),
        "routed": len(routed),
        "routed_strict_passed": len(routed_pass),
        "routed_strict_passed_pct": pct(routed_pass, routed),
        # A sample (--sample, or --random-order stopped at --time-limit): 95 % interval.
        "routed_strict_passed_ci95": wilson(len(routed_pass), len(routed)) if partial else None,
        "strict_passed_ci95": wilson(len(passed), len(ran)) if partial else None,
        "strict_failed_without_routing": len(unrouted_fail),
        "fallback_ran": len(fb_ran),
        "fallback_failed": len(fb_failed),
        "fallback_took_fallback": len(fb_fell_back),
    }
    result = {
        "polars_snapshot": snap,
        "paths": args.paths,
        "runs": meta,
        "summary": summary,
        "strict_groups": groups_of(strict, failed),
        "fallback_groups": groups_of(fallback, fb_failed),
        "unsupported_parts": part_counts.most_common(),
        "not_shown_to_engines": [
            (part, n) for part, n in part_counts.most_common() if "does not show" in part
        ],
        "strict_not_run": missing,
    }
    out = args.cache / (f"results-{args.tag}.json" if args.tag else "results.json")
    out.write_text(json.dumps(result, indent=1))
    print_report(result)
    if args.notes:
        write_notes(result, Path(args.notes), args.top)
        log(f"wrote {args.notes}")
    log(f"wrote {out}")
    return result


def wilson(k: int, n: int, z: float = 1.96) -> list[float]:
    """Wilson score interval (percent) for k successes of n draws."""
    if n == 0:
        return [0.0, 100.0]
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * ((p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5) / (1 + z * z / n)
    return [round(100 * (centre - half), 1), round(100 * (centre + half), 1)]


def print_report(result: dict[str, Any]) -> None:
    s = result["summary"]
    snap = result["polars_snapshot"]
    strict_meta = result["runs"].get("strict", {})
    print(
        f"Polars tests {snap['commit'][:10]} (py-polars {snap['version']}), paths {' '.join(result['paths'])}"
    )
    print(f"shoal commit (strict run): {strict_meta.get('shoal_commit', '?')}")
    if s["sample"]:
        print(f"SAMPLE: strict ran a fixed sample of {s['sample']} tests that collect")
    print(f"tests passing natively:                     {s['native_passed']}")
    print(
        f"  passing under shoal strict:               {s['strict_passed_all']} ({s['strict_passed_all_pct']} %)"
    )
    print(
        f"    without a default-engine collect:       {s['no_collect']} (not rerun: they run as natively)"
    )
    print(
        f"    run under shoal strict:                 {s['strict_ran']}, passing {s['strict_passed']} ({s['strict_passed_pct']} %)"
    )
    print(f"    not run (missing records):              {s['strict_not_run']}")
    print(f"  routing >= 1 query to shoal:              {s['routed']}")
    print(
        f"    of which pass strict:                   {s['routed_strict_passed']} ({s['routed_strict_passed_pct']} %)"
    )
    if s["routed_strict_passed_ci95"]:
        print(
            f"  SAMPLE of {s['strict_ran']} of {s['strict_ran'] + s['strict_not_run']}: 95 % "
            f"interval, routing tests passing strict: {s['routed_strict_passed_ci95']} %; "
            f"collecting tests passing strict: {s['strict_passed_ci95']} %"
        )
    print(f"  failing strict without routing a query:   {s['strict_failed_without_routing']}")
    print(f"strict failures rerun with fallback:        {s['fallback_ran']}")
    print(f"  failing with fallback allowed:            {s['fallback_failed']}")
    print()
    print("strict failures by cause (count, class, cause, sample):")
    for g in result["strict_groups"][:60]:
        print(f"  {g['count']:5d}  {g['type']}: {g['cause']}\n         e.g. {g['sample']}")
    print()
    print("failures with fallback allowed by cause:")
    for g in result["fallback_groups"][:60]:
        print(f"  {g['count']:5d}  {g['type']}: {g['cause']}\n         e.g. {g['sample']}")
    print()
    print("unsupported parts named by strict failures (a test counts once per part):")
    for part, n in result["unsupported_parts"][:40]:
        print(f"  {n:5d}  {part}")
    print()
    print("of those, what Polars does not show to engines:")
    for part, n in result["not_shown_to_engines"]:
        print(f"  {n:5d}  {part}")


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def write_notes(result: dict[str, Any], path: Path, top: int) -> None:
    s = result["summary"]
    snap = result["polars_snapshot"]
    runs = result["runs"]
    lines = [
        "# Polars unit suite on shoal: failures grouped by cause",
        "",
        f"Written by `conformance/polars_suite.py report` at "
        f"{dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M')} UTC. Polars tests "
        f"{snap['commit'][:10]} (py-polars {snap['version']}); shoal "
        f"{runs.get('strict', {}).get('shoal_commit', '?')[:12]} (strict run); paths: "
        f"{' '.join(result['paths'])}.",
        "",
        f"- passing natively: {s['native_passed']}; under shoal strict: {s['strict_passed_all']} "
        f"({s['strict_passed_all_pct']} %; {s['no_collect']} of them make no default-engine "
        f"collect and were not rerun)",
        f"- routing >= 1 query to shoal: {s['routed']}; of those pass strict: "
        f"{s['routed_strict_passed']} ({s['routed_strict_passed_pct']} %)",
        (
            f"- SAMPLE: strict ran {s['strict_ran']} of {s['strict_ran'] + s['strict_not_run']} "
            f"collecting tests (uniform); 95 % interval of the routing tests' pass rate: "
            f"{s['routed_strict_passed_ci95']} %"
            if s["routed_strict_passed_ci95"]
            else "- strict ran every natively passing test that collects"
            + (f" except {s['strict_not_run']}" if s["strict_not_run"] else "")
        ),
        f"- strict failures rerun with fallback allowed: {s['fallback_ran']}; still failing: "
        f"{s['fallback_failed']}",
        "",
        "Repro: `POLARS_REPO=<polars git dir> conformance/polars_suite.sh repro '<test id>'` "
        "(one test on shoal strict, long traceback; the venv and snapshot must exist).",
        "",
        f"## Strict failures, top {top} groups",
        "",
        "| # | tests | class | cause (normalised) | sample test | sample message |",
        "|---|---|---|---|---|---|",
    ]
    for n, g in enumerate(result["strict_groups"][:top], 1):
        lines.append(
            f"| {n} | {g['count']} | {_md_cell(g['type'])} | {_md_cell(g['cause'])} | "
            f"`{_md_cell(g['sample'])}` | {_md_cell(g['sample_message'][:160])} |"
        )
    lines += [
        "",
        "## Failures with fallback allowed (wrong answers or crashes, not refusals)",
        "",
        "| # | tests | class | cause (normalised) | sample test | sample message |",
        "|---|---|---|---|---|---|",
    ]
    for n, g in enumerate(result["fallback_groups"][:top], 1):
        lines.append(
            f"| {n} | {g['count']} | {_md_cell(g['type'])} | {_md_cell(g['cause'])} | "
            f"`{_md_cell(g['sample'])}` | {_md_cell(g['sample_message'][:160])} |"
        )
    lines += [
        "",
        "## Unsupported parts (a strict failure counts once under each part it names)",
        "",
    ]
    lines += [f"- {n} {_md_cell(part)}" for part, n in result["unsupported_parts"][:top]]
    lines += ["", "## Of those, what Polars does not show to engines", ""]
    lines += [f"- {n} {_md_cell(part)}" for part, n in result["not_shown_to_engines"]]
    path.write_text("\n".join(lines) + "\n")


# ------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "steps", nargs="+", help="setup native strict fallback report all | repro NODEID..."
    )
    parser.add_argument(
        "--polars-repo",
        default=os.environ.get("POLARS_REPO"),
        help="pola-rs/polars git dir or checkout (env POLARS_REPO)",
    )
    parser.add_argument(
        "--ref",
        default=os.environ.get("POLARS_REF", "HEAD"),
        help="commit of the Polars tests (default HEAD)",
    )
    parser.add_argument(
        "--cache",
        type=Path,
        default=Path(
            os.environ.get(
                "POLARS_SUITE_DIR", Path.home() / ".cache" / "shoal-conformance" / "polars"
            )
        ),
        help="cache directory (env POLARS_SUITE_DIR)",
    )
    parser.add_argument(
        "--paths", nargs="+", default=["tests/unit"], help="test paths relative to py-polars/"
    )
    parser.add_argument(
        "--all-tests",
        action="store_true",
        help="strict: rerun every natively passing test, also those without a collect",
    )
    parser.add_argument(
        "--unselected",
        action="store_true",
        help="strict: run every test under --paths, without waiting for the native run "
        "(the report still counts only natively passing tests)",
    )
    parser.add_argument(
        "--sample",
        type=int,
        default=0,
        help="strict: run only this many of the selected tests, a fixed uniform sample "
        "(by the SHA-1 of the test id)",
    )
    parser.add_argument(
        "--random-order",
        action="store_true",
        help="strict: run the tests in the order of the SHA-1 of their ids (a fixed "
        "shuffle), so that a run stopped early has run a uniform sample",
    )
    parser.add_argument(
        "--time-limit",
        type=int,
        default=0,
        help="stop a pytest run after this many seconds (with --random-order the tests run "
        "by then are a uniform sample)",
    )
    parser.add_argument(
        "--tag", default="", help="strict/fallback/report: use runs/<step>-<tag> (keep several)"
    )
    parser.add_argument("--workers", type=int, default=2, help="pytest-xdist workers (-n)")
    parser.add_argument("--timeout", type=int, default=300, help="per-test timeout, seconds")
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--scan-bytes", type=int, default=4096)
    parser.add_argument("--python", default=sys.executable, help="interpreter for the venv")
    parser.add_argument("--notes", default=None, help="write the grouped failures as Markdown here")
    parser.add_argument("--top", type=int, default=40, help="groups in --notes")
    args = parser.parse_args(argv)
    steps = args.steps
    args.nodeids = []
    if steps[0] == "repro":
        args.nodeids, steps = steps[1:], ["repro"]
    if steps == ["all"]:
        steps = ["setup", "native", "strict", "fallback", "report"]
    args.cache = args.cache.expanduser().resolve()
    args.cache.mkdir(parents=True, exist_ok=True)
    snap = snapshot(args)
    for step in steps:
        if step == "setup":
            setup_venv(args)
        elif step in ("native", "strict", "fallback", "report", "repro"):
            if not venv_python(args).exists():
                setup_venv(args)
            globals()[f"step_{step}"](args, snap)
        else:
            sys.exit(f"polars-suite: unknown step {step!r}")


if __name__ == "__main__":
    main()
