"""The docs: every picture a page shows and every local page it links to exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([ROOT / "README.md", *ROOT.glob("docs/*.md"), *ROOT.glob("benchmarks/results/*.md")])
LINK = re.compile(r"(!?)\[[^\]]*\]\(([^)\s]+)\)")
CODE = re.compile(r"```.*?```|`[^`\n]*`", re.DOTALL)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_local_links_and_images_exist(page: Path) -> None:
    missing = []
    for image, target in LINK.findall(CODE.sub("", page.read_text())):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue  # a web address or an anchor on the page
        path = (page.parent / target.split("#", 1)[0]).resolve()
        if not path.exists():
            missing.append(("image " if image else "link ") + target)
        elif ROOT not in path.parents:
            missing.append(f"outside the repository: {target}")
    assert not missing, f"{page.relative_to(ROOT)}: {missing}"
