"""The manual cannot drift from the code: README.md and docs/ have no broken relative link, and every option a page
gives a dflash command exists in that command (tests/docs_check.py); a planted bad page shows both checks fail."""

from __future__ import annotations

from pathlib import Path

import pytest

import docs_check

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def options() -> dict[str, set[str]]:
    return docs_check.command_options()


@pytest.mark.parametrize("page", docs_check.pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_resolves_and_every_option_exists(page: Path, options: dict[str, set[str]]) -> None:
    assert docs_check.broken_links(page) + docs_check.unknown_options(page, options) == []


def test_the_readme_is_a_front_door() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 250
    for page in ("dflash-convert", "dflash-quantize", "dflash-inspect", "dflash-diff", "dflash-parity",
                 "dflash-accept", "dflash-release"):
        assert f"(docs/commands/{page}.md)" in "\n".join(lines), page


def test_a_planted_bad_page_fails_both_checks(tmp_path: Path, options: dict[str, set[str]]) -> None:
    commands = tmp_path / "docs" / "commands"
    commands.mkdir(parents=True)
    page = commands / "dflash-convert.md"
    page.write_text("# dflash-convert\n\nSee [the guarantees](../guarantees.md) and [nothing](../no-such-page.md).\n\n"
                    "```bash\ndflash-convert SRC OUT.gguf --outtype bf16 --no-such-flag\n```\n\n"
                    "`--strict` refuses NaN; `--made-up 3` does not exist.\n")
    (tmp_path / "docs" / "guarantees.md").write_text("# fine\n")
    assert docs_check.broken_links(page) == [f"{page}:3: link ../no-such-page.md does not resolve"]
    assert docs_check.unknown_options(page, options) == [
        f"{page}:6: dflash-convert has no option --no-such-flag",
        f"{page}:9: dflash-convert has no option --made-up",
    ]


def _outside_citations(root: Path) -> list[str]:
    """Every line of the repository's code and text that cites a document the repository does not hold: a
    workspace notes file (``zoo`` + ``.md``, or one of its numbered sections) or a folder beside the clone (``..`` + ``/shared``)."""
    import re

    cite = re.compile(r"\bzoo(\.md)?\s*§|\bzoo\.md\b|\.\./" + "shared\\b")
    skip = {".git", "__pycache__", ".venv", "build", "dist"}
    found = []
    for path in sorted(root.rglob("*")):
        if skip & set(path.relative_to(root).parts) or path.suffix not in {".py", ".md", ".toml", ".txt", ".sh", ""}:
            continue
        if not path.is_file() or path.stat().st_size > 2 << 20:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        found += [f"{path.relative_to(root)}:{n}" for n, line in enumerate(text.splitlines(), 1) if cite.search(line)]
    return found


def test_the_repository_cites_nothing_outside_itself(tmp_path: Path) -> None:
    assert _outside_citations(ROOT) == []
    planted = tmp_path / "docs"
    planted.mkdir()
    zoo = "zoo"  # (spelt apart: this file must not cite them itself)
    (planted / "page.md").write_text(f"fine\nas {zoo} §9 says\nsee {zoo}.md\nread ../" + "shared/dialects.md\n")
    assert _outside_citations(tmp_path) == ["docs/page.md:2", "docs/page.md:3", "docs/page.md:4"]
