"""Byte identity of every report across two versions of dflashkit: the check a report refactor must pass.

Builds the inputs once (tests' drafters and targets, the trained pair converted to GGUF and quantized, a GGUF with
tensors dropped / renamed / reshaped and a key changed, a DSpark drafter with its integer d2t, a small release),
then, for the working tree and for a git revision (checked out into a temporary worktree), builds every report of
those runs — ``dflash-diff``, ``dflash-parity``, ``dflash-accept`` (one and two drafters, llama.cpp columns, a
llama-server section from the tests' stand-in server and one built by hand), ``dflash-inspect`` and the release's
model card — and renders each in text, JSON, Markdown and HTML. The accept runs' measured times are set to fixed
values on the result (the same way in both versions) before a report is built, so decode tok/s is the same; temp
paths are written IN / OUT. Prints one line per output that differs (with its first differing line) and a summary;
exit 1 when anything differs.

    python tools/compare_reports.py --ref HEAD        # a few minutes on 2 cores
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from revision import ROOT, ref_and_now  # tools/ is on sys.path when a tool runs

RUN = r'''
import copy, json, sys
from pathlib import Path
code, inputs, out = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
sys.path.insert(0, str(code / "tests"))  # the stand-in llama-server
import torch
torch.set_num_threads(1)
import dflashkit
assert Path(dflashkit.__file__).resolve().is_relative_to(code.resolve()), dflashkit.__file__
from dflashkit.accept import run_acceptance
from dflashkit.diff import diff_drafters
from dflashkit.inspect import inspect_paths
from dflashkit.llama_cpp.server import Completion
from dflashkit.llama_cpp.speculative_simple import LlamaCppDrafterRun, LlamaCppPromptRun
from dflashkit.parity import run_parity
from dflashkit.release.card import render_card
try:
    from dflashkit.accept.serving_measure import ServingResult, ServingRun
except ImportError:  # a revision before the serving modules were named for what they do
    from dflashkit.accept.serving import ServingResult, ServingRun
import standin_server

out.mkdir(parents=True, exist_ok=True)
FORMATS = ("text", "json", "markdown", "html")
res = {}
def norm(text):
    return text.replace(str(out), "OUT").replace(str(inputs), "IN")
def add(name, report):
    for fmt in FORMATS:
        try:
            res[f"{name} [{fmt}]"] = norm(report.render(fmt))
        except Exception as e:  # a refusal is an output too
            res[f"{name} [{fmt}]"] = f"raised {type(e).__name__}: {norm(str(e))}"
I, T = inputs, inputs / "trained"

# ---- dflash-diff ------------------------------------------------------------------------------------------
for name, a, b, variants in (
    ("hf-vs-f16", I / "qwen-hf", I / "qwen-f16.gguf", [{}, {"threshold": 1e-4}]),
    ("hf-vs-q8_0", I / "qwen-hf", I / "qwen-q8_0.gguf", [{}, {"threshold": 0.005}]),
    ("hf-vs-luce-bf16", I / "qwen-hf", I / "qwen-luce.gguf", [{}]),
    ("f16-vs-f16", I / "qwen-f16.gguf", I / "qwen-f16.gguf", [{}, {"threshold": 0.0}]),
    ("trained-hf-vs-Q4_K_M", T / "drafter", I / "trained-Q4_K_M.gguf", [{}, {"threshold": 0.05}, {"threshold": 1.0}]),
    ("trained-q8_0-vs-Q4_K_M", I / "trained-q8_0.gguf", I / "trained-Q4_K_M.gguf", [{}]),
    ("f16-vs-broken", I / "qwen-f16.gguf", I / "qwen-broken.gguf", [{}, {"allow_missing": True},
                                                                   {"allow_missing": True, "threshold": 0.01}]),
    ("dspark-hf-vs-f32", I / "zoo" / "spec-dspark", I / "dspark-f32.gguf", [{}]),
    ("dspark-hf-vs-q8_0", I / "zoo" / "spec-dspark", I / "dspark-q8_0.gguf", [{"threshold": 0.01}]),
    ("dspark-f32-vs-d2t-changed", I / "dspark-f32.gguf", I / "dspark-d2t.gguf", [{}]),
):
    r = diff_drafters(a, b, progress=False)
    for kw in variants:
        add(f"diff {name} {json.dumps(kw, sort_keys=True)}", r.report(**kw))

# ---- dflash-parity ----------------------------------------------------------------------------------------
gates = [(None, None), (0.99, 1e-6), (0.5, 0.05)]
for name, ref, cand, kw, thresholds in (
    ("trained hf-target Q4_K_M", T / "drafter", I / "trained-Q4_K_M.gguf", dict(target=T / "target", rounds=3), gates),
    ("trained hf-target q8_0 skip-weights", T / "drafter", I / "trained-q8_0.gguf",
     dict(target=T / "target", rounds=2, weights=False), gates[:2]),
    ("qwen gguf-target f16 dump", I / "qwen-hf", I / "qwen-f16.gguf",
     dict(target=I / "target64" / "target.gguf", rounds=2, dump=out / "parity.npz", force=True), gates),
    ("qwen gguf-target q8_0", I / "qwen-hf", I / "qwen-q8_0.gguf", dict(target=I / "target64" / "target.gguf"),
     gates[:1]),
    ("qwen no-target", I / "qwen-hf", I / "qwen-q8_0.gguf", dict(rounds=2), gates[:1]),
    ("qwen no-target skip-weights", I / "qwen-hf", I / "qwen-f16.gguf", dict(weights=False), gates[:1]),
):
    r = run_parity(ref, cand, **kw)
    for top1, kl in thresholds:
        add(f"parity {name} top1={top1} kl={kl}", r.report(threshold_top1=top1, threshold_kl=kl))

# ---- dflash-accept ----------------------------------------------------------------------------------------
def fixed_times(result):
    """The measured times, set the same way in both versions: decode tok/s no longer depends on the machine."""
    for d in result.drafters:
        for k, run in enumerate(d.runs):
            run.prefill_s, run.decode_s = 0.25, 0.5 + 0.125 * k
    return result

def completion(tps, tokens=None, accepted=0, drafted=0):
    tokens = tokens if tokens is not None else list(range(17))
    return Completion(tokens=tokens, predicted_n=len(tokens), predicted_ms=(len(tokens) - 1) / tps * 1e3,
                      draft_n=drafted, draft_accepted=accepted, prompt_n=10, speculated=drafted > 0)

def serving_by_hand(result):
    names = [p.id for p in result.prompts]
    def run(drafter, off, on, cache="f16", n_max=15, **kw):
        r = ServingRun(str(I / "target-Q4_K_M.gguf"), drafter, drafter + ".gguf", n_max, cache, **kw)
        r.off = [completion(x) for x in off]
        r.on = [completion(x, accepted=12, drafted=30) for x in on]
        return r
    n = len(names)
    gain = run("a/drafter", [100.0] * n, [200.0 + 10 * i for i in range(n)])
    loss = run("b/drafter", [100.0] * n, [70.0 + i for i in range(n)], cache=None, n_max=None)
    differs = run("a/drafter", [100.0] * n, [150.0] * n, cache="q8_0", n_max=4)
    differs.on[-1] = completion(150.0, tokens=[*range(5), 99, *range(6, 17)], accepted=12, drafted=30)
    refused = run("b/drafter", [], [], refused="llama_model_load: error loading model: missing tensor fc.weight")
    crashed = run("b/drafter", [], [], cache="q4_0", refused="llama-server crashed (SIGSEGV) while loading",
                  crashed=True)
    unmeasured = run("a/drafter", [], [300.0] * n)
    one = run("a/drafter", [100.0], [120.0])
    runs = [gain, loss, differs, refused, crashed, unmeasured, one]
    for r in runs:
        r.label = r.drafter
    return ServingResult(runs, names, 16, "llama-server from IN/bin (started by dflashkit on 127.0.0.1)", 1,
                         ["--no-repack"], ["a note on how it was measured"])

def llama_cpp_by_hand(result):
    runs = []
    for j, d in enumerate(result.drafters):
        if j == 1:
            runs.append(LlamaCppDrafterRun(d.path, str(I / f"d{j}.gguf"), [], "missing tensor fc.weight"))
        else:
            runs.append(LlamaCppDrafterRun(d.path, str(I / f"d{j}.gguf"), [
                LlamaCppPromptRun(16, 30 + i, 10 + i, len(ids)) for i, ids in enumerate(result.prompt_ids)]))
    return runs

accept_gates = [{}, {"max_drop": 0.05, "min_tau": 1.5}, {"max_drop": 0.5, "min_tau": 50.0, "max_gap": 0.1,
                                                        "min_speedup": 1.2}]
prompts = dict(prompts=T / "prompts.jsonl", max_prompts=4, max_new_tokens=24, warmup=False)
one = fixed_times(run_acceptance(T / "target", [T / "drafter"], **prompts))
two = fixed_times(run_acceptance(T / "target", [T / "drafter", I / "trained-Q4_K_M.gguf"], seed=3,
                                 chat_template_kwargs='{"x": 1}', **prompts))
sampled = fixed_times(run_acceptance(T / "target", [T / "drafter", I / "trained-Q4_K_M.gguf"], temperature=1.0,
                                     seed=1, **prompts))
worse = copy.deepcopy(two)  # the second drafter made worse by hand: Δτ, its CI, flags and warnings
for k, run in enumerate(worse.drafters[1].runs):
    run.accepted = [] if k == 0 else [max(0, a - 2 - k) for a in run.accepted]
    run.drafted = [] if k == 0 else run.drafted
    run.nonfinite_rounds = int(k == 1)
example = fixed_times(run_acceptance(I / "example" / "target", [I / "example" / "drafter"],
                                     max_prompts=2, max_new_tokens=8, warmup=False, ignore_eos=True))
bin_dir = standin_server.make(out / "bin")
served = fixed_times(run_acceptance(T / "target", [I / "trained-bf16.gguf", I / "trained-Q4_K_M.gguf"],
                                    llama_server=bin_dir, target_gguf=[I / "target-fake.gguf"],
                                    draft_cache_types=["f16", "q8_0"], **prompts))
for name, r in (("one drafter", one), ("two drafters", two), ("two drafters sampled", sampled),
                  ("two drafters, the second worse", worse),
                  ("random example", example),
                ("stand-in llama-server", served)):
    for kw in accept_gates:
        add(f"accept {name} {json.dumps(kw, sort_keys=True)}", r.report(**kw))
    if name == "two drafters":
        with_llama = copy.copy(r)
        with_llama.llama_cpp, with_llama.target_gguf = llama_cpp_by_hand(r), str(I / "target-Q4_K_M.gguf")
        with_llama.serving = serving_by_hand(r)
        for kw in accept_gates:
            add(f"accept {name} + llama.cpp + serving by hand {json.dumps(kw, sort_keys=True)}", with_llama.report(**kw))

# ---- dflash-inspect ---------------------------------------------------------------------------------------
for name, paths, kw in (
    ("files", [I / "qwen-f16.gguf", I / "trained-Q4_K_M.gguf", I / "qwen-hf"], {}),
    ("broken strict", [I / "qwen-broken.gguf", I / "dspark-f32.gguf", I / "nothing-here.gguf"], {"strict": True}),
    ("with target", [I / "trained-q8_0.gguf"], {"target": str(T / "target")}),
):
    add(f"inspect {name}", inspect_paths([str(p) for p in paths], **kw))

# ---- the release's model card -----------------------------------------------------------------------------
record = json.loads((I / "release" / "release.json").read_text())
res["release card"] = norm(render_card(record))
failed = copy.deepcopy(record)
last = failed["types"][-1]
failed["jobs"][last]["gates_failed"] = [{"gate": "parity", "why": "top-1 50% < 75% | [x](y)"}]
failed["jobs"][last]["serving"] = [{"build": "b", "target_gguf": "t.gguf", "draft_n_max": 15,
    "draft_cache_type": None, "tau": 4.0, "tau_per_prompt": [4.0], "acceptance_rate": 0.75, "drafted": 4,
    "accepted": 3, "tokens_per_s_on": 175.0, "tokens_per_s_off": 100.0, "per_prompt_tokens_per_s": [[175.0, 100.0]],
    "speedup": 1.75, "speedup_ci": None, "verdict": "net gain", "refused": None}]
failed["serving"] = {"builds": ["b"], "host": "x86_64, 2 cores", "draft_n_max": [15], "draft_cache_types": [None]}
res["release card with a failed gate"] = norm(render_card(failed))
(out / "reports.json").write_text(json.dumps(res, ensure_ascii=False, indent=1))
'''


def _rewrite(src: Path, out: Path, *, drop=(), rename=None, reshape=None, metadata=None, scale_ints=None) -> Path:
    """A copy of a GGUF with tensors dropped / renamed / reshaped (same bytes), keys changed, int tensors offset."""
    import numpy as np

    from dflashkit.io.gguf_reader import open_gguf
    from dflashkit.io.gguf_writer import MetadataEntry, TensorToWrite, write_gguf

    rename, reshape, metadata, scale_ints = rename or {}, reshape or {}, metadata or {}, scale_ints or {}
    with open_gguf(src) as g:
        entries = [MetadataEntry(k, metadata.get(k, kv.value), kv.type, kv.sub_type) for k, kv in g.kvs.items()]
        tensors = []
        for name, info in g.tensors.items():
            if name in drop:
                continue
            data = np.array(g.raw(name))
            if name in scale_ints:  # an integer tensor (d2t): one element changed
                ints = data.view(np.int64).copy()
                ints[3] += scale_ints[name]
                data = ints.view(np.uint8)
            tensors.append(TensorToWrite(rename.get(name, name), reshape.get(name, info.shape), info.ggml_type,
                                         lambda d=data: [d]))
        write_gguf(out, str(g.get("general.architecture")), entries, tensors, progress=False)
    return out


def build_inputs(root: Path) -> None:
    sys.path.insert(0, str(ROOT / "fixtures"))
    import make_drafters
    import make_target
    import make_zoo

    from dflashkit.converters.convert import convert
    from dflashkit.io.gguf_reader import open_gguf
    from dflashkit.quantize.gguf_file import quantize_gguf
    from dflashkit.accept.options import PromptOptions
    from dflashkit.release import release

    quiet = dict(progress=False, warn=lambda m: None)
    root.mkdir(parents=True)
    for name in ("trained", "example"):
        shutil.copytree(ROOT / "fixtures" / name, root / name)
    trained = root / "trained"
    hf64 = make_target.make_hf_target(root / "target64" / "hf", hidden_size=64, n_layers=make_drafters.TARGET_LAYERS,
                                      mask_token_id=make_drafters.MASK_TOKEN_ID)
    target64 = make_target.make_gguf_target(root / "target64" / "target.gguf", hf64)
    qwen = make_drafters.make_drafter(root / "qwen-hf", "qwen3-b16")
    convert(qwen, root / "qwen-f16.gguf", outtype="f16", target=target64, **quiet)
    convert(qwen, root / "qwen-q8_0.gguf", outtype="q8_0", target=target64, **quiet)
    convert(qwen, root / "qwen-luce.gguf", outtype="bf16", dialect="luce", target=target64, **quiet)
    with open_gguf(root / "qwen-f16.gguf") as g:
        names = list(g.tensors)
        shapes = {n: g.tensors[n].shape for n in names}
        block_key = next(k for k in g.kvs if k.endswith("block_size"))
        block = int(g.kvs[block_key].value)
    two_d = [n for n in names if len(shapes[n]) == 2]
    _rewrite(root / "qwen-f16.gguf", root / "qwen-broken.gguf", drop=(two_d[0],), rename={two_d[1]: "mystery.weight"},
             reshape={two_d[2]: tuple(reversed(shapes[two_d[2]]))}, metadata={block_key: block + 1})
    for outtype in ("bf16", "q8_0", "f32"):
        convert(trained / "drafter", root / f"trained-{outtype}.gguf", outtype=outtype, target=trained / "target",
                **quiet)
    quantize_gguf(root / "trained-f32.gguf", root / "trained-Q4_K_M.gguf", "Q4_K_M", **quiet)
    (root / "target-fake.gguf").write_bytes(b"GGUF")  # the stand-in llama-server never reads it
    zoo_target, made = make_zoo.make_zoo(root / "zoo", ["spec-dspark"])
    for outtype in ("f32", "q8_0"):
        convert(made["spec-dspark"], root / f"dspark-{outtype}.gguf", outtype=outtype, target=zoo_target, **quiet)
    _rewrite(root / "dspark-f32.gguf", root / "dspark-d2t.gguf", scale_ints={"d2t": 5})
    release(trained / "drafter", root / "release", target=trained / "target", types="BF16,Q4_K_M",
            prompt_options=PromptOptions(max_prompts=2, max_new_tokens=8), parity_rounds=1, workers=1)


def outputs(code: Path, inputs: Path, out: Path) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(code), OMP_NUM_THREADS="1")
    run = subprocess.run([sys.executable, "-c", RUN, str(code), str(inputs), str(out)], env=env, capture_output=True,
                         text=True, cwd=out.parent)
    if run.returncode != 0:
        raise SystemExit(f"{code}: building the reports failed:\n{run.stderr[-3000:]}")
    return json.loads((out / "reports.json").read_text())


def first_difference(a: str | None, b: str | None) -> str:
    if a is None or b is None:
        return "missing in " + ("the revision" if a is None else "the working tree")
    la, lb = a.splitlines(), b.splitlines()
    for i, (x, y) in enumerate(zip(la, lb)):
        if x != y:
            return f"line {i + 1}:\n    - {x[:300]}\n    + {y[:300]}"
    return f"lengths differ ({len(la)} vs {len(lb)} lines; {len(a)} vs {len(b)} characters)"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ref", required=True, help="git revision to compare the working tree with")
    ap.add_argument("--keep", metavar="DIR", help="keep the inputs and both versions' reports in DIR")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="dflash-reports-") as tmp:
        work = Path(args.keep).absolute() if args.keep else Path(tmp)
        build_inputs(work / "in")
        ref, now = ref_and_now(args.ref, work, outputs)
    differ = sorted(k for k in ref.keys() | now.keys() if ref.get(k) != now.get(k))
    for k in differ:
        print(f"DIFFERS {k}: {first_difference(ref.get(k), now.get(k))}")
    refused = sum(v.startswith("raised ") for v in now.values())
    print(f"{len(now)} outputs ({len(now) - refused} reports, {refused} refusals): {len(differ)} differ from {args.ref}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
