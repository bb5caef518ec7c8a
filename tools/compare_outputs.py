"""Byte identity of every output across two versions of dflashkit: the check a refactor must pass.

Builds the fixtures once (tests' drafters of every schema family, the drafter zoo, their targets), then, for the
working tree and for a git revision (checked out into a temporary worktree), converts every fixture in every dialect
(f32 / f16 / bf16 / q8_0 / Q4_K_M in llama.cpp's, f16 in the others), translates each llama.cpp f16 file to the other
dialects and quantizes it to Q4_K_M. Prints one line per output that differs (sha256, or the error message of a
refusal) and a summary; exit 1 when anything differs.

    python tools/compare_outputs.py --ref 59cc5fa        # ~4 min on 2 cores
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from revision import ROOT, ref_and_now  # tools/ is on sys.path when a tool runs

RUN = r'''
import hashlib, json, sys
from pathlib import Path
from dflashkit.converters.convert import convert
from dflashkit.quantize.gguf_file import quantize_gguf
from dflashkit.errors import DFlashError
inputs, out = Path(sys.argv[1]), Path(sys.argv[2])
out.mkdir(parents=True, exist_ok=True)
QUIET = dict(warn=lambda m: None, progress=False, force=True)
def digest(p): return hashlib.sha256(Path(p).read_bytes()).hexdigest()
def target(name):
    if name.startswith("zoo/"): return inputs / "zoo" / "target-qwen3"
    return inputs / ("target72" if "gemma4" in name else "target64") / "target.gguf"
def attempt(key, fn, dst):
    try:
        fn(dst); res[key] = digest(dst)
    except DFlashError as e:
        res[key] = "refused: " + str(e).replace(str(out), "OUT")
res = {}
srcs = {f"drafters/{p.name}": p for p in (inputs / "drafters").iterdir()}
srcs.update({f"zoo/{p.name}": p for p in (inputs / "zoo").iterdir() if p.name != "target-qwen3"})
for name, src in sorted(srcs.items()):
    for dialect, outtypes in (("llama.cpp", ("f32", "f16", "bf16", "q8_0", "Q4_K_M")), ("luce", ("f16",)),
                              ("dflash-draft", ("f16",))):
        for outtype in outtypes:
            key = f"{name} {dialect} {outtype}"
            dst = out / (key.replace("/", "_").replace(" ", "__") + ".gguf")
            attempt(key, lambda d: convert(src, d, outtype=outtype, target=target(name), dialect=dialect, **QUIET), dst)
            if dialect == "llama.cpp" and outtype == "f16" and dst.exists():
                for other in ("luce", "dflash-draft"):
                    attempt(f"{key} -> translate {other}", lambda d: convert(dst, d, dialect=other, target=target(name),
                                                                           **QUIET), dst.with_suffix(f".{other}.gguf"))
                attempt(f"{key} -> quantize Q4_K_M", lambda d: quantize_gguf(dst, d, "Q4_K_M", **QUIET),
                        dst.with_suffix(".q4km.gguf"))
print(json.dumps(res))
'''


def build_fixtures(root: Path) -> None:
    sys.path.insert(0, str(ROOT / "fixtures"))
    import make_drafters
    import make_target
    import make_zoo

    make_drafters.make_all(root / "drafters")
    for hidden, mask in ((64, make_drafters.MASK_TOKEN_ID), (72, None)):
        hf = make_target.make_hf_target(root / f"target{hidden}" / "hf", hidden_size=hidden,
                                        n_layers=make_drafters.TARGET_LAYERS, mask_token_id=mask)
        make_target.make_gguf_target(root / f"target{hidden}" / "target.gguf", hf)
    make_zoo.make_zoo(root / "zoo")


def outputs(code: Path, inputs: Path, out: Path) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(code))
    run = subprocess.run([sys.executable, "-c", RUN, str(inputs), str(out)], env=env, capture_output=True, text=True,
                         cwd=out.parent)
    if run.returncode != 0:
        raise SystemExit(f"{code}: the conversions failed:\n{run.stderr[-3000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ref", required=True, help="git revision to compare the working tree with")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="dflash-compare-") as tmp:
        work = Path(tmp)
        build_fixtures(work / "in")
        ref, now = ref_and_now(args.ref, work, outputs)
    differ = sorted(k for k in ref.keys() | now.keys() if ref.get(k) != now.get(k))
    for k in differ:
        print(f"DIFFERS {k}\n  {args.ref}: {ref.get(k)}\n  working tree: {now.get(k)}")
    written = sum(not v.startswith("refused") for v in now.values())
    print(f"{len(now)} outputs ({written} files, {len(now) - written} refusals): {len(differ)} differ from {args.ref}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
