"""The README and docs/ show space files that parse and links that lead somewhere.

Convention (docs/testing.md): a fenced ```yaml block whose first line is exactly
`# space file` is a space file, and is parsed with `search.definition.space.parse_space`. A YAML block
whose top-level keys are all space-file sections must carry that marker, so an example can
not slip past this test by leaving it out. Relative links (`[text](path)`, `![alt](path)`)
must name an existing file, and an `#anchor` into a Markdown page one of its headings.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from search.definition.space import parse_space
from trainable.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
MARKER = "# space file"
SECTIONS = {"experiment", "resources", "model", "data", "training", "space"}
FENCE = re.compile(r"^[ \t]*```(\w*)[ \t]*\n(.*?)^[ \t]*```[ \t]*$", re.M | re.S)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def where(page: Path, text: str, offset: int) -> str:
    """file:line of an offset into the page's text."""
    return f"{page.relative_to(REPO)}:{text.count(chr(10), 0, offset) + 1}"


def yaml_blocks(page: Path) -> list[tuple[str, str]]:
    """(file:line of the opening fence, body) of every ```yaml block."""
    text = page.read_text()
    return [(where(page, text, m.start()), m[2]) for m in FENCE.finditer(text) if m[1] in ("yaml", "yml")]


def is_marked(body: str) -> bool:
    return body.lstrip("\n").split("\n", 1)[0].strip() == MARKER


def space_blocks() -> list[tuple[str, str]]:
    return [(at, body) for page in PAGES for at, body in yaml_blocks(page) if is_marked(body)]


def test_the_docs_show_space_files():
    assert space_blocks(), f"no ```yaml block starting with {MARKER!r} in README.md or docs/*.md"


@pytest.mark.parametrize("at, body", space_blocks(), ids=[at for at, _ in space_blocks()])
def test_every_space_file_block_parses(at, body):
    try:
        raw = yaml.safe_load(body)
        parse_space(raw, source=str(REPO / at.rsplit(":", 1)[0]))
    except (yaml.YAMLError, ConfigError) as error:
        pytest.fail(f"{at}: the space file block does not parse:\n{error}")


def test_blocks_that_look_like_space_files_are_marked():
    unmarked = []
    for page in PAGES:
        for at, body in yaml_blocks(page):
            if is_marked(body):
                continue
            try:
                raw = yaml.safe_load(body)
            except yaml.YAMLError:
                continue  # not checked as a space file; a YAML fragment of something else
            if isinstance(raw, dict) and raw and set(raw) <= SECTIONS:
                unmarked.append(at)
    assert not unmarked, f"space files without a first line {MARKER!r} (so never parsed): {unmarked}"


def relative_links(page: Path) -> list[tuple[str, str]]:
    text = page.read_text()
    outside_code = FENCE.sub(lambda m: "\n" * m[0].count("\n"), text)  # links in code blocks are code
    links = []
    for m in LINK.finditer(outside_code):
        target = m[1]
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # https:, mailto:, or an anchor on the same page
        links.append((where(page, outside_code, m.start()), target))
    return links


def anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces as '-'."""
    text = FENCE.sub("", page.read_text())
    return {re.sub(r"[^\w\- ]", "", m[1].strip().lower()).replace(" ", "-")
            for m in re.finditer(r"^#{1,6}\s+(.*)$", text, re.M)}


def test_the_docs_have_relative_links():
    assert any(relative_links(page) for page in PAGES), "no relative link found: the link check checks nothing"


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES])
def test_relative_links_point_at_existing_files_and_headings(page):
    broken = []
    for at, target in relative_links(page):
        path, _, anchor = target.partition("#")
        linked = page.parent / path
        if not linked.exists():
            broken.append(f"{at}: {target} (no such file)")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{at}: {target} (no such heading in {path})")
    assert not broken, "broken links:\n" + "\n".join(broken)
