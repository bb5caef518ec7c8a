"""The seal of a finished job: a resume keeps only figures this machine's dflashkit measured.

A resumed release keeps a finished job instead of running it again. Its figures come from ``release.json``, a file
anyone with the folder can edit: an edited τ would be "kept" and printed into the card, after which ``--check``
(which compares the card with the record) passes. So every job record carries ``seal``, an HMAC-SHA256 of the job's
figures, its file's sha256 and the release's inputs, keyed by a secret that never leaves this machine
(``$XDG_CACHE_HOME/dflashkit/release-seal.key``, mode 0600, made on first use). A resume keeps a job only when its
seal verifies; any edit of a figure — or a record from another machine — means the job is run again. The seal
proves nothing to anyone else and is not meant to: ``--check`` verifies what can be re-derived from the folder
itself (`check`).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import stat
from pathlib import Path
from typing import Any

KEY_BYTES = 32


def key_path() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "dflashkit" / "release-seal.key"


def _read_key(path: Path) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size != KEY_BYTES:
            return None
        data = os.read(fd, KEY_BYTES + 1)
        return data if len(data) == KEY_BYTES else None
    finally:
        os.close(fd)


def machine_key() -> bytes | None:
    """This machine's sealing key, made on first use; None where it cannot be kept (no job is then ever kept)."""
    path = key_path()
    key = _read_key(path)
    if key is not None:
        return key
    try:  # written whole under a temporary name, then linked: a reader never sees a partial key
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, secrets.token_bytes(KEY_BYTES))
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass  # another process made it a moment ago: theirs is the key
        finally:
            os.unlink(tmp)
    except OSError:
        return None
    return _read_key(path)


def _message(job: dict[str, Any], inputs_digest: str) -> bytes:
    body = {k: v for k, v in job.items() if k != "seal"}
    return json.dumps({"inputs": inputs_digest, "job": body}, sort_keys=True, separators=(",", ":"),
                      allow_nan=False, ensure_ascii=True).encode("ascii")


def seal(job: dict[str, Any], inputs_digest: str, key: bytes | None) -> str | None:
    return None if key is None else hmac.new(key, _message(job, inputs_digest), hashlib.sha256).hexdigest()


def verify(job: dict[str, Any], inputs_digest: str, key: bytes | None) -> bool:
    expected = seal(job, inputs_digest, key)
    got = job.get("seal")
    return expected is not None and isinstance(got, str) and hmac.compare_digest(expected, got)
