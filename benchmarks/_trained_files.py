"""The trained fixture pair's drafter as GGUF files of several types, made the way ``dflash-release`` makes them
(shared by the benchmarks that measure τ and speed over types): bf16 / f16 converted from the checkpoint, every
other type quantized from its F32 conversion, and with an importance matrix those of ``with_imatrix``."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from dflashkit.converters.convert import convert
from dflashkit.quantize.gguf_file import quantize_gguf

TRAINED = Path(__file__).resolve().parents[1] / "fixtures" / "trained"
_QUIET = dict(progress=False, warn=lambda m: None)


def make_files(tmp: Path, types: Sequence[str], imatrix: Path | None = None,
               with_imatrix: Sequence[str] = ()) -> dict[str, Path]:
    """{type: file} in ``tmp``; a type quantized with ``imatrix`` as ``"<type> +imatrix"``."""
    f32 = tmp / "drafter-f32.gguf"
    convert(TRAINED / "drafter", f32, outtype="f32", target=TRAINED / "target", **_QUIET)
    files: dict[str, Path] = {}
    for t in types:
        files[t] = tmp / f"drafter-{t}.gguf"
        if t.lower() in ("bf16", "f16"):
            convert(TRAINED / "drafter", files[t], outtype=t.lower(), target=TRAINED / "target", **_QUIET)
        else:
            quantize_gguf(f32, files[t], t, **_QUIET)
    for t in with_imatrix:
        files[f"{t} +imatrix"] = tmp / f"drafter-{t}-imatrix.gguf"
        quantize_gguf(f32, files[f"{t} +imatrix"], t, imatrix=imatrix, **_QUIET)
    return files
