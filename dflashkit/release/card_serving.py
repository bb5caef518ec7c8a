"""The card's serving part: each type's speed through llama-server as a figure — τ there, the acceptance rate,
tok/s alone and with the drafter, the speed-up with its CI and verdict, at the n-max and draft cache type it was
measured at (the best n-max of a sweep, then the sweep itself) — and where it was measured: the host, the build,
the target file, the prompts; and which file goes with which target. Rendered from ``release.json`` alone, like
the rest of the card (`card.render_card`)."""

from __future__ import annotations

import math
import re
from typing import Any, NamedTuple

from ..reporting import Column, TableSpec, build_section, markdown_section, markdown_text
from ..stats import CONFIDENCE
from ..accept.serving_measure import VERDICT_GAIN
from .serving_record import MEASURED, best_entry, builds_of


def figure(x: float | None, spec: str = ".3f") -> str:
    """A figure of the card: "–" where it was not measured or is not finite."""
    return "–" if x is None or not math.isfinite(x) else format(x, spec)


_PLAIN_NAME = re.compile(r"^[A-Za-z0-9._/@:+=-]{1,200}$")


def md_name(name: str) -> str:
    """A name from input (a repo id, a file, a build) in the card's text: a code span where it is a plain name,
    else escaped text — a backtick, a newline or HTML in a name cannot open a fence, a heading or an element."""
    return f"`{name}`" if _PLAIN_NAME.match(name) else markdown_text(name).replace("`", "\\`")


class _Serving(NamedTuple):
    jobs: dict[str, Any]
    types: list[str]
    builds: list[str]


def _rows(c: _Serving) -> list[dict[str, Any]]:
    rows = []
    for t in c.types:
        for b in c.builds:
            e = best_entry(c.jobs[t].get("serving", []), b)
            if e is None:
                continue
            ci = e.get("speedup_ci")
            rows.append({
                "file": f"`{c.jobs[t]['file']}`", "build": md_name(b), "n_max": str(e["draft_n_max"] or "default"),
                "cache": e["draft_cache_type"] or "default", "tau": figure(e.get("tau"), ".3f"),
                "rate": "–" if e.get("acceptance_rate") is None else f"{e['acceptance_rate']:.1%}",
                "off": figure(e.get("tokens_per_s_off"), ".1f"), "on": figure(e.get("tokens_per_s_on"), ".1f"),
                "speedup": "–" if e.get("speedup") is None else f"×{e['speedup']:.2f}",
                "ci": f"[{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "–",
                "verdict": e["verdict"] + (f" ({e['note']})" if e.get("note") else "")})
    return rows


def _columns(c: _Serving) -> list[Column]:
    return [Column("file", "file"), *([Column("build", "llama.cpp build")] if len(c.builds) > 1 else []),
            Column("n_max", "n-max"), Column("cache", "draft KV"), Column("tau", "τ (llama-server)"),
            Column("rate", "acceptance rate"), Column("off", "tok/s target alone"), Column("on", "tok/s with drafter"),
            Column("speedup", "speed-up"), Column("ci", f"{CONFIDENCE:.0%} CI"), Column("verdict", "verdict")]


#: one row per type (× build), at the n-max that served it fastest
SERVING_TABLE = TableSpec("Speed through llama-server", _columns, _rows, id="serving",
                          flagged=lambda c: {i for i, r in enumerate(_rows(c)) if not r["verdict"].startswith(VERDICT_GAIN)})


def _sweep_label(e: dict[str, Any]) -> str:
    return f"n-max {e['draft_n_max'] or 'default'}" + (f", {e['draft_cache_type']}" if e["draft_cache_type"] else "")


def _sweep_rows(c: _Serving) -> list[dict[str, Any]]:
    rows = []
    for t in c.types:
        for b in c.builds:
            entries = [e for e in c.jobs[t].get("serving", []) if e.get("build") == b]
            if not entries:
                continue
            row = {"file": f"`{c.jobs[t]['file']}`", "build": md_name(b)}
            for e in entries:
                ci = e.get("speedup_ci")
                row[_sweep_label(e)] = (e["verdict"] if e.get("speedup") is None else
                                        f"×{e['speedup']:.2f}" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else ""))
            rows.append(row)
    return rows


def _sweep_columns(c: _Serving) -> list[Column]:
    labels: list[str] = []
    for t in c.types:
        for e in c.jobs[t].get("serving", []):
            if (label := _sweep_label(e)) not in labels:
                labels.append(label)
    return [Column("file", "file"), *([Column("build", "llama.cpp build")] if len(c.builds) > 1 else []),
            *(Column(label, label) for label in labels)]


#: every combination measured, when the release swept n-max or draft cache types
SWEEP_TABLE = TableSpec("Speed-up at each n-max", _sweep_columns, _sweep_rows, id="serving_sweep")


def serving_lines(release: dict[str, Any], types: list[str]) -> list[str]:
    """The card's serving section (nothing when no llama-server was given)."""
    serving = release.get("serving")
    if not serving:
        return []
    jobs = release["jobs"]
    c = _Serving(jobs, types, builds_of(release) or list(serving["builds"]))
    lines = ["", *markdown_section(build_section(SERVING_TABLE, c))]
    if len(serving["draft_n_max"]) > 1 or len(serving["draft_cache_types"]) > 1:
        lines += ["", *markdown_section(build_section(SWEEP_TABLE, c))]
    settings = release["settings"]
    prompts = jobs[types[0]]["tau"]["prompts"] if types else 0
    measured = sum(1 for t in types for e in jobs[t].get("serving", []) if e.get("verdict") in MEASURED)
    lines += ["", f"Measured on {markdown_text(serving['host'])} with llama.cpp "
              f"{', '.join(md_name(b) for b in serving['builds'])}: `llama-server` with the target "
              f"{md_name(release['target_gguf_name'])} and the drafter against the same server without it, greedy, "
              f"{settings['max_new_tokens']} new tokens on each of {prompts} prompts, `-np 1`, one server pair at a "
              f"time and only after every file was made and checked (no other work of the release beside a "
              f"timing; {measured} combination(s) measured). Speed-up: the geometric mean over prompts of the decode "
              f"speed with the drafter over the target's alone, {CONFIDENCE:.0%} paired bootstrap CI; *net gain* / "
              "*net loss*: the CI lies above / below 1, *no gain*: it spans 1. Acceptance rate: accepted / drafted "
              "draft tokens, as llama-server's log prints it. On another machine or target quant the figures "
              "differ: measure yours with `dflash-accept --llama-server`."]
    return lines


def naming_lines(release: dict[str, Any], target: str, target_gguf: str) -> list[str]:
    """Which file goes with which target, in the card's words."""
    if release.get("naming") == "target":
        return [f"Every file here drafts for {target}: put it beside the target's GGUF. Its name, "
                f"`{release['file_prefix']}-<TYPE>.gguf`, is the one ggml-org/convert gives a drafter beside its "
                "target's files, and the sibling name Unsloth Studio finds a drafter by."]
    return [f"Every file here drafts for {target} ({md_name(target_gguf)} above stands for its GGUF); "
            "`dflash-release --naming target` names the files `dflash-<target>-<TYPE>.gguf`, as ggml-org/convert "
            "does."]
