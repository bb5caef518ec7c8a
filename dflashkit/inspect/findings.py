"""Findings: what ``dflash-inspect`` reports about a file, one stable id each."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class Severity(str, Enum):
    """error fails the run; warning fails it only with --strict; info never does."""

    ERROR = "error"
    WARNING = "warning"
    INFO = "info"

    @property
    def rank(self) -> int:
        return {"error": 2, "warning": 1, "info": 0}[self.value]


@dataclass(frozen=True)
class Finding:
    id: str  # stable, dotted: "gguf.truncated", "safetensors.index_missing_shard", ...
    severity: Severity
    message: str  # one line, names the file/tensor/key, says what is wrong and the fix
    values: dict[str, Any] = field(default_factory=dict)  # the numbers involved, for --json

    def __post_init__(self) -> None:
        # Names read from a file may contain newlines; a finding is always one line.
        if "\n" in self.message or "\r" in self.message:
            object.__setattr__(self, "message", self.message.replace("\r", "\\r").replace("\n", "\\n"))
        object.__setattr__(self, "severity", Severity(self.severity))

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "severity": self.severity.value, "message": self.message, "values": dict(self.values)}

    @classmethod
    def from_error(cls, err: Exception, severity: Severity = Severity.ERROR) -> Finding:
        """A reader's GGUFFormatError / CheckpointFormatError (check_id, path, values) as a finding."""
        values = dict(getattr(err, "values", {}) or {})
        path = getattr(err, "path", None)
        if path is not None:
            values.setdefault("file", str(path))
        return cls(getattr(err, "check_id", "inspect.error"), severity, str(err), values)


def error(id: str, message: str, **values: Any) -> Finding:
    return Finding(id, Severity.ERROR, message, values)


def warning(id: str, message: str, **values: Any) -> Finding:
    return Finding(id, Severity.WARNING, message, values)


def info(id: str, message: str, **values: Any) -> Finding:
    return Finding(id, Severity.INFO, message, values)
