"""The documentation reads on GitHub as it is: every relative link resolves inside the repository, nothing links
outside it, the README stays short, and its quickstart names files that exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")), REPO / "helm" / "README.md",
         REPO / "schemas" / "README.md"]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to dashes."""
    found = set()
    for line in page.read_text().splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            found.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves_inside_the_repository(page: Path) -> None:
    broken = []
    for target in LINK.findall(page.read_text()):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if REPO not in resolved.parents and resolved != REPO:
            broken.append(f"{target}: outside the repository")
        elif not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
            broken.append(f"{target}: no heading #{anchor} in {resolved.name}")
    assert not broken, "\n  ".join(broken)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_nothing_points_at_material_users_do_not_have(page: Path) -> None:
    text = page.read_text()
    assert "shared/reference" not in text and "analysis-00" not in text


def test_the_readme_is_short_and_its_quickstart_names_real_files() -> None:
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    block = text.split("<!-- quickstart:", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    files = re.findall(r"(docs/examples/\S+)", block)
    assert files and all((REPO / f).exists() for f in files), files
