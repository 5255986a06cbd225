"""The README's measured numbers outside its generated block (the losing cases: BMv2 at the
shipped link rate, jumbo frames, sharing a link; how far the emulation is link-bound) are each
the number docs/benchmarks.md gives in the section that measured it. test_readme_numbers.py
holds the generated block to the report; these numbers are written by hand, so this test
keeps a new measurement in the docs from leaving a stale one in the README, and a number
added to the README from going unchecked: every measured number (a ratio `Nx`, a share `N%`,
a time `N s`, `N ms` or `N and N s`, `up to N Mbit/s`) must follow a phrase that names its section.

No Mininet, no root: it reads two committed files."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench.report_readme import README_BEGIN, README_END

ROOT = Path(__file__).resolve().parents[2]

# The phrase of the README that introduces a claim, and the docs/benchmarks.md section that
# measured it. A measured number belongs to the last phrase before it in its paragraph.
SECTIONS = {
    "On BMv2 at the shipped": "## BMv2 at the shipped link rate",
    "Jumbo frames": "## Jumbo frames",
    "Sharing a link": "## Sharing a link",
    "link-bound": "### Where the emulation is faithful",
}
MEASURED = re.compile(
    r"(?<![\w.-])\d+(?:\.\d+)?(?:(?:-| and )\d+(?:\.\d+)?)?(?:x(?!\w)|%| ms\b| s\b)"
    r"|up to (?:about )?\d+ Mbit/s")
PHRASE = re.compile("|".join(re.escape(p) for p in SECTIONS))


def _prose(readme: str) -> list[str]:
    """The README's paragraphs outside the generated block and code fences, one line each."""
    begin, end = readme.find(README_BEGIN), readme.find(README_END)
    if 0 <= begin < end:
        readme = readme[:begin] + readme[end + len(README_END):]
    readme = re.sub(r"^```.*?^```", "", readme, flags=re.M | re.S)
    return [" ".join(p.replace("**", "").split()) for p in re.split(r"\n\s*\n", readme)]


def _section(docs: str, heading: str) -> str:
    """A section's text, up to the next heading of its level or above, one line."""
    level = heading.split()[0]
    m = re.search(rf"^{re.escape(heading)}\n(.*?)(?=^#{{1,{len(level)}}} |\Z)", docs,
                  re.M | re.S)
    assert m, f"docs/benchmarks.md has no section {heading!r}"
    return " ".join(m.group(1).split())


def claims(readme: str) -> list[tuple[str, str]]:
    """(measured number, the section heading it belongs to) for every measured number of
    the README's prose; AssertionError for one that follows no phrase naming a section."""
    found = []
    for para in _prose(readme):
        phrases = [(m.start(), SECTIONS[m.group()]) for m in PHRASE.finditer(para)]
        for m in MEASURED.finditer(para):
            before = [h for at, h in phrases if at < m.start()]
            assert before, (f"README: {m.group()!r} in {para[:60]!r}... is a measured number "
                            "that no phrase ties to a section of docs/benchmarks.md")
            found.append((m.group(), before[-1]))
    return found


def check(readme: str, docs: str) -> None:
    for number, heading in claims(readme):
        assert number in _section(docs, heading), \
            f"README says {number!r}; docs/benchmarks.md {heading!r} does not"


def _files() -> tuple[str, str]:
    return ((ROOT / "README.md").read_text(), (ROOT / "docs" / "benchmarks.md").read_text())


def test_the_readmes_measured_prose_is_what_the_benchmarks_measured():
    readme, docs = _files()
    found = claims(readme)
    # The losing cases stay in the README: BMv2's loss to ring, and the shares of a link.
    assert {h for _, h in found} == set(SECTIONS.values())
    assert ("0.79-1.02x", "## BMv2 at the shipped link rate") in found
    check(readme, docs)


@pytest.mark.parametrize("old, new", [
    ("0.98x ring", "0.97x ring"),             # a ratio edited
    ("51-54% / 46-49%", "51-55% / 45-49%"),   # a share edited
    ("2.37 s a call", "2.38 s a call"),      # a time edited
    ("up to 80 Mbit/s", "up to 90 Mbit/s"),
])
def test_a_number_that_drifts_from_its_section_fails(old, new):
    readme, docs = _files()
    assert old in readme
    with pytest.raises(AssertionError, match="does not"):
        check(readme.replace(old, new, 1), docs)


def test_a_measured_number_tied_to_no_section_fails():
    readme, docs = _files()
    added = readme.replace("Where PASSING does not win:",
                           "PASSING is 9.9x faster on a Tofino. Where PASSING does not win:", 1)
    with pytest.raises(AssertionError, match="no phrase ties"):
        check(added, docs)


def test_a_number_in_another_section_of_the_docs_does_not_count():
    readme, docs = _files()
    # 1.78-2.30x is the model's ratio in the jumbo table; it is not a BMv2-at-100 number.
    moved = readme.replace("0.98x ring", "1.78-2.30x ring", 1)
    assert moved != readme
    assert "1.78-2.30x" in docs
    with pytest.raises(AssertionError, match="BMv2 at the shipped"):
        check(moved, docs)
