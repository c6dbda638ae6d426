"""The docs a user reads: a short README that links a page per capability, links that lead
somewhere, and the generated spec reference in step with the schema."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from trainfleet.capabilities import CAPABILITIES
from trainfleet.schema import reference_markdown

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = REPO / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md"))]
README_MAX_LINES = 250

FENCE = re.compile(r"^```.*?^```", re.S | re.M)
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*$", re.M)


def prose(text: str) -> str:
    """The text outside code blocks (a link inside one is shown, not followed)."""
    return FENCE.sub("", text)


def links(page: Path) -> list[str]:
    """Every inline link and image target of a page, outside code."""
    return LINK.findall(CODE_SPAN.sub("", prose(page.read_text())))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but '-' and '_' dropped,
    spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found: set[str] = set()
    for heading in HEADING.findall(prose(page.read_text())):
        base, n = slug(heading), 0
        while (candidate := base if n == 0 else f"{base}-{n}") in found:
            n += 1
        found.add(candidate)
    # Explicit anchors (`<a id="hang"></a>`): short, stable names for long message headings.
    return found | set(re.findall(r'<a id="([^"]+)">', page.read_text()))


def relative(target: str) -> bool:
    return not re.match(r"^[a-z][a-z0-9+.-]*:", target)  # https:, mailto:


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_leads_somewhere(page):
    broken = []
    for target in filter(relative, links(page)):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.relative_to(REPO)}")
    assert broken == [], f"{page.relative_to(REPO)}: broken links"


def test_a_broken_link_and_a_missing_anchor_are_found(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# A `title`, here\n[ok](#a-title-here) [no](#nope) [gone](gone.md)\n")
    assert anchors(page) == {"a-title-here"}
    assert links(page) == ["#a-title-here", "#nope", "gone.md"]
    assert slug("The SSH mesh in drift") == "the-ssh-mesh-in-drift"


def test_the_readme_is_short():
    lines = len(README.read_text().splitlines())
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines (at most {README_MAX_LINES}): move detail to docs/"
    )


@pytest.mark.parametrize("capability", CAPABILITIES, ids=lambda c: c.name)
def test_every_capability_has_a_page_linked_from_the_readme_table(capability):
    name = capability.name
    assert (DOCS / f"{name}.md").is_file(), f"docs/{name}.md is missing"
    rows = [line for line in README.read_text().splitlines() if line.startswith("|")]
    assert any(f"(docs/{name}.md)" in row and f"`{name}`" in row for row in rows), (
        f"README's capability table has no row for `{name}` linking docs/{name}.md"
    )


def test_the_spec_reference_matches_the_schema():
    assert (DOCS / "spec.md").read_text() == reference_markdown() + "\n", (
        "docs/spec.md is stale: regenerate it with `trainfleet schema > docs/spec.md` "
        "(or `python -m trainfleet schema > docs/spec.md`)"
    )


def test_the_example_spec_shown_is_the_file():
    page = (DOCS / "your-cluster.md").read_text()
    example = (REPO / "inventories/prod.yml").read_text()
    assert f"```yaml\n{example}```" in page, (
        "docs/your-cluster.md's example differs from inventories/prod.yml: paste the file"
    )
