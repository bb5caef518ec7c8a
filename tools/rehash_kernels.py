"""Set the sha256 each quantizer kernel module records for the files whose helpers its numba kernels inline
(``INLINED_SHA256``; see ``dflashkit/codecs/loops/c_ops.py``), after editing one of those files.

Recording a file's new hash changes the recording file's own text, which a third module may record in turn, so
this repeats until nothing changes. Run from the repository root: ``python tools/rehash_kernels.py``.
"""

from __future__ import annotations

import hashlib
import re
import sys
from pathlib import Path

LOOPS = Path(__file__).resolve().parent.parent / "dflashkit" / "codecs" / "loops"
_ENTRY = re.compile(r'"([a-z0-9_]+)": "([0-9a-f]{16})"')


def _sha256(short: str) -> str:
    """The digits `loops.c_ops.require_inlined` compares: of the text with \\n line ends."""
    text = (LOOPS / f"{short}.py").read_bytes().replace(b"\r\n", b"\n")
    return hashlib.sha256(text).hexdigest()[:16]


def rehash() -> list[str]:
    """The module files changed, each once, in the order they were first changed."""
    changed: list[str] = []
    for _ in range(20):
        round_changed = False
        for module in sorted(LOOPS.glob("*.py")):
            text = module.read_text()
            new = _ENTRY.sub(lambda m: f'"{m.group(1)}": "{_sha256(m.group(1))}"', text)
            if new != text:
                module.write_text(new)
                round_changed = True
                if module.name not in changed:
                    changed.append(module.name)
        if not round_changed:
            return changed
    raise SystemExit("the recorded hashes did not settle: two kernel modules record each other")


if __name__ == "__main__":
    names = rehash()
    print("\n".join(names) if names else "every recorded sha256 is current")
    sys.exit(0)
