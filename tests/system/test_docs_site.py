"""The docs site (mkdocs.yml, docs/) builds with ``mkdocs build --strict``, and the README
stays the short front page that points into it (CONTRIBUTING.md, "The docs").

Strict, with mkdocs.yml's ``validation`` at ``warn``: a link to a page or an anchor that does
not exist, a page of docs/ left out of the nav or a nav entry with no page fails the build.
The build runs in this process, into a temporary directory: nothing lands in the checkout.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from mkdocs.commands.build import build
from mkdocs.config import load_config

ROOT = Path(__file__).resolve().parents[2]
README_LINES = 300  # what it is, the install, the quick starts, the guarantees, the links
LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_the_site_builds_strict(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_MKDOCS_2_WARNING", "1")  # the theme's notice about its own future
    site = tmp_path / "site"
    config = load_config(str(ROOT / "mkdocs.yml"), site_dir=str(site), strict=True)
    build(config)  # raises mkdocs.exceptions.Abort after any warning; the log names each
    pages = {path.relative_to(ROOT / "docs").with_suffix("") for path in (ROOT / "docs").glob("*.md")}
    built = {path.parent.relative_to(site) for path in site.rglob("index.html")}
    assert {Path(".") if page.name == "index" else page for page in pages} <= built


def test_the_readme_is_short_and_its_links_resolve() -> None:
    readme = (ROOT / "README.md").read_text("utf-8")
    assert len(readme.splitlines()) <= README_LINES
    targets = [target for target in LINK.findall(readme) if not re.match(r"[a-z]+:", target)]
    assert any(target.startswith("docs/") for target in targets)
    missing = [target for target in targets if not (ROOT / target.split("#", 1)[0]).exists()]
    assert missing == []
