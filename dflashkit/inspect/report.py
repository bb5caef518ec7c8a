"""Per-file and whole-run reports: exit code, ``--json``, and a :class:`dflashkit.reporting.Report`.

The JSON document (``to_dict`` / ``to_json``) is inspect's CI contract and keeps its own shape;
text, Markdown and HTML are rendered by ``reporting.Report`` like every other command's output
(:meth:`InspectReport.to_report`, the declaration `INSPECT_REPORT` built by ``reporting.build``): one table of tensor
types and one table of findings per file (`FILE_SECTIONS`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dflashkit.bounds import dumps
from dflashkit.inspect.findings import Finding, Severity
from dflashkit.reporting import (Column, EachSpec, FieldSpec, Report, ReportSpec, Table, TableSpec, build,
                                 build_sections, human_size)

EXIT_OK = 0
EXIT_FINDINGS = 1  # any error (or, with --strict, any warning)

_MIX_COLUMNS = [Column("type", "type"), Column("count", "tensors"), Column("size", "size"), Column("bpw", "bpw")]
_FINDING_COLUMNS = [Column("severity", "severity"), Column("id", "id"), Column("message", "message")]


def _fmt_bpw(bpw: float | None) -> str:
    return "-" if bpw is None else f"{bpw:.2f} bpw"


@dataclass
class FileReport:
    path: str
    kind: str  # "gguf" | "safetensors" | "unknown" | "missing"
    summary: dict[str, Any] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)

    def count(self, severity: Severity) -> int:
        return sum(f.severity is severity for f in self.findings)

    def exit_code(self, strict: bool = False) -> int:
        failing = {Severity.ERROR, Severity.WARNING} if strict else {Severity.ERROR}
        return EXIT_FINDINGS if any(f.severity in failing for f in self.findings) else EXIT_OK

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "kind": self.kind,
            "summary": self.summary,
            "findings": [f.to_dict() for f in self.findings],
        }

    def heading(self) -> str:
        """``path: kind vN, arch A, dialect D, N tensors, size``."""
        s = self.summary
        head = [self.kind]
        if s.get("version") is not None:
            head[0] += f" v{s['version']}"
        for label, key in (("arch", "arch"), ("dialect", "dialect")):
            if s.get(key) is not None:
                head.append(f"{label} {s[key]}")
        if s.get("tensor_count") is not None:
            head.append(f"{s['tensor_count']} tensors")
        if s.get("size") is not None:
            head.append(human_size(s["size"]))
        return f"{self.path}: {', '.join(head)}"

    def sections(self) -> list[Table]:
        """The file's tensor types (when it has any) and its findings, worst first (`FILE_SECTIONS`)."""
        return build_sections(FILE_SECTIONS, self)  # type: ignore[return-value]


@dataclass
class InspectReport:
    files: list[FileReport]
    strict: bool = False  # default for exit_code(): --strict makes warnings fail

    def count(self, severity: Severity) -> int:
        return sum(f.count(severity) for f in self.files)

    def exit_code(self, strict: bool | None = None) -> int:
        strict = self.strict if strict is None else strict
        return max((f.exit_code(strict) for f in self.files), default=EXIT_OK)

    def to_dict(self) -> dict[str, Any]:
        return {
            "files": [f.to_dict() for f in self.files],
            "errors": self.count(Severity.ERROR),
            "warnings": self.count(Severity.WARNING),
            "infos": self.count(Severity.INFO),
            "strict": self.strict,
            "exit_code": self.exit_code(),
        }

    def to_json(self, indent: int | None = 2) -> str:
        # default=str: values may carry paths or enums; never let serialisation crash a report.
        return dumps(self.to_dict(), indent=indent, default=str, ensure_ascii=False)  # strict JSON: NaN -> null

    def status(self) -> str:
        """The one-line verdict: counts and exit code."""
        e, w, i = (self.count(s) for s in (Severity.ERROR, Severity.WARNING, Severity.INFO))
        strict = " (strict)" if self.strict else ""
        return f"{len(self.files)} file(s): {e} error(s), {w} warning(s), {i} info — exit {self.exit_code()}{strict}"

    def to_report(self) -> Report:
        """The run as a ``reporting.Report`` (text, Markdown and HTML come from there): `INSPECT_REPORT`, built."""
        return build(INSPECT_REPORT, self)

    def render(self, fmt: str) -> str:
        """``json``: the CI document (:meth:`to_json`); ``text`` / ``markdown`` / ``html``: the Report."""
        return self.to_json() if fmt == "json" else self.to_report().render(fmt)

    def to_text(self) -> str:
        return self.to_report().to_text()


# ---------------------------------------------------------------------------------------------
# The report, declared: per file its quant mix and its findings, built by reporting.build
# ---------------------------------------------------------------------------------------------


def _mix(f: FileReport) -> dict[str, Any]:
    return f.summary.get("quant_mix") or {}


def _worst_first(f: FileReport) -> list[Finding]:
    return sorted(f.findings, key=lambda x: -x.severity.rank)


def _mix_rows(f: FileReport) -> list[dict[str, Any]]:
    return [{"type": t, "count": m["count"], "size": human_size(m["bytes"]), "bpw": _fmt_bpw(m["bpw"])}
            for t, m in _mix(f).items()]


def _finding_rows(f: FileReport) -> list[dict[str, Any]]:
    return [{"severity": x.severity.value, "id": x.id, "message": x.message} for x in _worst_first(f)]


def _worst(f: FileReport) -> str:
    order = _worst_first(f)
    return order[0].severity.value if order else "ok"


def _level(ir: InspectReport) -> str:
    return "error" if ir.exit_code() else "warning" if ir.count(Severity.WARNING) else "ok"


FILE_SECTIONS = (
    TableSpec(lambda f: f"{f.heading()} — quant mix", _MIX_COLUMNS, _mix_rows,
              note=lambda f: f"overall {_fmt_bpw(f.summary.get('bpw'))}", when=lambda f: bool(_mix(f))),
    TableSpec(lambda f: f"{f.heading()} — findings" if _mix(f) else f.heading(), _FINDING_COLUMNS,
              _finding_rows, level=_worst, empty="ok: no findings"),
)

INSPECT_REPORT = ReportSpec(
    title="dflash-inspect",
    status=lambda ir: (ir.status(), _level(ir)),
    fields=(
        FieldSpec("files", lambda ir: len(ir.files)),
        FieldSpec("errors", lambda ir: ir.count(Severity.ERROR)),
        FieldSpec("warnings", lambda ir: ir.count(Severity.WARNING)),
        FieldSpec("info", lambda ir: ir.count(Severity.INFO)),
        FieldSpec("strict", lambda ir: ir.strict),
        FieldSpec("exit code", lambda ir: ir.exit_code()),
    ),
    sections=(EachSpec(lambda ir: ir.files, FILE_SECTIONS),),
)
