"""The docs: every picture a page shows and every local page it links to is a file
committed in the repository, and the generated stage graph is up to date."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([ROOT / "README.md", *ROOT.glob("docs/*.md"), *ROOT.glob("benchmarks/results/*.md")])
LINK = re.compile(r"(!?)\[[^\]]*\]\(([^)\s]+)\)")
#: An HTML image or link (``<img src="...">``, ``<a href="...">``), which markdown allows.
HTML = re.compile(r"<(img|a)\b[^>]*?\b(?:src|href)=[\"']([^\"']+)[\"']", re.IGNORECASE)
CODE = re.compile(r"```.*?```|`[^`\n]*`", re.DOTALL)


def _tracked() -> set[Path] | None:
    """Files git tracks in this checkout (None outside a git checkout): a picture that
    exists here but was never committed is missing for every reader of the repository."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        return None
    out = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, check=True
    ).stdout
    return {(ROOT / p).resolve() for p in out.decode().split("\0") if p}


TRACKED = _tracked()


def _targets(text: str) -> list[tuple[str, str]]:
    """(kind, target) of every markdown and HTML link and image outside code."""
    text = CODE.sub("", text)
    found = [("image" if image else "link", target) for image, target in LINK.findall(text)]
    found += [("image" if tag.lower() == "img" else "link", t) for tag, t in HTML.findall(text)]
    return found


def _missing(page: Path, text: str) -> list[str]:
    missing = []
    for kind, target in _targets(text):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue  # a web address or an anchor on the page
        path = (page.parent / target.split("#", 1)[0]).resolve()
        if not path.exists():
            missing.append(f"{kind} {target}")
        elif ROOT not in path.parents:
            missing.append(f"outside the repository: {target}")
        elif TRACKED is not None and path.is_file() and path not in TRACKED:
            missing.append(f"{kind} {target}: not committed")
    return missing


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_local_links_and_images_exist(page: Path) -> None:
    missing = _missing(page, page.read_text())
    assert not missing, f"{page.relative_to(ROOT)}: {missing}"


def test_the_link_check_catches_what_it_must(tmp_path: Path) -> None:
    """Missing files, HTML images, files outside the repository and files that exist but
    are not committed are all reported; web addresses, anchors and code are not."""
    import os

    page = ROOT / "docs" / "x.md"
    outside = tmp_path / "outside.md"
    outside.write_text("x")
    rel = os.path.relpath(outside, page.parent)
    text = (
        f"![a](img/none.png) <img src='img/none2.svg'> [p]({rel}) "
        "[w](https://example.org/a.png) [s](#section) `![c](img/in-code.png)` "
        "![t](img/trace-tpch-q5.png)"
    )
    got = _missing(page, text)
    assert sorted(got) == sorted(
        ["image img/none.png", "image img/none2.svg", f"outside the repository: {rel}"]
    )
    if TRACKED is not None:
        untracked = ROOT / "docs" / "img" / f"untracked-{tmp_path.name}.png"
        untracked.write_bytes(b"")
        try:
            got = _missing(page, f"![u](img/{untracked.name})")
        finally:
            untracked.unlink()
        assert got == [f"image img/{untracked.name}: not committed"]


def test_stage_graph_in_the_architecture_page_is_up_to_date(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """docs/architecture.md shows TPC-H Q5's stage graph as ``explain(format="mermaid")``
    draws it; regenerated here from the code (``benchmarks/stage_graph.py``)."""
    from benchmarks import stage_graph

    fresh = stage_graph.block(stage_graph.stage_graph(tmp_path_factory.mktemp("tpch-doc")))
    page = stage_graph.page_block(stage_graph.DOC.read_text())
    assert page == fresh, (
        "docs/architecture.md's stage graph is stale: run "
        "`python -m benchmarks.stage_graph --write`"
    )
    # Every arrow joins two stages that the graph declares.
    declared = set(re.findall(r"^\s+(s\d+)\[", fresh, re.MULTILINE))
    for a, b in re.findall(r"^\s+(s\d+) -- \w+ --> (s\d+)$", fresh, re.MULTILINE):
        assert {a, b} <= declared
    assert "bucket" in fresh and "all" in fresh  # a shuffle and a broadcast, as described


# ------------------------------------------------ documented signatures

ROW = re.compile(r"^\| `([A-Za-z_][\w.]*)\(([^`]*)`", re.MULTILINE)


def _first_call(rest: str) -> str:
    """The arguments of the first call in ``rest`` (what follows ``name(``): up to its
    closing parenthesis, so that ``group_by(*keys).agg(...)`` gives ``*keys``."""
    depth = 0
    for i, ch in enumerate(rest):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            if depth == 0:
                return rest[:i]
            depth -= 1
    return rest


def _params(text: str) -> list[str]:
    """The comma-separated items of a documented argument list (top level only)."""
    items, depth, cur, quote = [], 0, "", ""
    for ch in text:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(cur.strip())
            cur = ""
            continue
        cur += ch
    if cur.strip():
        items.append(cur.strip())
    return items


def _signature_problems(shown: str, args: str, fn: object) -> list[str]:
    """Where the documented ``shown(args)`` disagrees with ``inspect.signature(fn)``: an
    argument the function does not take, one shown positional that only a keyword passes,
    one shown after ``*`` that is positional-only, more positional arguments than it has."""
    import inspect

    params = list(inspect.signature(fn).parameters.values())  # type: ignore[arg-type]
    by_name = {p.name: p for p in params}
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    problems = []
    keyword_only, position = False, 0
    for item in _params(args):
        if item in ("...", "/"):
            continue
        if item == "*":
            keyword_only = True
            continue
        if item.startswith("**"):
            if not any(p.kind == p.VAR_KEYWORD for p in params):
                problems.append(f"{shown}: takes no **{item[2:]}")
            continue
        if item.startswith("*"):
            keyword_only = True
            if not any(p.kind == p.VAR_POSITIONAL for p in params):
                problems.append(f"{shown}: takes no {item}")
            continue
        name = item.split("=", 1)[0].strip()
        as_keyword = keyword_only or "=" in item  # name=value: passed by keyword
        real = by_name.get(name)
        if as_keyword:
            if real is None:
                problems.append(f"{shown}: no argument {name!r}")
            elif real.kind == real.POSITIONAL_ONLY:
                problems.append(f"{shown}: {name!r} is positional-only")
            continue
        if real is not None and real.kind == real.KEYWORD_ONLY:
            problems.append(f"{shown}: {name!r} is keyword-only, shown positional")
        elif real is None and position >= len(positional):
            problems.append(f"{shown}: no positional argument {position + 1} ({name!r})")
        position += 1
    return problems


def _api_tables() -> list[tuple[str, str, str, object]]:
    """(page, shown name, arguments, function) of each API table row whose call the code
    defines: shoal.duckdb's functions, shoal_polars' engine and to_ir, the IR builder's
    Frame methods, and ``shoal.udf``."""
    import shoal
    import shoal_duckdb
    import shoal_polars
    from shoal.plan.builder import Frame

    owners: dict[str, list[object]] = {
        "docs/duckdb.md": [shoal_duckdb],
        "docs/polars.md": [shoal_polars],
        "docs/ir.md": [Frame],
    }
    rows = []
    for page, places in owners.items():
        for name, rest in ROW.findall((ROOT / page).read_text()):
            fn = next((getattr(o, name) for o in places if hasattr(o, name)), None)
            if fn is not None and callable(fn):
                rows.append((page, name, _first_call(rest), fn))
    udf_page = (ROOT / "docs" / "udf.md").read_text()
    (args,) = re.findall(r"`@shoal\.udf\(([^`]*)\)`", udf_page)
    rows.append(("docs/udf.md", "shoal.udf", args, shoal.udf))
    return rows


def test_documented_signatures_match_the_code() -> None:
    rows = _api_tables()
    assert {r[1] for r in rows} >= {"sql", "explain", "register_udf", "DistEngine", "join"}
    problems = [p for page, name, args, fn in rows for p in _signature_problems(name, args, fn)]
    assert not problems, problems


def test_the_signature_check_catches_what_it_must() -> None:
    def f(con: object, udf: object, /, *, parameters: object = None) -> None: ...

    def g(*, return_dtype: object, num_cpus: float = 1) -> None: ...

    assert _signature_problems("f", "con, udf, *, parameters=None", f) == []
    assert _signature_problems("f", "con, name, fn, ...", f) == [
        "f: no positional argument 3 ('fn')"
    ]
    assert _signature_problems("f", "con, *, udf=None", f) == ["f: 'udf' is positional-only"]
    assert _signature_problems("g", "return_dtype, *, num_cpus=1", g) == [
        "g: 'return_dtype' is keyword-only, shown positional"
    ]
    assert _signature_problems("g", "*, return_dtype, gpus=0", g) == ["g: no argument 'gpus'"]
