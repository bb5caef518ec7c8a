"""The manual against the code: every relative link of README.md and docs/ resolves, and every ``--option`` a page
gives a dflashkit command exists in that command's ``--help`` (used by tests/test_docs.py, which also plants a bad
page to show both checks fail).

Which options are checked: in any line or inline code span that names a command (``dflash-convert … --outtype``),
the options after the name belong to it; on a command's own page (``docs/commands/dflash-X.md``), an inline code
span that starts with an option (```--strict```) is that command's too, unless it belongs to another program the page
describes (`FOREIGN`: llama.cpp's and pip's flags).
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_CODE_SPAN = re.compile(r"`([^`]+)`")
_OPTION = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")
_COMMAND = re.compile(r"\b(dflash-(?:convert|quantize|inspect|diff|parity|accept|release))\b")

#: options of other programs the pages describe: llama.cpp's, pip's, pytest's, cmake's
FOREIGN = frozenset({
    "--spec-type", "--spec-draft-n-max", "--spec-draft-model", "--no-repack", "--model-draft", "--draft-max",
    "--ctx-size", "--threads", "--port", "--host", "--no-deps", "--no-binary", "--ignore-eos", "--verbose",
    "--spec-draft-type-k", "--spec-draft-type-v", "--cache-type-k-draft", "--cache-type-v-draft", "--no-escape",
    "--lib-dir", "--check", "--durations", "--outfile", "--spec-draft-n-min", "--temp", "--top-k", "--parallel",
    "--n-predict", "--prompt", "--file", "--model", "--spec-draft-p-min", "--draft-p-min", "--batch-size",
    "--ubatch-size", "--seed", "--log-disable", "--ref", "--target", "--fa", "--jinja", "--no-mmap", "--remote",
})


def command_options() -> dict[str, set[str]]:
    """Every option each dflash command takes (its click parameters' names, ``--help`` included)."""
    from dflashkit import cli

    commands = {"dflash-convert": cli.convert_command, "dflash-quantize": cli.quantize_command,
                "dflash-inspect": cli.inspect_command, "dflash-diff": cli.diff_command,
                "dflash-parity": cli.parity_command, "dflash-accept": cli.accept_command,
                "dflash-release": cli.release_command}
    out = {}
    for name, cmd in commands.items():
        opts = {"--help"}
        for p in cmd.params:
            opts.update(o for o in [*p.opts, *getattr(p, "secondary_opts", [])] if o.startswith("--"))
        out[name] = opts
    return out


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def broken_links(page: Path) -> list[str]:
    problems = []
    text = page.read_text(encoding="utf-8")
    in_fence = False
    for n, line in enumerate(text.splitlines(), 1):
        if line.startswith("`````") or line.startswith("```"):
            in_fence = not in_fence
        if in_fence:
            continue
        for href in _LINK.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", href) or href.startswith("#"):
                continue  # a URL or an anchor of the page itself
            target = (page.parent / href.split("#", 1)[0]).resolve()
            if not target.exists():
                problems.append(f"{page.relative_to(ROOT) if page.is_relative_to(ROOT) else page}:{n}: "
                                f"link {href} does not resolve")
    return problems


def unknown_options(page: Path, options: dict[str, set[str]]) -> list[str]:
    problems = []
    own = page.stem if page.parent.name == "commands" else None
    text = page.read_text(encoding="utf-8")
    where = page.relative_to(ROOT) if page.is_relative_to(ROOT) else page
    for n, line in enumerate(text.splitlines(), 1):
        # a line naming a command: the options after the name are that command's
        pieces = _COMMAND.split(line)
        for i in range(1, len(pieces) - 1, 2):
            command, rest = pieces[i], pieces[i + 1]
            # up to the end of its code span or sentence (a backtick or a pipe ends it)
            rest = re.split(r"`|\|(?! )|\s\|\s", rest, maxsplit=1)[0]
            for opt in _OPTION.findall(rest):
                if opt not in options[command] and opt not in FOREIGN:
                    problems.append(f"{where}:{n}: {command} has no option {opt}")
        others = {c for c in _COMMAND.findall(line) if c != own}
        if own is not None and own in options and not others:  # a line about another command speaks of its options
            for span in _CODE_SPAN.findall(line):
                m = re.match(r"^(--[a-z][a-z0-9-]*)", span.strip())
                if m and m.group(1) not in options[own] and m.group(1) not in FOREIGN and not _COMMAND.search(span):
                    problems.append(f"{where}:{n}: {own} has no option {m.group(1)}")
    return problems
