"""README.md stays a front page and every guide under docs/ is in the site's menu (mkdocs.yml).

`bash dev.sh lint` builds the site with `mkdocs build --strict`, which checks the links between pages;
these checks are the ones a reader of the repository meets first, and run in a millisecond.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
README_MAX_LINES = 210  # about 200: what it is, the two commands, a screenshot, a first job, presets, links
LINK = re.compile(r"\]\(([^)\s]+)\)")


def nav_pages(nav) -> list[str]:
    """Every page a mkdocs nav names, at any depth (entries are "page.md", {title: "page.md"} or {title: [...]})."""
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, list):
        return [page for entry in nav for page in nav_pages(entry)]
    if isinstance(nav, dict):
        return [page for value in nav.values() for page in nav_pages(value)]
    return []


def test_the_readme_is_a_front_page():
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines (at most {README_MAX_LINES}): move the details to a guide under docs/"
    )
    text = "\n".join(lines)
    assert "bash dev.sh demo" in text and "bash dev.sh test" in text


def test_every_guide_is_in_the_nav_and_every_nav_entry_exists():
    nav = nav_pages(yaml.safe_load((REPO / "mkdocs.yml").read_text(encoding="utf-8"))["nav"])
    pages = sorted(path.relative_to(DOCS).as_posix() for path in DOCS.rglob("*.md"))
    missing = [page for page in pages if page not in nav]
    assert missing == [], f"add these pages to mkdocs.yml's nav: {missing}"
    absent = [page for page in nav if not (DOCS / page).is_file()]
    assert absent == [], f"mkdocs.yml's nav names pages that do not exist under docs/: {absent}"


def test_the_readme_links_every_guide_and_its_links_reach_files():
    """README.md sits outside the site, so mkdocs does not check its links: a moved guide would break them."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    targets = {link.split("#")[0] for link in LINK.findall(text) if "://" not in link}
    broken = sorted(target for target in targets if not (REPO / target).exists())
    assert broken == [], f"README.md links to files that do not exist: {broken}"
    nav = nav_pages(yaml.safe_load((REPO / "mkdocs.yml").read_text(encoding="utf-8"))["nav"])
    unlinked = [page for page in nav if page != "index.md" and f"docs/{page}" not in targets]
    assert unlinked == [], f"README.md's Guides leave out {unlinked}"
