"""Per-file and whole-run reports: exit code, ``--json`` and the readable text form."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dflashkit.bounds import dumps
from dflashkit.inspect.findings import Finding, Severity

EXIT_OK = 0
EXIT_FINDINGS = 1  # any error (or, with --strict, any warning)


def human_size(n: int | None) -> str:
    if n is None:
        return "?"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{int(size)} B" if unit == "B" else f"{size:.2f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


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

    def to_text(self) -> str:
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
        lines = [f"{self.path}: {', '.join(head)}"]
        mix = s.get("quant_mix") or {}
        if mix:
            parts = [f"{t} x{m['count']} {human_size(m['bytes'])} {_fmt_bpw(m['bpw'])}" for t, m in mix.items()]
            lines.append(f"  quant mix: {'; '.join(parts)}; overall {_fmt_bpw(s.get('bpw'))}")
        order = sorted(self.findings, key=lambda f: -f.severity.rank)
        lines += [f"  {f.severity.value:<7} {f.id}: {f.message}" for f in order] or ["  ok: no findings"]
        return "\n".join(lines)


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

    def to_text(self) -> str:
        blocks = [f.to_text() for f in self.files]
        e, w, i = (self.count(s) for s in (Severity.ERROR, Severity.WARNING, Severity.INFO))
        strict = " (strict)" if self.strict else ""
        blocks.append(f"{len(self.files)} file(s): {e} error(s), {w} warning(s), {i} info — exit {self.exit_code()}{strict}")
        return "\n".join(blocks)
