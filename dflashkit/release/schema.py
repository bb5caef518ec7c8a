"""``release.json`` is input, not truth: its schema, checked before resume or ``--check`` uses a value of it.

A record is read bounded (`files.read_json`), then every value is checked against `RECORD` — its type, its range,
finite numbers, string lengths, list lengths — and the lengths that follow from other values (``per_prompt`` as
long as ``prompts``, at most ``settings.max_prompts``; a job per listed type, its file named as the release names
it). A value that does not fit is one line naming the key and what it holds ("release.json: jobs.Q8_0.tau.mean:
Infinity is not a finite number"), never an internal error. The schema is a small table of checkers here rather
than a JSON-Schema dependency: it needs the cross-field bounds above and messages in the house style.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from ..accept.serving_measure import VERDICT_CRASHED, VERDICT_REFUSED, VERDICTS
from ..errors import DFlashError
from ..sweeps import MAX_CONTEXT_TOKENS, MAX_PARALLEL

FORMAT = "dflashkit-release/3"
#: prompts one release measures τ over: its bootstraps and its card stay bounded whatever a record claims
MAX_RELEASE_PROMPTS = 10_000
MAX_TEXT = 2000  # characters of any free-text value (a gate's reason, a refusal)
MAX_NAME = 255  # characters of a name (a file name has at most 255 bytes; a repo id, a tensor)
SAFE_NAME = re.compile(r"^[A-Za-z0-9._-]{1,200}$")  # the release's own file names: `run.release_name`
HEX64 = re.compile(r"^[0-9a-f]{64}$")


class RecordError(DFlashError):
    """A value of ``release.json`` that is not what a release writes."""


def _describe(value: Any) -> str:
    text = repr(value) if not isinstance(value, (dict, list)) else type(value).__name__
    return text if len(text) <= 60 else text[:57] + "…"


Check = Callable[[Any, str], None]


def _fail(where: str, value: Any, what: str) -> RecordError:
    return RecordError(f"{where}: {_describe(value)} {what}")


def integer(lo: int, hi: int, *, null: bool = False) -> Check:
    def check(v: Any, where: str) -> None:
        if v is None and null:
            return
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise _fail(where, v, f"is not an integer from {lo} to {hi}")
    return check


def number(lo: float = -math.inf, hi: float = math.inf, *, null: bool = False) -> Check:
    def check(v: Any, where: str) -> None:
        if v is None and null:
            return
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise _fail(where, v, "is not a finite number")
        if not lo <= v <= hi:
            raise _fail(where, v, f"is outside [{lo:g}, {hi:g}]")
    return check


def text(limit: int = MAX_TEXT, *, null: bool = False, pattern: re.Pattern[str] | None = None,
         choices: tuple[str, ...] | None = None) -> Check:
    def check(v: Any, where: str) -> None:
        if v is None and null:
            return
        if not isinstance(v, str) or len(v) > limit or "\x00" in v:
            raise _fail(where, v, f"is not a string of at most {limit} characters")
        try:
            v.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate (\\ud800 in JSON): no card can carry it
            raise _fail(where, v.encode("utf-8", "backslashreplace").decode(), "is not valid UTF-8 text") from None
        if pattern is not None and not pattern.match(v):
            raise _fail(where, v, "is not a name a release writes")
        if choices is not None and v not in choices:
            raise _fail(where, v, f"is not one of {', '.join(choices)}")
    return check


def boolean() -> Check:
    def check(v: Any, where: str) -> None:
        if not isinstance(v, bool):
            raise _fail(where, v, "is not true or false")
    return check


def listing(item: Check, max_len: int, *, null: bool = False, min_len: int = 0) -> Check:
    def check(v: Any, where: str) -> None:
        if v is None and null:
            return
        if not isinstance(v, list) or not min_len <= len(v) <= max_len:
            raise _fail(where, v, f"is not a list of {min_len} to {max_len} values")
        for i, x in enumerate(v):
            item(x, f"{where}[{i}]")
    return check


@dataclass(frozen=True)
class Obj:
    """An object with these keys (``optional``: may be absent); unknown keys are refused."""

    required: Mapping[str, Check]
    optional: Mapping[str, Check] = None  # type: ignore[assignment]
    null: bool = False

    def __call__(self, v: Any, where: str) -> None:
        if v is None and self.null:
            return
        if not isinstance(v, dict):
            raise _fail(where, v, "is not an object")
        optional = self.optional or {}
        for key in v:
            if key not in self.required and key not in optional:
                raise _fail(f"{where}.{key}" if where else key, v[key], "is not a key a release writes")
        for key, check in self.required.items():
            if key not in v:
                raise RecordError(f"{where + '.' if where else ''}{key}: missing")
            check(v[key], f"{where}.{key}" if where else key)
        for key, check in optional.items():
            if key in v:
                check(v[key], f"{where}.{key}" if where else key)


def mapping(key: Check, value: Check, max_len: int) -> Check:
    def check(v: Any, where: str) -> None:
        if not isinstance(v, dict) or len(v) > max_len:
            raise _fail(where, v, f"is not an object of at most {max_len} entries")
        for k, x in v.items():
            key(k, f"{where} key")
            value(x, f"{where}.{k}")
    return check


def tau_value(block_size: int, *, null: bool = True) -> Check:
    """τ of a drafter of block ``block_size``: from 1 (a round commits at least the target's bonus token) to the
    block size (its block − 1 draft tokens all accepted, and the bonus) — `runtime.speculative.SpeculativeResult.tau`
    (llama.cpp clamps a server's n-max to block − 1, so a server's τ has the same bound)."""
    finite = number(null=null)

    def check(v: Any, where: str) -> None:
        finite(v, where)
        if v is not None and not 1.0 <= v <= block_size:
            raise _fail(where, v, f"is not a τ of a block-{block_size} drafter (1 to {block_size}: a round commits "
                                  f"at most its {block_size - 1} draft tokens and the bonus)")
    return check


FRACTION = number(0.0, 1.0, null=True)
HASH = text(64, pattern=HEX64)
COUNT = integer(0, 2**62)
SEED = integer(0, 2**63 - 1)

#: tokens a second: measured ones are positive, and no server generates a million a second for one request set
SPEED = number(1e-9, 1e6, null=True)
BLOCK_SIZE = integer(2, 4096)


#: the least speed-up a record may hold (a drafter a thousand times slower than the target alone is no measurement)
MIN_SPEEDUP = 1e-3
#: a context level: at most what --context takes
LEVEL = integer(0, MAX_CONTEXT_TOKENS)


def speedup_value(block_size: int) -> Check:
    """A speed-up: a round commits at most ``block_size`` tokens for one target forward, so twice that (timing noise
    included) is past anything measured."""
    return number(MIN_SPEEDUP, 2.0 * block_size, null=True)


def serving_run(max_prompts: int, block_size: int) -> Obj:
    """One type's figures through llama-server at one (build, target GGUF, cache type, n-max)."""
    return Obj({
        "build": text(MAX_NAME), "target_gguf": text(MAX_NAME), "draft_n_max": integer(1, 4096, null=True),
        "draft_cache_type": text(16, null=True), "tau": tau_value(block_size),
        "tau_per_prompt": listing(tau_value(block_size), max_prompts),
        "acceptance_rate": FRACTION, "drafted": COUNT, "accepted": COUNT, "tokens_per_s_on": SPEED,
        "tokens_per_s_off": SPEED, "per_prompt_tokens_per_s": listing(listing(SPEED, 2, min_len=2), max_prompts),
        "speedup": speedup_value(block_size), "speedup_ci": listing(speedup_value(block_size), 2, null=True, min_len=2),
        "verdict": text(64, choices=VERDICTS), "refused": text(null=True),
    }, optional={"note": text(200, null=True)})


#: how the release served its files: the builds (by name), the host, the sweep
SERVING = Obj({"builds": listing(text(MAX_NAME), 16, min_len=1), "host": text(200),
               "draft_n_max": listing(integer(1, 4096, null=True), 64, min_len=1),
               "draft_cache_types": listing(text(16, null=True), 16, min_len=1)}, null=True)


def job_schema(max_prompts: int, block_size: int) -> Obj:
    return Obj({
        "type": text(32), "file": text(MAX_NAME, pattern=SAFE_NAME), "size_bytes": COUNT, "parameters": COUNT,
        "bits_per_weight": number(0.0, 64.0, null=True),
        "inspect": Obj({"errors": COUNT, "warnings": COUNT}),
        "diff": Obj({"tensors": COUNT, "worst_rel_rms": number(0.0, null=True), "worst_tensor": text(MAX_NAME, null=True)}),
        "parity": Obj({"top1": FRACTION, "kl_mean": number(0.0, null=True), "rounds": integer(1, 1000)}),
        "tau": Obj({"mean": tau_value(block_size), "per_prompt": listing(tau_value(block_size), max_prompts),
                    "nonfinite_rounds": COUNT, "prompts": integer(0, max_prompts), "max_new_tokens": integer(2, 1 << 20)},
                   optional={"llama_cpp": tau_value(block_size), "llama_cpp_refused": text(null=True),
                             "prompt_tokens": number(0.0, 1e9),  # the mean prompt tokens τ was measured at
                             "categories": listing(text(64), max_prompts),  # each prompt's category
                             "llama_cpp_note": text(200, null=True)}),
        "gates_failed": listing(Obj({"gate": text(32), "why": text()}), 16),
        "sha256": HASH,
    }, optional={"serving": listing(serving_run(max_prompts, block_size), 4096), "seal": HASH})


# ---- the record's schema --------------------------------------------------------------------------------------


def sweep_schemas(max_prompts: int, max_types: int, block_size: int) -> dict[str, Obj]:
    """``by_context`` / ``by_parallel`` (`dflashkit.release.sweeps`): per-prompt and per-batch values only (and
    ``server_tau``, which ``--check`` derives from ``server_tau_per_prompt``); a level without a figure says why
    (``server_refused``, ``refused`` and ``crashed``)."""
    level_row = Obj({"context": LEVEL, "prompt_tokens": number(0.0, 1e9),
                     "tau_per_prompt": listing(tau_value(block_size), max_prompts),
                     "server_tau": tau_value(block_size),
                     "log_speedups": listing(number(math.log(MIN_SPEEDUP), math.log(2 * block_size)), max_prompts,
                                             null=True)},
                    optional={"server_tau_per_prompt": listing(tau_value(block_size), max_prompts, null=True),
                              "server_refused": text(null=True)})
    parallel_row = Obj({"np": integer(1, MAX_PARALLEL), "on": listing(SPEED, 4096), "off": listing(SPEED, 4096),
                        "slot_tau": mapping(text(8), tau_value(block_size), MAX_PARALLEL), "differences": COUNT,
                        "refused": text(null=True), "findings": listing(text(600), 64)},
                       optional={"crashed": boolean()})
    return {
        "by_context": Obj({"levels": listing(LEVEL, 16, min_len=1), "source": text(200), "build": text(200, null=True),
                           "rows": mapping(text(32), listing(level_row, 16), max_types),
                           "cliffs": listing(text(600), 64)}, null=True),
        "by_parallel": Obj({"build": text(200, null=True), "rows": mapping(text(32), listing(parallel_row, 8), max_types)},
                           null=True),
    }


SETTINGS = Obj({
    "prompts": text(MAX_NAME), "max_prompts": integer(1, MAX_RELEASE_PROMPTS, null=True),
    "max_new_tokens": integer(2, 1 << 20), "seed": SEED, "parity_rounds": integer(1, 1000),
    "min_top1": number(0.0, 1.0), "min_tau": number(0.0, 4097.0, null=True),
})


def _validate_sweeps(record: dict[str, Any], types: list[str]) -> None:
    """``by_context`` / ``by_parallel`` rows: types of this release, one row per level in the levels' order, no more
    per-prompt values than prompts, per-slot τ only of slots of the level's ``-np``, and no figure beside a server
    that refused or crashed."""
    part = record.get("by_context")
    if part:
        levels = part["levels"]
        if levels != sorted(set(levels)):
            raise RecordError(f"by_context.levels: {levels!r} are not ascending and distinct")
        for t, rows in part["rows"].items():
            if t not in types:
                raise RecordError(f"by_context.rows.{t}: not a type of this release")
            if [r["context"] for r in rows] != levels:
                raise RecordError(f"by_context.rows.{t}: its rows' levels are not by_context.levels {levels!r}")
            for k, r in enumerate(rows):
                where = f"by_context.rows.{t}[{k}]"
                if len(r.get("server_tau_per_prompt") or []) > len(r["tau_per_prompt"]) or \
                        len(r["log_speedups"] or []) > len(r["tau_per_prompt"]):
                    raise RecordError(f"{where}: more llama-server values than its {len(r['tau_per_prompt'])} prompts")
                if r.get("server_refused") is not None:
                    _no_figures(where, "server_refused", r, ("server_tau", "server_tau_per_prompt", "log_speedups"))
    part = record.get("by_parallel")
    if part:
        for t, rows in part["rows"].items():
            if t not in types:
                raise RecordError(f"by_parallel.rows.{t}: not a type of this release")
            if [r["np"] for r in rows] != sorted({r["np"] for r in rows}):
                raise RecordError(f"by_parallel.rows.{t}: its levels {[r['np'] for r in rows]!r} are not ascending "
                                  "and distinct")
            for k, r in enumerate(rows):
                _check_parallel_row(f"by_parallel.rows.{t}[{k}]", r)


#: what a level or a combination without a figure holds in place of each figure
_EMPTY: dict[str, Any] = {"on": [], "off": [], "slot_tau": {}, "differences": 0, "findings": [], "tau_per_prompt": [],
                          "per_prompt_tokens_per_s": [], "drafted": 0, "accepted": 0}


def _no_figures(where: str, reason: str, row: dict[str, Any], keys: tuple[str, ...]) -> None:
    """A level (or combination) whose server refused or crashed has no figure: each of ``keys`` null or empty."""
    for key in keys:
        if key in row and row[key] != _EMPTY.get(key):
            raise RecordError(f"{where}.{key}: {_describe(row[key])} beside {reason} — a server that refused or "
                              "crashed measured nothing")


def _check_parallel_row(where: str, r: dict[str, Any]) -> None:
    """A ``--parallel`` level: its batches paired, τ only of slots of its ``-np``, and figures only when measured."""
    if r.get("crashed") and r["refused"] is None:
        raise RecordError(f"{where}.crashed: true without the crash's message in refused")
    if r["refused"] is not None:
        _no_figures(where, "refused" if not r.get("crashed") else "crashed",
                    r, ("on", "off", "slot_tau", "differences", "findings"))
        return
    if not r["on"]:
        raise RecordError(f"{where}: no batch measured and no reason in refused")
    if len(r["on"]) != len(r["off"]):
        raise RecordError(f"{where}: batches with and without the drafter differ in number")
    if r["differences"] > len(r["on"]) * r["np"]:
        raise RecordError(f"{where}.differences: {r['differences']} for {len(r['on'])} batch(es) of {r['np']} requests")
    for slot in r["slot_tau"]:
        if not (slot.isdecimal() and slot.isascii() and int(slot) < r["np"] and str(int(slot)) == slot):
            raise RecordError(f"{where}.slot_tau: {_describe(slot)} is not a slot of -np {r['np']} (0 to "
                              f"{r['np'] - 1})")


def validate_record(record: Any, where: str, known_types: tuple[str, ...]) -> dict[str, Any]:
    """``record`` checked whole (module doc); a `RecordError` prefixed with ``where`` otherwise."""
    try:
        _validate(record, known_types)
    except RecordError as exc:
        raise RecordError(f"{where}: {exc} — the record was edited or is not a release's") from None
    return record


def _validate(record: Any, known_types: tuple[str, ...]) -> None:
    if not isinstance(record, dict):
        raise _fail("the record", record, "is not an object")
    if record.get("format") != FORMAT:
        raise RecordError(f"format: {_describe(record.get('format'))} is not {FORMAT!r} (a record of another "
                          "dflashkit version, or not a release's)")
    SETTINGS(record.get("settings"), "settings")
    if "block_size" not in record:
        raise RecordError("block_size: missing")
    BLOCK_SIZE(record["block_size"], "block_size")  # first: it bounds every τ of the record
    block_size = record["block_size"]
    settings = record["settings"]
    max_prompts = min(settings["max_prompts"] or MAX_RELEASE_PROMPTS, MAX_RELEASE_PROMPTS)
    job = job_schema(max_prompts, block_size)
    type_name = text(32, choices=known_types)
    Obj({
        "format": text(64), "name": text(MAX_NAME, pattern=SAFE_NAME), "family": text(MAX_NAME),
        "block_size": BLOCK_SIZE, "spec_type": text(64),
        "types": listing(type_name, len(known_types), min_len=1), "inputs_digest": HASH,
        "source": Obj({"repo": text(MAX_NAME), "revision": text(MAX_NAME, null=True), "license": text(MAX_NAME, null=True)}),
        "target": text(MAX_NAME), "target_gguf_name": text(MAX_NAME), "dflashkit_version": text(64),
        "llama_cpp": text(MAX_TEXT, null=True), "settings": SETTINGS, "base_sha256": HASH,
        "naming": text(16, choices=("source", "target")), "file_prefix": text(MAX_NAME, pattern=SAFE_NAME),
        "target_name": text(100, null=True, pattern=SAFE_NAME), "serving": SERVING,
        "jobs": mapping(type_name, job, len(known_types)), "complete": boolean(),
    }, optional={"recommended": text(32, null=True, choices=known_types),
                 "recommended_by": text(16, choices=("speed-up", "τ")),
                 "base_seal": text(64, null=True, pattern=HEX64),
                 "imatrix": Obj({"name": text(MAX_NAME), "sha256": HASH}),
                 **sweep_schemas(max_prompts, len(known_types), block_size)})(record, "")
    types = record["types"]
    if len(set(types)) != len(types):
        raise RecordError(f"types: {types!r} lists a type twice")
    for t, j in record["jobs"].items():
        if t not in types:
            raise RecordError(f"jobs.{t}: a job of a type the record does not list in types")
        if j["type"] != t:
            raise RecordError(f"jobs.{t}.type: {_describe(j['type'])} is not {t}")
        if j["file"] != f"{record['file_prefix']}-{t}.gguf":
            raise RecordError(f"jobs.{t}.file: {_describe(j['file'])} is not {record['file_prefix']}-{t}.gguf, the "
                              "name the release gives it")
        tau = j["tau"]
        if "categories" in tau and len(tau["categories"]) != tau["prompts"]:
            raise RecordError(f"jobs.{t}.tau.categories: {len(tau['categories'])} for {tau['prompts']} prompts")
        if len(tau["per_prompt"]) != tau["prompts"]:
            raise RecordError(f"jobs.{t}.tau.per_prompt: {len(tau['per_prompt'])} values for {tau['prompts']} prompts")
        for k, e in enumerate(j.get("serving", [])):
            if len(e["tau_per_prompt"]) > tau["prompts"] or len(e["per_prompt_tokens_per_s"]) > tau["prompts"]:
                raise RecordError(f"jobs.{t}.serving[{k}]: more per-prompt values than the {tau['prompts']} prompts")
            if (e["verdict"] in (VERDICT_REFUSED, VERDICT_CRASHED)) != (e["refused"] is not None):
                raise RecordError(f"jobs.{t}.serving[{k}].verdict: {_describe(e['verdict'])} with refused "
                                  f"{_describe(e['refused'])} — the server's message goes with refused to load or "
                                  "crashed, and only with them")
            if e["refused"] is not None:
                _no_figures(f"jobs.{t}.serving[{k}]", e["verdict"], e,
                            ("tau", "tau_per_prompt", "acceptance_rate", "drafted", "accepted", "tokens_per_s_on",
                             "tokens_per_s_off", "per_prompt_tokens_per_s", "speedup", "speedup_ci"))
    _validate_sweeps(record, types)
    if record["complete"] and any(t not in record["jobs"] for t in types):
        missing = next(t for t in types if t not in record["jobs"])
        raise RecordError(f"complete: true, but jobs has no {missing}")
