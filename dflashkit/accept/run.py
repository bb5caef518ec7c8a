"""`dflash-accept`: what a drafter file is worth in speculative decoding — its acceptance length τ.

Each drafter (HF dir or GGUF of any dialect/type) runs the draft–verify loop of
`dflashkit.runtime.speculative` against the same HF target on the same prompts. Per drafter the
report gives the mean τ (committed tokens per target forward), the histogram of accepted tokens per
round, the acceptance rate per block position, the loop's decode speed in this PyTorch runtime, and
the difference to the *first* drafter with a paired bootstrap confidence interval over prompts.

τ of one prompt = mean over its rounds of (accepted + 1) (docs/formats.md); a drafter's τ is
the mean over prompts of that, as z-lab's benchmark reports it.
"""

import json
import math
import os
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from .report import build_report
from .result import WARMUP_TOKENS, AcceptMeasurement, DrafterRun, distinct_labels
from ..converters.convert import convert
from ..errors import DFlashError, UsageError
from ..files import signals_unwind
from ..llama_cpp import (LlamaCppDrafterRun, check_extra_args, check_prompt_text, find_binary, run_drafter,
                        target_gguf_from_hf, temp_dir)
from ..llama_cpp.server import REQUEST_TIMEOUT_S as LLAMA_CPP_TIMEOUT_S
from ..llama_cpp.http import public_url
from ..llama_cpp.server import SERVER_BINARY, has_server, run_drafter_server
from ..llama_cpp import llama_cpp_src as find_src
from .options import LlamaCppOptions, PromptOptions
from .context import target_context
from .prompts import Prompt, load_prompts, parse_template_kwargs, template_kwargs_for
from ..reporting import Report
from ..runtime import HFTarget, load_drafter
from ..runtime.speculative import check_pair, default_stop_ids, speculative_generate
from .serving_measure import ServingResult, measure_serving
from .serving_plan import ServingPlan, check_parallel_served, check_target_ggufs, plan_serving
from . import context as _context_module
from .parallel import measure_parallel
from .sweep import check_context_levels, sweep_context
from ..runtime.speculative import PrefillCache
from ..llama_cpp.speculative_simple import context_size
from .gap import gap_causes, replay_schedule, serving_gap_causes


class AcceptResult(AcceptMeasurement):
    """An `AcceptMeasurement` with its report."""

    def report(self, max_drop: float | None = None, min_tau: float | None = None,
               max_gap: float | None = None, min_speedup: float | None = None) -> Report:
        return build_report(self, max_drop, min_tau, max_gap, min_speedup)


# ---------------------------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------------------------


#: the lowest sampling temperature: below it the scaled logits overflow float32 (use 0 for greedy)
MIN_TEMPERATURE = 1e-6


def run_acceptance(
    target: str | os.PathLike | HFTarget,
    drafters: Sequence[str | os.PathLike],
    prompts: str | os.PathLike | Sequence[Prompt] | None = None,
    *,
    max_new_tokens: int = 128,
    temperature: float = 0.0,
    seed: int = 0,
    device: str = "cpu",
    dtype: str = "float32",
    keep_quantized: bool = False,
    max_prompts: int | None = None,
    ignore_eos: bool = False,
    warmup: bool = True,
    progress: Callable[[str], None] | None = None,
    reasoning: str | None = None,
    chat_template_kwargs: Mapping[str, Any] | str | None = None,
    llama_cpp: str | os.PathLike | None = None,
    target_gguf: str | os.PathLike | Sequence[str | os.PathLike] | None = None,
    llama_cpp_src: str | os.PathLike | None = None,
    threads: int = 1,
    llama_server: str | os.PathLike | None = None,
    server_url: str | None = None,
    baseline_url: str | None = None,
    draft_n_max: Sequence[int | None] = (None,),
    draft_cache_types: Sequence[str | None] = (None,),
    llama_cpp_args: Sequence[str] = (),
    llama_cpp_timeout: float = LLAMA_CPP_TIMEOUT_S,
    prompt_options: PromptOptions | None = None,
    llama: LlamaCppOptions | None = None,
    context: Sequence[int] | None = None,
    context_file: str | os.PathLike | None = None,
    parallel: Sequence[int] | None = None,
) -> AcceptResult:
    """Run every drafter on every prompt against ``target`` (an HF dir, or an `HFTarget` already loaded).

    Drafters are loaded one at a time (only one sits in memory next to the target). Each
    (drafter, prompt) run is seeded with ``seed + prompt index``, so a prompt gets the same random
    stream with every drafter. ``warmup`` runs a few tokens first so one-time costs stay out of tok/s.

    ``reasoning`` (``"on"``, ``"off"`` or a level such as ``"high"``) sets the chat template's thinking
    switch as z-lab's ``dflash benchmark --reasoning`` does (`reasoning_template_kwargs`);
    ``chat_template_kwargs`` (a mapping, or its JSON text) is merged over that into every
    ``apply_chat_template`` call. Both are recorded in the report and in every trace line.

    ``llama_cpp`` (a llama.cpp build's bin/ folder) also runs every drafter through llama.cpp's
    ``llama-speculative-simple`` on the same prompt texts, greedy (`dflashkit.llama_cpp`), with ``target_gguf`` as
    the target — or the HF target converted by llama.cpp's own converter from ``llama_cpp_src`` (default
    $DFLASHKIT_LLAMA_CPP_SRC). An HF drafter directory is converted to a bf16 GGUF on the fly.

    ``llama_server`` (a build's bin/ folder with ``llama-server``) measures every drafter where users run it: τ,
    speed-up against the target alone and identical output, for every target GGUF (``target_gguf`` may list
    several: quantized targets) × ``draft_cache_types`` × ``draft_n_max`` (`dflashkit.accept.serving_measure`); ``server_url``
    measures a running server instead (``baseline_url``: the same target without a drafter). ``llama_cpp_args``
    are added to every llama.cpp command line (``--no-repack``…; what dflashkit sets itself is refused);
    ``llama_cpp_timeout`` bounds each llama.cpp run, server start and request (seconds).

    ``context`` (token counts, `dflashkit.sweeps.parse_context_levels`) measures everything above once per level,
    each prompt after that many tokens of long context (`dflashkit.accept.context`: ``context_file``'s text, else the
    other prompts'); the result is the shortest level's, with every level in ``by_context`` and the report's "by
    context length" table and cliff (`dflashkit.accept.sweep`). The target prefills each prompt once per level.
    """
    if context is not None:
        context = check_context_levels(context)
    elif context_file is not None:
        raise UsageError("--context-file is the source of --context: give --context N[,N…] too")
    if prompt_options is not None:  # the command lines' values: they stand for the settings they hold
        prompts, max_prompts, max_new_tokens = prompt_options.prompts, prompt_options.max_prompts, \
            prompt_options.max_new_tokens
        seed, reasoning = prompt_options.seed, prompt_options.reasoning
        chat_template_kwargs = dict(prompt_options.chat_template_kwargs) or None
    if llama is not None:
        if len(llama.llama_servers) > 1:
            raise UsageError("--llama-server: dflash-accept measures one build at a time (dflash-release measures "
                             "several side by side) — give it once")
        llama_cpp, llama_cpp_src, threads = llama.llama_cpp, llama.llama_cpp_src, llama.threads
        target_gguf = list(llama.target_ggufs) or None
        llama_server = llama.llama_servers[0] if llama.llama_servers else None
        draft_n_max = llama.draft_n_max or (None,)
        draft_cache_types = llama.draft_cache_types or (None,)
        llama_cpp_args, llama_cpp_timeout = llama.extra_args, llama.timeout
        parallel = llama.parallel or parallel
    parallel = check_parallel_served(parallel or (), llama_server, server_url)  # a usage error before any work
    if not drafters:
        raise UsageError("give at least one drafter")
    if max_new_tokens < 2:
        raise UsageError(f"--max-new-tokens must be at least 2 (the prefill makes the first token; rounds come "
                         f"after it), got {max_new_tokens}")
    if temperature < 0 or not math.isfinite(temperature):
        raise UsageError(f"--temperature must be ≥ 0, got {temperature}")
    if 0 < temperature < MIN_TEMPERATURE:  # logits / 1e-45 overflow to inf: no distribution left to sample
        raise UsageError(f"--temperature {temperature:g}: give 0 (greedy) or at least {MIN_TEMPERATURE:g}")
    if max_prompts is not None and max_prompts < 1:
        raise UsageError(f"--max-prompts must be at least 1, got {max_prompts}")
    say = progress or (lambda message: None)
    if reasoning is not None and (not isinstance(reasoning, str) or not reasoning.strip()):
        raise UsageError("--reasoning: give off, on or a reasoning level (e.g. high)")
    if isinstance(chat_template_kwargs, str) or chat_template_kwargs is None:
        user_kwargs = parse_template_kwargs(chat_template_kwargs)
    elif isinstance(chat_template_kwargs, Mapping):
        user_kwargs = dict(chat_template_kwargs)
    else:
        raise UsageError(f"chat_template_kwargs: expected a mapping or JSON text, got {type(chat_template_kwargs).__name__}")

    if isinstance(prompts, (str, os.PathLike)) or prompts is None:
        source = str(prompts) if prompts is not None else "built-in (chat, code, math, long-context)"
        prompt_list = load_prompts(prompts, limit=max_prompts)
    else:
        source, prompt_list = "given", list(prompts)
    prompt_list = prompt_list[:max_prompts] if max_prompts else prompt_list
    # fail on a missing drafter before spending minutes loading the target
    for d in drafters:
        if not Path(d).exists():
            raise DFlashError(f"{d}: no such file or directory (drafters are HF dirs or GGUF files)")
    llama_binary = converter_src = None
    target_ggufs = ([] if target_gguf is None else [target_gguf] if isinstance(target_gguf, (str, os.PathLike))
                    else list(target_gguf))
    extra_args = check_extra_args(llama_cpp_args)
    server_url, baseline_url = public_url(server_url), public_url(baseline_url)  # credentials: never recorded
    if not (isinstance(llama_cpp_timeout, (int, float)) and math.isfinite(llama_cpp_timeout) and llama_cpp_timeout > 0):
        raise UsageError(f"--llama-cpp-timeout must be a positive number of seconds, got {llama_cpp_timeout!r}")
    plan = None
    if llama_server is not None or server_url is not None or baseline_url is not None or parallel:
        if temperature > 0 and (llama_server is None) != (server_url is None):
            raise UsageError("--llama-server / --server-url measure greedy decoding: use them with --temperature 0")
        # every serving option checked once, before the target loads: the plan the measurement runs
        plan = plan_serving([(str(d), _block_size(d)) for d in drafters], llama_server=llama_server,
                            server_url=server_url, baseline_url=baseline_url, target_ggufs=target_ggufs,
                            draft_n_max=draft_n_max, draft_cache_types=draft_cache_types,
                            max_new_tokens=max_new_tokens, seed=seed, threads=threads, llama_cpp_args=extra_args,
                            timeout=float(llama_cpp_timeout), parallel=parallel or (), target_ggufs_later=True)
    if llama_cpp is not None and temperature > 0:
        raise UsageError("--llama-cpp measures greedy τ: use it with --temperature 0")
    if llama_cpp is not None or llama_server is not None:
        if llama_cpp is not None:  # llama-server where the build has it, else llama-speculative-simple
            llama_binary = (Path(llama_cpp) / SERVER_BINARY if has_server(llama_cpp) else find_binary(llama_cpp))
        if not target_ggufs:  # llama.cpp's own converter makes the target's GGUF, where its source is given
            converter_src = find_src(llama_cpp_src)
        check_target_ggufs(target_ggufs, None if target_ggufs or converter_src is not None else
                           "--llama-cpp" if llama_cpp is not None else "--llama-server",
                           "or --llama-cpp-src DIR, llama.cpp's source tree, to convert --target with llama.cpp's "
                           "own converter")
    elif target_ggufs or llama_cpp_src is not None:
        raise UsageError("--target-gguf / --llama-cpp-src only matter with --llama-cpp or --llama-server BIN_DIR")
    elif extra_args:
        raise UsageError("--llama-cpp-arg only matters with --llama-cpp or --llama-server BIN_DIR")

    if isinstance(target, HFTarget):
        runner = target
    else:
        if not Path(target).is_dir():
            kind = "a file" if Path(target).is_file() else "not found"
            raise UsageError(f"--target {target}: {kind} — dflash-accept runs the target with transformers, so it "
                             "needs the target's HF model directory (config.json + safetensors), not a GGUF")
        say(f"loading target {target}")
        runner = HFTarget(target, device=device, dtype=dtype)

    template = getattr(runner.tokenizer, "chat_template", None)
    template_kwargs = template_kwargs_for(runner.tokenizer, reasoning, user_kwargs)
    notes: list[str] = []
    if template_kwargs and not template:
        notes.append(f"target {runner.path} has no chat template: chat template kwargs {json.dumps(template_kwargs)} "
                     "were not used")
    level_kw = dict(max_new_tokens=max_new_tokens, temperature=temperature, seed=seed, dtype=dtype,
                    keep_quantized=keep_quantized, ignore_eos=ignore_eos, warmup=warmup, say=say, reasoning=reasoning,
                    llama_binary=llama_binary, target_ggufs=target_ggufs, converter_src=converter_src,
                    threads=threads, extra_args=extra_args, plan=plan, llama_cpp_timeout=float(llama_cpp_timeout))
    if context is not None:
        return sweep_context(runner, prompt_list, context, context_file, notes,
                             lambda prompts, level_notes, prefills, first: _measure_level(
                                 runner, prompts, source, drafters, level_notes, template_kwargs, prefills,
                                 **{**level_kw, "plan": plan if first or plan is None else replace(plan, parallel=())}),
                             max_new_tokens=max_new_tokens, template_kwargs=template_kwargs, say=say,
                             target_context=target_context(runner), drafters=drafters, llama_cpp_args=extra_args)
    return _measure_level(runner, prompt_list, source, drafters, notes, template_kwargs, None, **level_kw)


def _measure_level(runner: HFTarget, prompt_list: list[Prompt], source: str, drafters: Sequence[str | os.PathLike],
                   notes: list[str], template_kwargs: dict[str, Any], prefills: PrefillCache | None, *,
                   max_new_tokens: int, temperature: float, seed: int, dtype: str, keep_quantized: bool,
                   ignore_eos: bool, warmup: bool, say: Callable[[str], None], reasoning: str | None,
                   llama_binary: Path | None, target_ggufs: list[Any], converter_src: Path | None, threads: int,
                   extra_args: list[str], plan: ServingPlan | None, llama_cpp_timeout: float) -> AcceptResult:
    """Every drafter on every prompt of one prompt set (one context level), in every runtime asked for."""
    prompt_ids, texts, plain = encode_prompts(runner, prompt_list, max_new_tokens, template_kwargs)
    vocab = _vocab_rows(runner)
    if llama_binary is not None and llama_binary.name != SERVER_BINARY:  # speculative-simple: the prompt is argv

        for p, text in zip(prompt_list, texts):
            try:
                check_prompt_text(text)
            except DFlashError as exc:
                raise DFlashError(f"prompt {p.id}: {exc}") from None
    if plain:
        notes.append(f"target {runner.path} has no chat template: chat prompt(s) {', '.join(plain)} were fed as "
                     "plain text")
    stops = [] if ignore_eos else default_stop_ids(runner)
    banned = default_stop_ids(runner) if ignore_eos else []  # llama.cpp's --ignore-eos never picks them

    runs: list[DrafterRun] = []
    head = None
    for n, path in enumerate(drafters, 1):
        say(f"drafter {n}/{len(drafters)}: loading {path}")
        model = load_drafter(path, device=str(runner.device), dtype=dtype, keep_quantized=keep_quantized)
        if head is None:  # one head for all drafters: same device and dtype
            head = runner.head(dtype=dtype)
        check_pair(model, runner, head, where=f"drafter {path}")
        if warmup:
            speculative_generate(model, runner, prompt_ids[0], max_new_tokens=WARMUP_TOKENS, temperature=temperature,
                                 head=head, stop_token_ids=(), seed=seed, prefills=prefills)
        results = []
        for i, ids in enumerate(prompt_ids):
            r = speculative_generate(model, runner, ids, max_new_tokens=max_new_tokens, temperature=temperature,
                                     head=head, stop_token_ids=stops, seed=seed + i, prefills=prefills)
            results.append(r)
            say(f"drafter {n}/{len(drafters)}: prompt {i + 1}/{len(prompt_ids)} ({prompt_list[i].id}): "
                f"τ {r.tau:.2f} over {r.rounds} round(s)")
        runs.append(DrafterRun(str(path), model.load_info, model.draft_tokens + 1, results))  # verify width  # type: ignore[arg-type]
        if llama_binary is not None:  # the reference on the schedule llama.cpp runs: τ on one accounting
            simple = llama_binary.name != SERVER_BINARY
            runs[-1].schedule = "simple" if simple else "server"
            runs[-1].replayed = replay_schedule(
                model, runner, head, prompt_ids, runs[-1].schedule, n_predict=max_new_tokens,
                n_ctx=[context_size(len(ids), max_new_tokens, model.draft_tokens) if simple else None
                       for ids in prompt_ids],
                stops=stops, banned=banned, prefills=prefills)
        if plan is not None:  # llama-server's τ on one accounting: each n-max served (None: the block's)
            for n_max in sorted({model.draft_tokens if k is None else k for k in plan.draft_n_max}):
                if runs[-1].schedule == "server" and n_max == model.draft_tokens and runs[-1].replayed is not None:
                    runs[-1].server_replays[n_max] = runs[-1].replayed
                    continue
                say(f"drafter {n}/{len(drafters)}: the reference on llama-server's schedule (n-max {n_max})")
                runs[-1].server_replays[n_max] = replay_schedule(
                    model, runner, head, prompt_ids, "server", n_predict=max_new_tokens, n_ctx=[None] * len(prompt_ids),
                    stops=stops, banned=banned, prefills=prefills, n_max=n_max)
        del model  # free it before the next one loads
    for run, label in zip(runs, distinct_labels([r.path for r in runs])):
        run.label = label
    llama_runs, gguf_used, serving = None, None, None
    if llama_binary is not None or plan is not None:
        llama_runs, gguf_used, serving = _run_llama_cpp(
            llama_binary, runs, texts, prompt_ids, prompt_list, runner, target_ggufs, converter_src, max_new_tokens,
            threads, notes, say, ignore_eos, extra_args, plan, llama_cpp_timeout, vocab)
    return AcceptResult(
        target=str(runner.path), prompts=prompt_list, prompt_source=source, prompt_ids=prompt_ids, drafters=runs,
        max_new_tokens=max_new_tokens, temperature=float(temperature), seed=seed, device=str(runner.device),
        dtype=dtype, stop_token_ids=stops, notes=notes, reasoning=reasoning, chat_template_kwargs=template_kwargs,
        llama_cpp=llama_runs, target_gguf=gguf_used, serving=serving,
    )


def encode_prompts(runner: HFTarget, prompt_list: Sequence[Prompt], max_new_tokens: int,
                   template_kwargs: Mapping[str, Any]) -> tuple[list[list[int]], list[str], list[str]]:
    """(token ids, the text the target reads, the ids of chat prompts fed as plain text) of every prompt, each
    checked: some tokens, ids inside the vocabulary, room for ``max_new_tokens`` in the context, and the whole set
    under `MAX_PROMPT_TOKENS_TOTAL`. The one rendering every measurement of a run shares (reference runtime,
    llama.cpp, llama-server)."""
    prompt_ids, plain, texts = [], [], []
    total_tokens = 0
    context = target_context(runner)
    vocab = _vocab_rows(runner)
    for p in prompt_list:
        ids, fallback = p.ids(runner, template_kwargs)
        if not ids:
            raise DFlashError(f"prompt {p.id}: encodes to no tokens — give it some text")
        outside = [t for t in ids if not 0 <= t < vocab] if vocab else []
        if outside:
            raise DFlashError(f"prompt {p.id}: the tokenizer of {runner.path} gives token id {outside[0]}, outside the "
                              f"model's vocabulary of {vocab} — its tokenizer.json (a post-processor's or an added "
                              "token's id) does not fit the model")
        if context is not None and len(ids) + max_new_tokens > context:
            raise DFlashError(f"prompt {p.id}: {len(ids)} tokens + {max_new_tokens} new tokens exceed the target's "
                              f"context of {context} (max_position_embeddings) — shorten the prompt or lower "
                              "--max-new-tokens")
        total_tokens += len(ids)
        limit = _context_module.MAX_PROMPT_TOKENS_TOTAL
        if total_tokens > limit:  # the ids and texts of every prompt are kept for the whole run
            raise DFlashError(f"prompt {p.id}: the prompts hold over {limit:,} tokens together — "
                              "give fewer or shorter prompts (--max-prompts uses the first N)")
        prompt_ids.append(ids)
        texts.append(p.rendered(runner, template_kwargs)[0])
        if fallback:
            plain.append(p.id)
    return prompt_ids, texts, plain


def _run_llama_cpp(binary: Path | None, runs: list[DrafterRun], texts: list[str], prompt_ids: list[list[int]],
                   prompt_list: list[Prompt], runner: HFTarget, target_ggufs: list[str | os.PathLike],
                   converter_src: Path | None, max_new_tokens: int, threads: int, notes: list[str],
                   say: Callable[[str], None], ignore_eos: bool, extra_args: list[str], plan: ServingPlan | None,
                   timeout: float, vocab: int | None,
                   ) -> tuple[list[LlamaCppDrafterRun] | None, str | None, ServingResult | None]:
    """Every drafter through llama-speculative-simple (the first target GGUF) and / or llama-server (every target
    GGUF), HF dirs converted to bf16 GGUFs in a temp folder that is gone when this returns."""
    out: list[LlamaCppDrafterRun] | None = None
    serving = None
    with signals_unwind(), temp_dir() as tmp:  # TERM / HUP: the servers stopped, the temp GGUFs removed
        ggufs = list(target_ggufs)
        if not ggufs and converter_src is not None:
            say(f"llama.cpp: converting target {runner.path} with llama.cpp's convert_hf_to_gguf.py (bf16)")
            ggufs = [target_gguf_from_hf(runner.path, Path(tmp) / "target-bf16.gguf", converter_src)]
            notes.append(f"llama.cpp target: {runner.path} converted to bf16 by llama.cpp's own convert_hf_to_gguf.py")
        drafter_ggufs = []
        for n, d in enumerate(runs, 1):
            gguf_path = Path(d.path)
            if gguf_path.is_dir() and ggufs:
                gguf_path = Path(tmp) / f"drafter-{n}-bf16.gguf"
                say(f"llama.cpp: converting {d.path} to bf16 GGUF (tokenizer from {ggufs[0]})")
                convert(d.path, gguf_path, outtype="bf16", target=ggufs[0], progress=False, warn=lambda m: None)
                notes.append(f"llama.cpp ran {d.name} as a bf16 GGUF converted on the fly by dflash-convert")
            drafter_ggufs.append(gguf_path)
        if binary is not None:
            # llama-server's JSON where the build has it (counts that cannot be lost), else speculative-simple's log
            via_server = binary.name == SERVER_BINARY  # chosen once, when the options were checked
            runner_fn = run_drafter_server if via_server else run_drafter
            dir_or_binary = binary.parent if via_server else binary
            out = [runner_fn(dir_or_binary, ggufs[0], d.path, gguf_path, texts, n_predict=max_new_tokens,
                             draft_max=d.block_size - 1, threads=threads, progress=say,
                             prompt_tokens=[len(ids) for ids in prompt_ids], ignore_eos=ignore_eos,
                             extra_args=extra_args, timeout=timeout, **({"vocab": vocab} if via_server else {}))
                   for d, gguf_path in zip(runs, drafter_ggufs)]
            for d, gguf_path, l in zip(runs, drafter_ggufs, out):  # what a gap could come from, while the files exist
                d.gap_causes = gap_causes(d.path, gguf_path, d.info.tensor_types, [len(ids) for ids in prompt_ids],
                                          [r.n_prompt_tokens for r in l.runs])
            notes.append("llama.cpp τ measured with " + ("llama-server (counts from its JSON timings)"
                                                         if via_server else
                                                         "llama-speculative-simple (counts from its log)"))
            if ignore_eos:
                notes.append("--ignore-eos: llama.cpp's --ignore-eos bans the end-of-sequence token (logit bias −inf), "
                             "the reference runtime generates through it; τ compares the two only while neither emits "
                             "it")
            mismatched = sorted({i for l in out for i, r in enumerate(l.runs)
                                 if r.n_prompt_tokens is not None and r.n_prompt_tokens != len(prompt_ids[i])})
            if mismatched:
                notes.append(f"llama.cpp tokenized {len(mismatched)} prompt(s) to another length than the HF tokenizer "
                             f"(prompt indices {mismatched[:10]}): those τ pairs compare different token streams")
        if plan is not None:
            plan = plan.on_targets(ggufs)
            serving = measure_serving(
                [(d.path, g, d.block_size) for d, g in zip(runs, drafter_ggufs)], texts, [p.id for p in prompt_list],
                plan, prompt_tokens=[len(ids) for ids in prompt_ids], ignore_eos=ignore_eos, progress=say, vocab=vocab)
            for r in serving.runs:  # the server's τ against the reference's on its schedule, and the causes
                d = next((d for d in runs if d.path == r.drafter), None)
                if d is None and len(runs) == 1:  # a server the user runs (its row names the URL): the one drafter
                    d = runs[0]
                if d is None:  # several drafters and one server of the user's: which one it serves is not known
                    continue
                # a server the user runs: its n-max is the block's unless its replies say it is capped
                served = r.draft_n_max if r.draft_n_max is not None else \
                    (d.block_size - 1 if plan.llama_server is not None or r.capped_n_max() is None else None)
                if served is not None and served in d.server_replays:
                    r.reference_taus = [x.tau for x in d.server_replays[served]]
                r.gap_causes = serving_gap_causes(d, r, [len(ids) for ids in prompt_ids], ggufs)
            if plan.parallel:  # the first target GGUF, each drafter at its block's n-max, under N concurrent requests
                assert plan.llama_server is not None
                ctx = max(len(ids) for ids in prompt_ids) + 2 * (max_new_tokens + max(d.block_size for d in runs)) + 64
                for d, g in zip(runs, drafter_ggufs):
                    alone = next((r.taus for r in serving.runs if r.drafter == d.path and r.draft_cache_type is None
                                  and r.target_gguf == str(ggufs[0]) and r.on
                                  and r.draft_n_max in (None, d.block_size - 1)), ())
                    serving.parallel += measure_parallel(
                        plan.llama_server, ggufs[0], (d.path, g, d.block_size), texts, plan.parallel,
                        max_new_tokens=max_new_tokens, ctx_per_request=ctx, threads=threads, extra_args=extra_args,
                        timeout=plan.timeout, vocab=vocab, seed=plan.seed, ignore_eos=ignore_eos, progress=say,
                        alone_taus=alone)
        kept = str(ggufs[0]) if ggufs else None
    return out, kept, serving


def _block_size(drafter: str | os.PathLike) -> int:
    """A drafter's block size from its config or metadata (no weights read): the bound of its n-max."""
    from ..drafters import open_drafter

    with open_drafter(drafter) as d:
        return int(d.spec.block_size)


def _vocab_rows(runner: HFTarget) -> int | None:
    """Rows of the target's input embedding: a token id at or past it cannot be run."""
    try:
        return int(runner.model.get_input_embeddings().num_embeddings)
    except (AttributeError, TypeError, ValueError):
        return None
