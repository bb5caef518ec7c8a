"""One release job: a quant type of a drafter taken from the shared F32 conversion through every check.

quantize (`quantize_gguf`, llama-quantize's policy) → ``inspect --strict`` with the target (`inspect_path`) → diff
against the checkpoint (`diff_drafters`) → parity against the checkpoint (`run_parity`) → τ (`run_acceptance`, the
reference runtime, and llama.cpp's ``--llama-cpp`` when given). No timing runs here: jobs may share the machine,
so speed-ups are measured after every job, alone (`serving_record`). Each step is the library function its command calls;
nothing goes through a command line. `run_job` takes and returns plain data (a `JobSpec`, a dict), so the same call
runs in this process, in a process pool or as a Ray task, and gives the same figures (one torch thread per job:
float reductions do not depend on the worker's thread count).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import DFlashError

#: gates, by the name a failure is reported under
GATE_INSPECT, GATE_DIFF, GATE_PARITY, GATE_NONFINITE, GATE_MIN_TAU = "inspect", "diff", "parity", "non-finite", "min-tau"


@dataclass(frozen=True)
class JobSpec:
    """Everything one job needs, as plain values (it crosses process and machine boundaries)."""

    type_name: str  # llama.cpp's spelling: BF16, Q8_0, …, Q4_K_M_DRAFT
    base: str  # the shared F32 GGUF
    out: str  # OUTDIR/<name>-<TYPE>.gguf
    checkpoint: str  # the HF checkpoint (diff and parity reference)
    target: str  # HF target folder
    prompts: str | None = None
    max_prompts: int | None = None
    max_new_tokens: int = 64
    seed: int = 0
    parity_rounds: int = 4
    min_top1: float = 0.75
    min_tau: float | None = None
    llama_cpp: str | None = None
    target_gguf: str | None = None
    llama_cpp_args: tuple[str, ...] = ()
    imatrix: str | None = None  # an importance matrix every quantized type is made with (--imatrix)
    imatrix_name: str | None = None  # what quantize.imatrix.file records: the base name, never a path of this machine
    threads: int = 1
    llama_cpp_timeout: float = 600.0
    reasoning: str | None = None
    chat_template_kwargs: tuple[tuple[str, Any], ...] = ()
    llama_cpp_src: str | None = None


def _figures_of_file(path: Path) -> dict[str, Any]:
    from ..io.gguf_reader import open_gguf

    with open_gguf(path) as g:
        elements = sum(t.n_elements for t in g.tensors.values())
        tensor_bytes = sum(t.nbytes for t in g.tensors.values())
    size = path.stat().st_size
    return {"size_bytes": size, "parameters": elements,
            "bits_per_weight": round(8 * tensor_bytes / elements, 4) if elements else None}


def _finite(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def run_job(spec: JobSpec) -> dict[str, Any]:
    """Run one job; returns its record (figures, the gates that failed). A step that cannot run at all (a file that
    does not load) raises `DFlashError` naming the type and the step."""
    import torch

    from ..accept import run_acceptance
    from ..diff import diff_drafters
    from ..inspect import inspect_path
    from ..inspect.findings import Severity
    from ..parity import run_parity
    from ..quantize.gguf_file import quantize_gguf

    torch.set_num_threads(1)
    started = time.time()
    out = Path(spec.out)
    step = "quantize"
    failed: list[dict[str, str]] = []
    try:
        quantize_gguf(spec.base, out, spec.type_name, force=True, progress=False, warn=lambda m: None,
                      imatrix=spec.imatrix, imatrix_name=spec.imatrix_name)
        record: dict[str, Any] = {"type": spec.type_name, "file": out.name, **_figures_of_file(out)}

        step = "inspect"
        report = inspect_path(out, strict=True, target=spec.target)
        problems = [f for f in report.findings if f.severity in (Severity.ERROR, Severity.WARNING)]
        record["inspect"] = {"errors": report.count(Severity.ERROR), "warnings": report.count(Severity.WARNING)}
        if problems:
            failed.append({"gate": GATE_INSPECT, "why": f"{problems[0].id}: {problems[0].message}"})

        step = "diff"
        diff = diff_drafters(spec.checkpoint, out)
        worst = diff.tensors[0] if diff.tensors else None  # worst first
        record["diff"] = {"tensors": len(diff.tensors), "worst_rel_rms": _finite(worst.rel_rms) if worst else 0.0,
                          "worst_tensor": worst.canonical if worst else None}
        reasons = diff.failures()  # no threshold: structure, NaN and integer tensors, never an error size
        if reasons:
            failed.append({"gate": GATE_DIFF, "why": "; ".join(reasons)})

        step = "parity"
        parity = run_parity(spec.checkpoint, out, target=spec.target, rounds=spec.parity_rounds, seed=spec.seed)
        overall = parity.overall
        record["parity"] = {"top1": _finite(overall.top1) if overall else None,
                            "kl_mean": _finite(overall.kl_mean) if overall else None, "rounds": spec.parity_rounds}
        reasons = [r.replace("--threshold-top1", "--min-top1") for r in parity.failures(threshold_top1=spec.min_top1)]
        if reasons:
            failed.append({"gate": GATE_PARITY, "why": "; ".join(reasons)})

        step = "τ"
        accept = run_acceptance(spec.target, [str(out)], spec.prompts, max_new_tokens=spec.max_new_tokens,
                                seed=spec.seed, max_prompts=spec.max_prompts, llama_cpp=spec.llama_cpp,
                                target_gguf=spec.target_gguf, llama_cpp_args=spec.llama_cpp_args,
                                threads=spec.threads, llama_cpp_timeout=spec.llama_cpp_timeout,
                                reasoning=spec.reasoning, chat_template_kwargs=dict(spec.chat_template_kwargs) or None,
                                llama_cpp_src=spec.llama_cpp_src)
        run = accept.drafters[0]
        record["tau"] = {"mean": _finite(run.tau), "per_prompt": [_finite(t) for t in run.taus],
                         "nonfinite_rounds": run.nonfinite_rounds, "prompts": len(run.taus),
                         "max_new_tokens": spec.max_new_tokens,
                         "prompt_tokens": sum(map(len, accept.prompt_ids)) / max(1, len(accept.prompt_ids)),
                         "categories": [p.category[:64] for p in accept.prompts]}
        if accept.llama_cpp:
            lc = accept.llama_cpp[0]
            record["tau"]["llama_cpp"] = _finite(lc.tau) if not lc.refused else None
            record["tau"]["llama_cpp_refused"] = lc.refused
            if lc.note:
                record["tau"]["llama_cpp_note"] = lc.note
        if run.nonfinite_rounds:
            failed.append({"gate": GATE_NONFINITE, "why": f"{run.nonfinite_rounds} round(s) with NaN/Inf logits"})
        if spec.min_tau is not None and not (run.tau >= spec.min_tau):
            failed.append({"gate": GATE_MIN_TAU, "why": f"τ {run.tau:.3f} < --min-tau {spec.min_tau:g}"})
    except DFlashError as exc:
        raise DFlashError(f"{spec.type_name}: {step}: {exc}") from None
    record["gates_failed"] = failed
    finished = time.time()
    record["seconds"] = round(finished - started, 3)
    record["started"], record["finished"] = round(started, 3), round(finished, 3)
    record["worker_pid"] = os.getpid()
    return record

