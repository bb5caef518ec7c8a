"""``dflash-release --check OUTDIR``: the release folder is what its record says — a CI step for a model repository.

Checked, reading nothing outside OUTDIR (`inside`: base names, no links, regular files, bounded reads):

- ``release.json`` reads and fits the schema (`schema`): types, ranges, finite numbers, bounded lengths;
- every figure that can be re-derived from the folder is: each file's size and checksum, its parameter count and
  bits per weight (from the GGUF's header), τ's mean from its per-prompt values, each llama-server figure (τ, the
  acceptance rate, the speed-up, its CI and its verdict from the per-prompt speeds), the recommended type and the
  rule that chose it, and by context τ through llama-server from its per-prompt values;
- the card is exactly the card the record renders (`card.render_card`), so an edited figure in either is found,
  named by its line; with ``--context`` the card's by-context and by-concurrency tables are derived from the
  record's per-prompt and per-batch values, and the picture beside it is drawn again and compared byte for byte;
- ``SHA256SUMS`` lists exactly the release's files with their checksums: a line that ``sha256sum -c`` would fail
  on — a missing or foreign file, a path (``../../etc/passwd``), a wrong sum, a malformed line — fails here too,
  without reading what it names (a file whose size is not the record's is not hashed);
- OUTDIR holds nothing else: a file no list names would be uploaded with the release unverified.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from pathlib import Path
from typing import Any

from ..errors import DFlashError
from ..files import MAX_JSON_CONTAINERS, json_container_count
from .card import recommended, recommended_by_speed, render_card
from .outdir import entries
from .inside import NotInside, read_inside, sha256_inside
from .run import CARD, RECORD, SUMS, TIMINGS, release_types
from .schema import RecordError, validate_record
from .serving_record import MEASURED, speedup_of, verdict_of
from .sweeps import PICTURE, picture

_SUM_LINE = re.compile(r"^([0-9a-fA-F]{64}) [ *](.+)$")
MAX_CARD_BYTES = 1 << 20
MAX_SUMS_BYTES = 64 << 10
MAX_RECORD_BYTES = 64 << 20


def _read_record(out: Path) -> tuple[dict[str, Any], bytes]:
    """The validated record and its bytes (SHA256SUMS' line for it is checked against these very bytes)."""
    path = out / RECORD
    try:
        raw = read_inside(out, RECORD, MAX_RECORD_BYTES)
    except NotInside as exc:
        if str(exc) == "missing":
            raise DFlashError(f"{out}: no {RECORD} — not a dflashkit release folder") from None
        raise DFlashError(f"{path}: {exc}") from None
    if json_container_count(raw) > MAX_JSON_CONTAINERS:
        raise DFlashError(f"{path}: over {MAX_JSON_CONTAINERS} objects/arrays — not a release record")
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        raise DFlashError(f"{path}: not a dflashkit release record ({(str(exc).splitlines() or [''])[0][:200]})") \
            from None
    try:
        return validate_record(doc, str(path), release_types()), raw
    except RecordError as exc:
        raise DFlashError(str(exc)) from None


def _tau_differs(recorded: float | None, per_prompt: list[float | None]) -> float | None:
    """The mean τ of ``per_prompt`` (null: a prompt without a round) where ``recorded`` is not it (null where there
    is none); None where it is."""
    from ..llama_cpp.speculative_simple import mean_tau

    mean = mean_tau([math.nan if x is None else x for x in per_prompt])
    if (recorded is None) == (not math.isfinite(mean)) and (recorded is None or recorded == mean):
        return None
    return mean


def _gguf_figures(path: Path) -> tuple[int, float | None, Any] | str:
    """(parameters, bits per weight, the drafter's block size) from the file's header — the block size bounds every
    τ the record may hold, so it is the file's, never the record's word."""
    from ..dialects import detect_dialect, unstored_defaults
    from ..io.gguf_reader import open_gguf

    try:
        with open_gguf(path) as g:
            elements = sum(t.n_elements for t in g.tensors.values())
            tensor_bytes = sum(t.nbytes for t in g.tensors.values())
            arch = g.get("general.architecture")
            dialect = detect_dialect(arch if isinstance(arch, str) else None)
            key = dialect.key_for_field("block_size", arch) if dialect is not None else None
            block = g.get(key) if key is not None else unstored_defaults(arch if isinstance(arch, str) else None).get(
                "block_size")
    except (DFlashError, OSError) as exc:
        return f"does not read as a GGUF ({str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__})"
    return elements, (round(8 * tensor_bytes / elements, 4) if elements else None), block


def _check_files(out: Path, record: dict[str, Any], problems: list[str]) -> dict[str, str | NotInside]:
    """Each type's file against its record; returns what hashing each file gave (its sha256, or why it was not
    read), so that SHA256SUMS is checked against the same reading."""
    hashed: dict[str, str | NotInside] = {}
    for t in record["types"]:
        job = record["jobs"].get(t)
        if job is None:
            problems.append(f"{out / RECORD}: no record of type {t}")
            continue
        path = out / job["file"]
        try:  # the size the record gives first: a 1 TB file is not hashed to learn it differs
            hashed[job["file"]] = sha256_inside(out, job["file"], job["size_bytes"])
        except NotInside as exc:
            hashed[job["file"]] = exc
            problems.append(f"{path}: {exc} (type {t})")
            continue
        if hashed[job["file"]] != job["sha256"]:
            problems.append(f"{path}: its bytes changed since the release (sha256 differs from {RECORD})")
            continue
        figures = _gguf_figures(path)
        if isinstance(figures, str):
            problems.append(f"{path}: {figures}")
        elif figures[:2] != (job["parameters"], job["bits_per_weight"]):
            problems.append(f"{out / RECORD}: jobs.{t}: {job['parameters']} parameters at {job['bits_per_weight']} "
                            f"bits/weight recorded, the file has {figures[0]} at {figures[1]}")
        elif figures[2] != record["block_size"]:
            problems.append(f"{out / RECORD}: block_size is {record['block_size']}, but {job['file']} says "
                            f"{figures[2]} (its block size bounds every τ of the record)")
        mean = _tau_differs(job["tau"]["mean"], job["tau"]["per_prompt"])
        if mean is not None:
            problems.append(f"{out / RECORD}: jobs.{t}.tau.mean is {job['tau']['mean']}, its per-prompt values give "
                            f"{mean:.6g}")
        _check_serving(out, record, t, job, problems)
    if record["complete"] and record.get("recommended") != recommended(record):
        problems.append(f"{out / RECORD}: recommended is {record.get('recommended')}, its figures give "
                        f"{recommended(record)}")
    by = "speed-up" if recommended_by_speed(record) is not None else "τ"
    if record["complete"] and record.get("recommended_by") != by:
        problems.append(f"{out / RECORD}: recommended_by is {record.get('recommended_by')}, its figures give {by}")
    return hashed


def _check_serving(out: Path, record: dict[str, Any], t: str, job: dict[str, Any], problems: list[str]) -> None:
    """Each serving figure again from its per-prompt values: τ, the acceptance rate, the speed-up, its CI, and a
    measured verdict (output differs, refused and crashed are what the server did: kept as recorded, and the schema
    refuses a figure beside them)."""
    seed = int(record["settings"]["seed"])
    for k, e in enumerate(job.get("serving", [])):
        where = f"{out / RECORD}: jobs.{t}.serving[{k}]"
        tau = _tau_differs(e["tau"], e["tau_per_prompt"])
        if tau is not None:
            problems.append(f"{where}.tau is {e['tau']}, its per-prompt values give {tau:.6g}")
        rate = e["accepted"] / e["drafted"] if e["drafted"] else None
        if e["acceptance_rate"] != rate:
            problems.append(f"{where}.acceptance_rate is {e['acceptance_rate']}, accepted / drafted give {rate}")
        speedup, ci = speedup_of(e["per_prompt_tokens_per_s"], seed)
        if e["verdict"] in MEASURED and (e["speedup"], e["speedup_ci"]) != (speedup, ci):
            problems.append(f"{where}: speed-up {e['speedup']} {e['speedup_ci']} recorded, its per-prompt speeds "
                            f"give {speedup} {ci}")
        elif e["verdict"] in MEASURED and e["verdict"] != verdict_of(speedup, ci):
            problems.append(f"{where}.verdict is {e['verdict']}, its speed-up and CI give {verdict_of(speedup, ci)}")


def _check_sweeps(out: Path, record: dict[str, Any], problems: list[str]) -> None:
    """``by_context``'s τ through llama-server again from its per-prompt values (every other figure of the sweeps is
    derived from the record by the card itself)."""
    for t, rows in (record.get("by_context") or {"rows": {}})["rows"].items():
        for k, r in enumerate(rows):
            where = f"{out / RECORD}: by_context.rows.{t}[{k}].server_tau"
            per_prompt = r.get("server_tau_per_prompt")
            if per_prompt is None:
                if r["server_tau"] is not None:
                    problems.append(f"{where} is {r['server_tau']}, and no server_tau_per_prompt derives it")
                continue
            tau = _tau_differs(r["server_tau"], per_prompt)
            if tau is not None:
                problems.append(f"{where} is {r['server_tau']}, its per-prompt values give {tau:.6g}")


def _check_card(out: Path, record: dict[str, Any], problems: list[str]) -> bytes | None:
    """The card against the card the record renders; its bytes (for SHA256SUMS), None when it could not be read."""
    card = out / CARD
    try:
        data = read_inside(out, CARD, MAX_CARD_BYTES)
    except NotInside as exc:
        problems.append(f"{card}: {exc}")
        return None
    got = data.decode("utf-8", errors="replace").splitlines()
    expected = render_card(record).splitlines()
    for i, (a, b) in enumerate(zip(got, expected), 1):
        if a != b:
            problems.append(f"{card}:{i}: the card says {a[:160]!r}, {RECORD} gives {b[:160]!r}")
            return data
    if len(got) != len(expected):
        problems.append(f"{card}: {len(got)} lines, the card {RECORD} renders has {len(expected)}")
    return data


def _check_picture(out: Path, record: dict[str, Any], problems: list[str]) -> bytes | None:
    """The by-context picture against the one the record draws (deterministic bytes): an edited figure in it, or a
    picture of other figures, is found."""
    if not record.get("by_context"):
        return None
    try:
        data = read_inside(out, PICTURE, MAX_CARD_BYTES)
    except NotInside as exc:
        problems.append(f"{out / PICTURE}: {exc}")
        return None
    if data != picture(record):
        problems.append(f"{out / PICTURE}: not the picture {RECORD}'s by-context figures draw (edited, or of another "
                        "release)")
    return data


def _sum_lines(text: str) -> list[str]:
    """SHA256SUMS' lines as sha256sum -c reads them: split at "\\n" only, one trailing "\\r" dropped (a "\\r", "\\v"
    or U+2028 inside a line is part of it, and makes it malformed)."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def _check_sums(out: Path, record: dict[str, Any], read: dict[str, bytes | None], hashed: dict[str, str | NotInside],
                problems: list[str]) -> None:
    sums = out / SUMS
    try:
        text = read_inside(out, SUMS, MAX_SUMS_BYTES).decode("utf-8", errors="replace")
    except NotInside as exc:
        problems.append(f"{sums}: {exc}")
        return
    jobs = {record["jobs"][t]["file"]: record["jobs"][t] for t in record["types"] if t in record["jobs"]}
    own = [*jobs, CARD, RECORD, *([PICTURE] if record.get("by_context") else [])]
    listed: dict[str, str] = {}
    for n, line in enumerate(_sum_lines(text), 1):
        m = _SUM_LINE.match(line)
        if not m:
            problems.append(f"{sums}:{n}: not a sha256sum line")
            continue
        name = m.group(2)
        if name not in own:
            problems.append(f"{sums}:{n}: lists {name[:120]!r}, not a file of this release (not read)")
        elif name in listed:
            problems.append(f"{sums}:{n}: lists {name} twice")
        else:
            listed[name] = m.group(1).lower()
    for name in own:
        if name not in listed:
            problems.append(f"{sums}: does not list {name}")
            continue
        if name in jobs:  # hashed once, by _check_files
            digest = hashed[name]
            if isinstance(digest, NotInside):
                problems.append(f"{out / name}: {digest}")
                continue
        elif read.get(name) is not None:
            digest = hashlib.sha256(read[name]).hexdigest()  # type: ignore[arg-type]
        else:
            continue  # unreadable (over its bound, a link…): already a problem of its own
        if digest != listed[name]:
            problems.append(f"{out / name}: does not match its line in {SUMS}")


def _check_entries(out: Path, record: dict[str, Any], problems: list[str]) -> None:
    """Every entry of OUTDIR is a file of the release: whatever else is there would be uploaded unverified."""
    own = {record["jobs"][t]["file"] for t in record["types"] if t in record["jobs"]} | {CARD, RECORD, SUMS,
                                                                                         TIMINGS}
    if record.get("by_context"):
        own.add(PICTURE)
    try:
        names = entries(out)
    except OSError as exc:
        problems.append(f"{out}: cannot list it ({exc.strerror or exc})")
        return
    for name in names:
        if name not in own:
            problems.append(f"{out / name}: not a file of this release (neither {RECORD} nor {SUMS} lists it) — "
                            "remove it before the folder is published")


def check_release(outdir: str | os.PathLike) -> list[str]:
    """Every problem found, one line each (empty: the release checks out). A folder that holds no release record
    at all, or one that does not fit the schema, is a `DFlashError`."""
    out = Path(outdir)
    record, raw = _read_record(out)
    problems: list[str] = []
    if not record["complete"]:
        problems.append(f"{out / RECORD}: the release did not finish (run dflash-release again to complete it)")
    hashed = _check_files(out, record, problems)
    _check_sweeps(out, record, problems)
    card = _check_card(out, record, problems)
    drawn = _check_picture(out, record, problems)
    _check_sums(out, record, {CARD: card, RECORD: raw, PICTURE: drawn}, hashed, problems)
    _check_entries(out, record, problems)
    return problems
