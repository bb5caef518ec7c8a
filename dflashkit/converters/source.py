"""Where a drafter checkpoint comes from: a local HF directory or a Hugging Face hub repo id.

Hub sources are fetched with huggingface_hub — config, safetensors and index only — and honour
``HF_HUB_OFFLINE=1`` and the local cache.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from ..errors import DFlashError

#: Files a conversion needs from the hub: config, weights, the model card (README.md: llama.cpp's
#: general.* heuristics read its front matter) and MiMo's mask_embedding.pt (read with
#: torch.load(weights_only=True) only); never other pickles or custom code.
HUB_ALLOW_PATTERNS = ["config.json", "*.safetensors", "model.safetensors.index.json", "README.md", "mask_embedding.pt"]
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def is_gguf_path(src: str | os.PathLike) -> bool:
    return str(src).lower().endswith(".gguf")


def resolve_checkpoint_dir(src: str | os.PathLike, *, revision: str | None = None) -> Path:
    """A local directory holding ``config.json`` + safetensors for ``src`` (dir path or repo id)."""
    path = Path(src)
    if path.exists():
        if not path.is_dir():
            raise DFlashError(f"{src}: not a directory — give an HF checkpoint folder (config.json + *.safetensors) or a hub repo id")
        return path
    if not _REPO_ID.match(str(src)):
        raise DFlashError(f"{src}: no such directory, and not a hub repo id (owner/name)")
    return _download(str(src), revision)


def _download(repo_id: str, revision: str | None) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        return Path(snapshot_download(repo_id, revision=revision, allow_patterns=HUB_ALLOW_PATTERNS))
    except LocalEntryNotFoundError:
        offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
        why = "HF_HUB_OFFLINE is set" if offline else "the hub is unreachable"
        raise DFlashError(
            f"{repo_id}: not in the local Hugging Face cache and {why} — download it first "
            f"(huggingface-cli download {repo_id}) or pass a local directory"
        ) from None
    except GatedRepoError:
        raise DFlashError(f"{repo_id}: gated repository — accept its terms on the hub and log in (huggingface-cli login)") from None
    except RepositoryNotFoundError:
        raise DFlashError(f"{repo_id}: repository not found on the hub (check the id, or log in for a private repo)") from None
    except RevisionNotFoundError:
        raise DFlashError(f"{repo_id}: revision {revision!r} not found") from None
    except OSError as exc:
        raise DFlashError(f"{repo_id}: download failed ({exc})") from None
