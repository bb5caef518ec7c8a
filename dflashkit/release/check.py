"""``dflash-release --check OUTDIR``: the release folder is what its record says — a CI step for a model repository.

Checked: ``release.json`` reads; the card is exactly the card its figures render (`card.render_card`), so an edited
figure in either is found, named by its line; every file the record lists exists and has the recorded checksum;
``SHA256SUMS`` lists them and matches every byte.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from ..errors import DFlashError
from ..files import read_json
from .card import render_card, sha256_of
from .run import CARD, FORMAT, RECORD, SUMS

_SUM_LINE = re.compile(r"^([0-9a-f]{64}) [ *](.+)$")


def check_release(outdir: str | os.PathLike) -> list[str]:
    """Every problem found, one line each (empty: the release checks out). A folder that holds no release at all is
    a `DFlashError`."""
    out = Path(outdir)
    if not (out / RECORD).is_file():
        raise DFlashError(f"{out}: no {RECORD} — not a dflashkit release folder")
    record = read_json(out / RECORD)
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise DFlashError(f"{out / RECORD}: not a dflashkit release record")
    problems: list[str] = []
    if not record.get("complete"):
        problems.append(f"{out / RECORD}: the release did not finish (run dflash-release again to complete it)")
    jobs = record.get("jobs", {})
    for t in record.get("types", []):
        job = jobs.get(t)
        if job is None:
            problems.append(f"{out / RECORD}: no record of type {t}")
            continue
        path = out / job["file"]
        if not path.is_file():
            problems.append(f"{path}: missing (type {t})")
        elif sha256_of(path) != job.get("sha256"):
            problems.append(f"{path}: its bytes changed since the release (sha256 differs from {RECORD})")
    card = out / CARD
    if not card.is_file():
        problems.append(f"{card}: missing")
    else:
        try:
            expected = render_card(record).splitlines()
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise DFlashError(f"{out / RECORD}: a figure is missing or of the wrong kind ({type(exc).__name__}: "
                              f"{exc}) — the record was edited") from None
        got = card.read_text(encoding="utf-8", errors="replace").splitlines()
        for i, (a, b) in enumerate(zip(got, expected), 1):
            if a != b:
                problems.append(f"{card}:{i}: the card says {a[:160]!r}, {RECORD} gives {b[:160]!r}")
                break
        else:
            if len(got) != len(expected):
                problems.append(f"{card}: {len(got)} lines, the card {RECORD} renders has {len(expected)}")
    sums = out / SUMS
    if not sums.is_file():
        problems.append(f"{sums}: missing")
        return problems
    listed = {}
    for n, line in enumerate(sums.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        m = _SUM_LINE.match(line)
        if not m:
            problems.append(f"{sums}:{n}: not a sha256sum line")
            continue
        listed[m.group(2)] = m.group(1)
    for name in [*(jobs[t]["file"] for t in record.get("types", []) if t in jobs), CARD, RECORD]:
        if name not in listed:
            problems.append(f"{sums}: does not list {name}")
        elif (out / name).is_file() and sha256_of(out / name) != listed[name]:
            problems.append(f"{out / name}: does not match its line in {SUMS}")
    return problems
