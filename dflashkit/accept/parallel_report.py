"""The report's "by concurrent requests" sections (declared; `accept.report` lists them): per drafter and ``-np``
level the aggregate tok/s with and without the drafter, the speed-up with its CI and verdict, τ per slot, and what
deserves a look — a slot that drafts nothing or much less than slot 0, a slot that answered nothing, a request whose
output differs, a server that refused or crashed (its level has no figure: null in the JSON, beside ``refused``)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ..reporting import Column, NotesSpec, TableSpec
from .parallel import ParallelLevel

COLUMNS = [Column("drafter", "drafter"), Column("np", "-np"), Column("batches", "batches"),
           Column("slot_taus", "τ per slot"), Column("tok_s_off", "tok/s target alone", ".1f"),
           Column("tok_s_on", "tok/s with drafter", ".1f"), Column("speedup", "speed-up", ".2f"),
           Column("speedup_ci_text", "speed-up 95% CI"), Column("verdict", "verdict")]


def levels(r: Any) -> list[ParallelLevel]:
    return list(r.serving.parallel) if r.serving is not None else []


def _figure(x: float | None) -> float | None:
    """A figure of the table: None (JSON null) where there is none — never a NaN."""
    return x if x is not None and math.isfinite(x) else None


def rows(r: Any) -> list[dict[str, Any]]:
    out = []
    names = r.serving.prompt_names if r.serving is not None else []
    for lv in levels(r):
        ci = lv.speedup_ci if lv.measured else None
        taus = {s: t for s, t in lv.slot_taus().items() if math.isfinite(t)}
        out.append({"drafter": Path(lv.drafter).name, "np": lv.n, "batches": len(lv.on),
                    "slot_taus": ", ".join(f"{s}: {t:.2f}" for s, t in taus.items()) or "—",
                    "slot_tau": {str(s): t for s, t in taus.items()},
                    "tok_s_off": _figure(lv.aggregate(lv.off)), "tok_s_on": _figure(lv.aggregate(lv.on)),
                    "speedup": _figure(lv.speedup) if lv.measured else None,
                    "speedup_ci": list(ci) if ci else None,
                    "speedup_ci_text": f"[{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "—",
                    "verdict": lv.verdict(names), "refused": lv.refused, "crashed": lv.crashed,
                    "differences": lv.differences(names), "slot_findings": lv.slot_findings()})
    return out


def findings(r: Any) -> list[str]:
    """Per level: a server that refused or crashed (its message: the signal and its last lines), a slot that
    drafts nothing, much less than slot 0 or answered nothing, every request whose output differs."""
    out = []
    names = r.serving.prompt_names if r.serving is not None else []
    for lv in levels(r):
        where = f"{Path(lv.drafter).name} at -np {lv.n}"
        if lv.refused:
            out.append(f"{where}: {lv.refused}")
        out += [f"{where}: {f}" for f in lv.slot_findings()]
        out += [f"{where}: {d}" for d in lv.differences(names)]
    return out


SECTIONS = (
    TableSpec("Speed-up by concurrent requests", COLUMNS, lambda c: rows(c.r), id="by_parallel",
              note="per level, llama-server with -np N asked N prompts at once (batches; the arms alternate): "
                   "aggregate tok/s = the batch's generated tokens over its wall time; speed-up = geometric mean over "
                   "batches of the paired ratio, 95% bootstrap CI over batches; τ per slot from the replies' id_slot",
              level=lambda c: "warning" if findings(c.r) else "info", when=lambda c: bool(levels(c.r))),
    NotesSpec("Slots and outputs under concurrency", lambda c: findings(c.r), id="parallel_findings",
              level=lambda c: "warning" if findings(c.r) else "info",
              empty="every request's output is the target alone's; every slot drafts like slot 0",
              when=lambda c: bool(levels(c.r))),
)
