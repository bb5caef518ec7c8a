"""A release's model card, ``SHA256SUMS`` and the figures they share.

The card is a function of ``release.json`` alone (`render_card`): the table per type, the recommended type, the
llama-server command and the provenance are all read from it, so ``dflash-release --check`` re-renders the card and
compares it line by line — an edited figure in either file is found. The front matter is huggingface_hub's
``ModelCardData`` (``base_model``, ``base_model_relation: quantized``, tags, ``library_name``, the source's
license), written through ``ModelCard`` so the hub reads it as it reads any card.
"""

from __future__ import annotations

import hashlib
import math
import shlex
from pathlib import Path
from typing import Any, Iterable, NamedTuple

from ..families import DEFAULT_FAMILY, DrafterFamily, family_named
from ..reporting import Column, TableSpec, build_section, markdown_section, markdown_text
from ..stats import CONFIDENCE, paired_bootstrap_ci, paired_comparison
from ..accept.serving_measure import VERDICT_CRASHED, VERDICT_GAIN, VERDICT_REFUSED
from .card_serving import figure, md_name, naming_lines, serving_lines
from .serving_record import MEASURED, best_entry

#: the recommendation, as the card states it: by speed-up where llama-server measured one, else by τ
RECOMMEND_RULE = ("the smallest file that passed every gate and keeps at least 98 % of the reference type's τ "
                  "(the first type listed, over the same prompts)")
RECOMMEND_SPEED_RULE = ("the smallest file that passed every gate whose speed-up through llama-server is a net gain "
                        "and whose speed-up CI overlaps the fastest type's (each type at its best n-max, the first "
                        "build measured)")
RECOMMEND_FRACTION = 0.98
def tags_of(family: DrafterFamily) -> list[str]:
    """The card's hub tags: the family's beside the format's and the runtime's."""
    return ["gguf", "speculative-decoding", family.hub_tag, "llama.cpp"]


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def sha256sums(folder: Path, names: Iterable[str]) -> str:
    """``sha256sum`` format (two spaces, then the name): ``sha256sum -c SHA256SUMS`` checks it."""
    return "".join(f"{sha256_of(folder / n)}  {n}\n" for n in names)


def shell_word(word: str) -> str:
    """A word for the card's shell block: quoted for the shell, and on one line whatever it holds (bash's $'…' for
    control characters) — a newline in a file name cannot end the code fence."""
    if word.isprintable():
        return shlex.quote(word)
    escaped = "".join(c if c.isprintable() and c not in "\\'" else
                      ("\\" + c if c in "\\'" else "".join(f"\\x{b:02x}" for b in c.encode("utf-8")))
                      for c in word)
    return f"$'{escaped}'"


def derived(release: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per type, the figures computed from the jobs' records: τ's CI, Δτ against the first type with its paired CI."""
    jobs = release["jobs"]
    types = [t for t in release["types"] if t in jobs]
    seed = int(release["settings"].get("seed", 0))
    ref = jobs[types[0]]["tau"]["per_prompt"] if types else []
    out = {}
    for t in types:
        per = [x if x is not None else math.nan for x in jobs[t]["tau"]["per_prompt"]]
        finite = [x for x in per if math.isfinite(x)]
        ci = paired_bootstrap_ci(finite, seed=seed)
        cmp = paired_comparison([x if x is not None else math.nan for x in ref], per, seed=seed)
        out[t] = {"tau_ci": ci, "delta": None if t == types[0] else cmp.delta,
                  "delta_ci": None if t == types[0] else cmp.ci}
    return out


def recommended_by_speed(release: dict[str, Any]) -> str | None:
    """`RECOMMEND_SPEED_RULE`; None when no type's speed-up was measured or none is a net gain."""
    jobs = release["jobs"]
    types = [t for t in release["types"] if t in jobs]
    best = {t: e for t in types if (e := best_entry(jobs[t].get("serving", []))) is not None
            and e.get("verdict") in MEASURED and e.get("speedup") is not None}
    if not best:
        return None
    fastest = max(best, key=lambda t: (best[t]["speedup"], -types.index(t)))
    low = (best[fastest]["speedup_ci"] or [best[fastest]["speedup"]] * 2)[0]
    ok = [t for t in best if not jobs[t]["gates_failed"] and best[t]["verdict"] == VERDICT_GAIN
          and (best[t]["speedup_ci"] or [best[t]["speedup"]] * 2)[1] >= low]
    return min(ok, key=lambda t: (jobs[t]["size_bytes"], types.index(t))) if ok else None


def failed_where_served(job: dict[str, Any]) -> bool:
    """llama-server crashed on the file or refused it, and no combination of it was measured: the τ rule never
    recommends such a type (llama.cpp cannot run it here, whatever τ the reference runtime gives)."""
    entries = job.get("serving", [])
    return bool(entries) and not any(e.get("verdict") in MEASURED for e in entries) and \
        any(e.get("verdict") in (VERDICT_CRASHED, VERDICT_REFUSED) for e in entries)


def recommended(release: dict[str, Any]) -> str | None:
    """The recommended type: by speed-up when one was measured (`recommended_by_speed`), else by τ."""
    by_speed = recommended_by_speed(release)
    if by_speed is not None:
        return by_speed
    jobs = release["jobs"]
    types = [t for t in release["types"] if t in jobs]
    if not types:
        return None
    ref_tau = jobs[types[0]]["tau"]["mean"]
    ok = [t for t in types if not jobs[t]["gates_failed"] and jobs[t]["tau"]["mean"] is not None
          and not failed_where_served(jobs[t])
          and ref_tau is not None and jobs[t]["tau"]["mean"] >= RECOMMEND_FRACTION * ref_tau]
    return min(ok, key=lambda t: (jobs[t]["size_bytes"], types.index(t))) if ok else None


def card_data(release: dict[str, Any]) -> Any:
    from huggingface_hub import ModelCardData

    source = release["source"]
    fields: dict[str, Any] = {"base_model": source["repo"], "base_model_relation": "quantized",
                              "tags": tags_of(_family(release)),
                              "library_name": "gguf"}
    if source.get("license"):
        fields["license"] = source["license"]
    return ModelCardData(**fields)


class _Files(NamedTuple):
    """What the card's table reads: the jobs' records, the types released (in order) and their derived figures."""

    jobs: dict[str, Any]
    types: list[str]
    extra: dict[str, dict[str, Any]]


def _llama_tau(j: dict[str, Any]) -> str:
    """llama.cpp's τ beside the reference's: llama-speculative-simple's (``--llama-cpp``, the whole block), else
    llama-server's at the largest n-max it served (the first build; the n-max is said: τ cannot pass n-max + 1)."""
    if j["tau"].get("llama_cpp") is not None:
        return figure(j["tau"]["llama_cpp"])
    entries = [e for e in j.get("serving", []) if e.get("tau") is not None]
    if not entries:
        return "–"
    first = [e for e in entries if e["build"] == entries[0]["build"]]
    e = max(first, key=lambda e: (e["draft_n_max"] or 0, -first.index(e)))
    return f"{figure(e['tau'])} (server, n-max {e['draft_n_max']})"


def _file_row(c: _Files, t: str) -> dict[str, Any]:
    j, d = c.jobs[t], c.extra[t]
    top1 = j["parity"]["top1"]
    e = best_entry(j.get("serving", []))
    return {
        "file": f"`{j['file']}`", "size": f"{j['size_bytes'] / 1e6:.2f} MB", "bpw": figure(j["bits_per_weight"], ".2f"),
        "tau": figure(j["tau"]["mean"]),
        "tau_ci": f"{d['tau_ci'][0]:.3f} – {d['tau_ci'][1]:.3f}" if d["tau_ci"] else "–",
        "delta": "reference" if t == c.types[0] else figure(d["delta"], "+.3f"),
        "delta_ci": f"{d['delta_ci'][0]:+.3f} – {d['delta_ci'][1]:+.3f}" if d["delta_ci"] else "–",
        "top1": "–" if top1 is None else f"{top1:.2%}", "kl": figure(j["parity"]["kl_mean"], ".3g"),
        "llama_cpp": _llama_tau(j),
        "speedup": _speed_text(e) + (f" (n-max {e['draft_n_max']})" if e and e.get("draft_n_max") else ""),
        "gates": "; ".join(f"**FAILED {g['gate']}**: {g['why']}" for g in j["gates_failed"]) or "passed"}


def _file_columns(c: _Files) -> list[Column]:
    pct = f"{CONFIDENCE:.0%}"
    return [Column("file", "file"), Column("size", "size"), Column("bpw", "bits/weight"), Column("tau", "τ"),
            Column("tau_ci", f"τ {pct} CI"), Column("delta", f"Δτ vs {c.types[0] if c.types else '–'}"),
            Column("delta_ci", f"Δτ {pct} CI"), Column("top1", "parity top-1"), Column("kl", "parity KL"),
            Column("llama_cpp", "llama.cpp τ"), Column("speedup", "speed-up"), Column("gates", "gates")]


#: the card's table: one row per type, a type that failed a gate flagged
FILES_TABLE = TableSpec("Files", _file_columns, lambda c: [_file_row(c, t) for t in c.types], id="files",
                        flagged=lambda c: {i for i, t in enumerate(c.types) if c.jobs[t]["gates_failed"]})


def _llama_builds(release: dict[str, Any]) -> str:
    """The llama.cpp builds a release ran, by what each did."""
    parts = []
    if release.get("llama_cpp"):
        parts.append(f"{md_name(release['llama_cpp'])} (τ, `--llama-cpp`)")
    if release.get("serving"):
        parts += [f"{md_name(b)} (speed-up, `llama-server`)" for b in release["serving"]["builds"]]
    return ", ".join(parts) or "not used (reference runtime only)"


def _speed_text(e: dict[str, Any] | None) -> str:
    """A speed-up as a figure: ×value, its CI and its verdict ("×1.25 [1.18, 1.32] net gain")."""
    if e is None:
        return "–"
    if e.get("speedup") is None:
        return e["verdict"]
    ci = e.get("speedup_ci")
    return f"×{e['speedup']:.2f}" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "") + f" {e['verdict']}"


def sweep_card_lines(release: dict[str, Any]) -> list[str]:
    from .sweeps import card_lines, category_lines

    return category_lines(release) + card_lines(release)


def _family(release: dict[str, Any]) -> DrafterFamily:
    """The family a release record names (a record of an unknown family reads as DFlash's)."""
    return family_named(str(release.get("family"))) or DEFAULT_FAMILY


def render_card(release: dict[str, Any]) -> str:
    """The card's full text (front matter + body) from ``release.json``'s content."""
    from huggingface_hub import ModelCard

    jobs, settings, source = release["jobs"], release["settings"], release["source"]
    types = [t for t in release["types"] if t in jobs]
    extra = derived(release)
    best = recommended(release)
    pct = f"{CONFIDENCE:.0%}"
    source_repo, target = md_name(source["repo"]), md_name(release["target"])
    target_gguf = release["target_gguf_name"]
    lines = [f"# {markdown_text(release['name'])} — GGUF", "",
             f"{markdown_text(_family(release).card_kind(int(release['block_size'])))} for speculative decoding, "
             f"converted from {source_repo} to GGUF and quantized with dflashkit "
             f"{markdown_text(release['dflashkit_version'])}. Every file was checked: `dflash-inspect --strict` with "
             "the target, `dflash-diff` and `dflash-parity` against the checkpoint, and τ (mean accepted tokens per "
             "draft round, the bonus token included) measured beside the target.", "",
             ]
    # the one Markdown table renderer of every report (reporting): escaped cells, failed rows flagged
    lines += markdown_section(build_section(FILES_TABLE, _Files(jobs, types, extra)))
    lines += serving_lines(release, types)
    lines += sweep_card_lines(release)  # by context length (and its picture), by concurrent requests
    lines += ["", "## Recommended", ""]
    by_speed = release.get("recommended_by") == "speed-up"
    rule = RECOMMEND_SPEED_RULE if by_speed else RECOMMEND_RULE
    if best is not None:
        note = (best_entry(jobs[best].get("serving", [])) or {}).get("note")
        lines.append(f"**{best}** (`{jobs[best]['file']}`): {rule}." + (f" Its speed-up was {note}." if note else ""))
    else:
        lines.append(f"None: no type meets the rule ({rule}).")
    if release.get("serving") and not by_speed:
        lines.append("")
        lines.append("No type's speed-up through llama-server is a net gain, so the τ rule chose.")
        unserved = [t for t in types if failed_where_served(jobs[t])]
        if unserved:
            lines.append("")
            lines.append(f"Not considered: {', '.join(unserved)} — llama-server crashed on or refused the file on the "
                         "measuring machine (the table above says which).")
    run_file = jobs[best]["file"] if best else (jobs[types[0]]["file"] if types else "DRAFTER.gguf")
    chosen = best_entry(jobs[best].get("serving", [])) if best else None
    n_max = chosen["draft_n_max"] if chosen and chosen.get("draft_n_max") else release["block_size"] - 1
    cache = chosen.get("draft_cache_type") if chosen else None
    lines += ["", "## Run it beside its target", "", "```bash",
              f"llama-server -m {shell_word(target_gguf)} -md {shell_word(run_file)} --spec-type "
              f"{shell_word(release['spec_type'])} --spec-draft-n-max {n_max}"
              + (f" -ctkd {shell_word(cache)} -ctvd {shell_word(cache)}" if cache else ""), "```", "",
              f"{md_name(target_gguf)}: the target model as a GGUF ({target} converted with llama.cpp's "
              "`convert_hf_to_gguf.py`), any quant type."
              + (f" `--spec-draft-n-max {n_max}`: the n-max that served this file fastest." if chosen else
                 " " + _family(release).n_max_note(n_max)), "", *naming_lines(release, target, target_gguf), "",
              "## How the figures were measured", "",
              "- Files: `dflash-convert SRC BASE.gguf --outtype f32 --target TARGET`, then "
              "`dflash-quantize BASE.gguf FILE TYPE` per type (byte-identical to llama-quantize).",
              f"- τ: dflashkit's reference runtime, greedy, {settings['max_new_tokens']} new tokens per prompt, "
              f"{jobs[types[0]]['tau']['prompts'] if types else 0} prompts from {md_name(settings['prompts'])}"
              + (f" (at ≈ {jobs[types[0]]['tau']['prompt_tokens']:.0f} prompt tokens each on average: τ falls with "
                 "context — see 'By context length' where measured)" if types and 'prompt_tokens' in
                 jobs[types[0]]['tau'] else "") + f", seed "
              f"{settings['seed']}; {pct} percentile bootstrap intervals over prompts (Δτ: paired, per-prompt "
              "differences).",
              *([f"- Importance matrix: every quantized type was made with {md_name(release['imatrix']['name'])} "
                 f"(sha256 `{release['imatrix']['sha256'][:16]}…`), as `llama-quantize --imatrix` applies it."]
                if release.get("imatrix") else []),
              f"- Parity: {settings['parity_rounds']} draft rounds against the checkpoint on the target's hidden "
              f"states; gate: top-1 agreement ≥ {settings['min_top1']:.0%}"
              + (f"; τ gate: ≥ {settings['min_tau']:g}" if settings.get("min_tau") is not None else "") + ".",
              "", "## Provenance", "",
              f"- Source: {source_repo}" + (f" at revision {md_name(source['revision'])}" if source.get("revision")
                                            else ""),
              f"- Target: {target}",
              f"- dflashkit {markdown_text(release['dflashkit_version'])}",
              f"- llama.cpp: {_llama_builds(release)}",
              "- Checksums: `SHA256SUMS` (`sha256sum -c SHA256SUMS`); every figure: `release.json`; "
              "`dflash-release --check .` verifies both.", ""]
    content = f"---\n{card_data(release).to_yaml()}\n---\n\n" + "\n".join(lines)
    return str(ModelCard(content))
