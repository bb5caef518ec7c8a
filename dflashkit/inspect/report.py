"""Per-file and whole-run reports: exit code, ``--json``, and a :class:`dflashkit.reporting.Report`.

The JSON document (``to_dict`` / ``to_json``) is inspect's CI contract and keeps its own shape;
text, Markdown and HTML are rendered by ``reporting.Report`` like every other command's output
(:meth:`InspectReport.to_report`): one table of tensor types and one table of findings per file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dflashkit.bounds import dumps
from dflashkit.inspect.findings import Finding, Severity
from dflashkit.reporting import Column, Field, Report, Table, human_size

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
        """The file's tensor types (when it has any) and its findings, worst first."""
        out: list[Table] = []
        mix = self.summary.get("quant_mix") or {}
        if mix:
            rows = [
                {"type": t, "count": m["count"], "size": human_size(m["bytes"]), "bpw": _fmt_bpw(m["bpw"])}
                for t, m in mix.items()
            ]
            out.append(Table(f"{self.heading()} — quant mix", _MIX_COLUMNS, rows,
                             note=f"overall {_fmt_bpw(self.summary.get('bpw'))}"))
        order = sorted(self.findings, key=lambda f: -f.severity.rank)
        worst = order[0].severity.value if order else "ok"
        title = f"{self.heading()} — findings" if mix else self.heading()
        rows = [{"severity": f.severity.value, "id": f.id, "message": f.message} for f in order]
        out.append(Table(title, _FINDING_COLUMNS, rows, level=worst, empty="ok: no findings"))
        return out


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
        """The run as a ``reporting.Report`` (text, Markdown and HTML come from there)."""
        level = "error" if self.exit_code() else "warning" if self.count(Severity.WARNING) else "ok"
        e, w, i = (self.count(s) for s in (Severity.ERROR, Severity.WARNING, Severity.INFO))
        summary = [Field("files", len(self.files)), Field("errors", e), Field("warnings", w), Field("info", i),
                   Field("strict", self.strict), Field("exit code", self.exit_code())]
        sections = [s for f in self.files for s in f.sections()]
        return Report("dflash-inspect", self.status(), level, summary, sections)

    def render(self, fmt: str) -> str:
        """``json``: the CI document (:meth:`to_json`); ``text`` / ``markdown`` / ``html``: the Report."""
        return self.to_json() if fmt == "json" else self.to_report().render(fmt)

    def to_text(self) -> str:
        return self.to_report().to_text()
