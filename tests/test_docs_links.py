"""The README stays short and every link in it and in docs/*.md resolves.

* README.md is at most :data:`MAX_README_LINES` lines, and its first 40 lines hold the two set-up
  commands and a sample of what the main job prints.
* Every relative link ``[text](path#anchor)`` of README.md and docs/*.md names a file or folder of
  the repository, and an ``#anchor`` names a heading of the linked Markdown file, slugged the way
  GitHub does (:func:`github_slug`: github-slugger's rules, duplicates numbered ``-1``, ``-2``, …).
  Links inside code spans and code blocks are not links.
* The README's "Documentation" section links every page of docs/.

What the commands in those files' code blocks do is tests/test_readme.py's part.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest

from viasd.paths import PROJECT_ROOT

README = PROJECT_ROOT / "README.md"
DOCS = sorted((PROJECT_ROOT / "docs").glob("*.md"))
MAX_README_LINES = 300
FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,}).*?^ {0,3}\1[ \t]*$", re.M | re.S)
LINK = re.compile(r"(?<!!)\[((?:[^\[\]]|\[[^\]]*\])*)\]\(([^()\s]*(?:\([^()\s]*\)[^()\s]*)*)(?:\s+\"[^\"]*\")?\)")
KEPT_CATEGORIES = ("L", "M", "Nd", "Nl", "Pc")  # letters, marks, digits, letter numbers, connectors (_)


def github_slug(text: str) -> str:
    """GitHub's anchor for a heading whose rendered text is ``text``: lower case; every character that is
    not a letter, mark, decimal or letter number, connector punctuation, ``-`` or a space removed; spaces
    to ``-`` (github-slugger, the rules GitHub renders README anchors with)."""
    kept = (c for c in text.lower() if c in "- " or unicodedata.category(c).startswith(KEPT_CATEGORIES))
    return "".join(kept).replace(" ", "-")


def rendered(markdown: str) -> str:
    """The text of a heading as GitHub renders it: code spans keep their content, links their text,
    emphasis markers and closing ``#``s go."""
    text = re.sub(r"\s+#+\s*$", "", markdown.strip())
    text = re.sub(r"(`+)(.+?)\1", lambda m: m.group(2).strip(), text)
    text = LINK.sub(lambda m: m.group(1), text)
    return re.sub(r"(\*{1,3}|(?<!\w)_{1,3}|_{1,3}(?!\w))", "", text).strip()


def prose(markdown: str) -> str:
    """``markdown`` without its fenced code blocks, HTML comments and code spans (whose text is no link)."""
    text = FENCE.sub("", markdown)
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    return re.sub(r"(`+)(.+?)\1", "code", text, flags=re.S)


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a Markdown file (ATX headings outside code blocks, duplicates numbered)."""
    seen: dict[str, int] = {}
    out = set()
    for m in re.finditer(r"^ {0,3}#{1,6}[ \t]+(.+)$", FENCE.sub("", path.read_text(encoding="utf-8")), re.M):
        slug = github_slug(rendered(m.group(1)))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def links(path: Path) -> list[str]:
    """The targets of the relative links in a Markdown file (no scheme, no mail)."""
    targets = [m.group(2) for m in LINK.finditer(prose(path.read_text(encoding="utf-8")))]
    return [t for t in targets if t and not re.match(r"^[a-z][a-z0-9+.-]*:", t, re.I)]


def broken_links(path: Path) -> list[str]:
    """Each relative link of ``path`` whose file or heading does not exist, with the reason."""
    bad = []
    for target in links(path):
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            bad.append(f"{target}: no file {dest.relative_to(PROJECT_ROOT) if dest.is_relative_to(PROJECT_ROOT) else dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target}: no heading with anchor #{anchor} in {dest.name}")
    return bad


def test_github_slug_follows_githubs_rules():
    assert github_slug(rendered("Replay, load-free speed and paired statistics")) == "replay-load-free-speed-and-paired-statistics"
    assert github_slug(rendered("1. Rejection rate 0.10–0.22 below Cascade SD / Faster Cascades")) == \
        "1-rejection-rate-010022-below-cascade-sd--faster-cascades"
    assert github_slug(rendered("Your own checkpoint (`pair=hf`)")) == "your-own-checkpoint-pairhf"
    assert github_slug(rendered("§7 Load-free speed (the cost model)")) == "7-load-free-speed-the-cost-model"
    assert github_slug(rendered("VIA-SD's τ frontier")) == "via-sds-τ-frontier"
    assert github_slug(rendered("**Bold** and [a link](x.md) and snake_case")) == "bold-and-a-link-and-snake_case"


def test_duplicate_headings_are_numbered(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("# A\n\n## A\n\n```bash\n# A comment, not a heading\n```\n## B\n", encoding="utf-8")
    assert anchors(page) == {"a", "a-1", "b"}


def test_broken_links_are_found(tmp_path):
    (tmp_path / "other.md").write_text("# Here it is\n", encoding="utf-8")
    page = tmp_path / "p.md"
    page.write_text("# Top\n[ok](other.md#here-it-is) [self](#top) [web](https://example.org/x#y) `[code](no.md)`\n"
                    "[gone](missing.md) [bad anchor](other.md#nowhere) [bad self](#bottom)\n", encoding="utf-8")
    assert [b.split(":")[0] for b in broken_links(page)] == ["missing.md", "other.md#nowhere", "#bottom"]


@pytest.mark.parametrize("path", [README, *DOCS], ids=lambda p: str(p.relative_to(PROJECT_ROOT)))
def test_every_relative_link_resolves(path):
    assert not broken_links(path), f"broken links in {path.relative_to(PROJECT_ROOT)}: {broken_links(path)}"


def test_readme_is_short_and_starts_with_the_two_commands():
    lines = README.read_text(encoding="utf-8").split("\n")
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines (at most {MAX_README_LINES}): move detail to docs/"
    head = "\n".join(lines[:40])
    assert "make run" in head and "make test" in head
    assert re.search(r"```text\n.*outputs identical to ar token for token.*?```", head, re.S), \
        "the first 40 lines of README.md show what the main job prints (a ```text block)"


def test_readme_documentation_section_links_every_page():
    text = README.read_text(encoding="utf-8")
    section = re.search(r"^## Documentation\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert section, "README.md has a '## Documentation' section (the index of docs/)"
    listed = {Path(t.partition("#")[0]).name for t in links(README) if t.startswith("docs/") and t in section.group(1)}
    missing = [p.name for p in DOCS if p.name not in listed]
    assert not missing, f"README's Documentation section does not link {missing}: add one line per page"
