"""The llama.cpp arguments ``--llama-cpp-arg`` refuses, read from each pinned build's ``common/arg.cpp``.

An argument is reserved by what it does, not by its name: every option whose handler writes one of `RESERVED`'s
fields — a model (the target, the draft model, a hub repo, a preset such as ``--fim-qwen-7b-spec`` that downloads
two), the port or the host, the speculative, sampling, context, thread and prompt settings dflashkit measures at —
under every alias it has. ``python tools/reserved_args.py --write`` regenerates ``dflashkit/llama_cpp/
reserved_args.py`` from the source trees in ``DFLASHKIT_LLAMA_CPP_SRC`` and ``DFLASHKIT_LLAMA_CPP_MAINLINE_SRC``
(both pinned builds, as ``.ci/run`` sets them); ``tests/test_reserved_args.py`` checks the generated table covers
each build's file.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "dflashkit" / "llama_cpp" / "reserved_args.py"

#: common_params field (a prefix of its dotted path) → why dflashkit reserves an option that writes it
RESERVED = (
    ("model.", "loads a model"), ("mmproj.", "loads a model"), ("speculative.draft.mparams.", "loads a model"),
    ("port", "sets the port or host"), ("hostname", "sets the port or host"), ("ssl_file_", "sets the port or host"),
    ("api_prefix", "sets the port or host"), ("api_keys", "sets the port or host"), ("public_path", "sets the port or host"),
    ("speculative.", "changes the speculative settings dflashkit measures"),
    ("sampling.", "changes the greedy sampling dflashkit measures"),
    ("n_ctx", "sets the context dflashkit sizes"), ("n_parallel", "sets the slots dflashkit sets"),
    ("n_batch", "sets the batch dflashkit sets"), ("n_ubatch", "sets the batch dflashkit sets"),
    ("cpuparams.n_threads", "sets the threads dflashkit sets"), ("n_predict", "sets what dflashkit generates"),
    ("prompt", "sets what dflashkit generates"), ("escape", "sets what dflashkit generates"),
    ("verbosity", "changes the log dflashkit reads"), ("logging", "changes the log dflashkit reads"),
)
#: options whose handler calls a function instead of writing a field (the log's): reserved by name
BY_NAME = {"--log-disable": "changes the log dflashkit reads", "--log-file": "changes the log dflashkit reads",
           "-lv": "changes the log dflashkit reads", "--verbose": "changes the log dflashkit reads",
           "-v": "changes the log dflashkit reads", "--verbosity": "changes the log dflashkit reads",
           "--log-verbosity": "changes the log dflashkit reads"}
#: spellings of the draft settings older builds took (a build of the future may take them again)
LEGACY = {f: "changes the speculative settings dflashkit measures"
          for f in ("--draft", "--draft-max", "--draft-min", "--draft-n", "--spec-draft-type-k", "--spec-draft-type-v")}
_WRITE = re.compile(r"params\.([A-Za-z_][A-Za-z0-9_.\[\]]*)\s*(?:=(?!=)|\.push_back|\.emplace_back|\.insert|"
                    r"\.assign|\.clear|\.resize|\+=|\.push_front)")


def options(source: str) -> list[tuple[list[str], set[str]]]:
    """Each ``add_opt(common_arg(…))`` of arg.cpp: (its flags, the common_params fields its handler writes)."""
    source = re.sub(r"(?m)^[ \t]*//.*$", "", source)  # whole-line comments (a note between the flag lists)
    out = []
    i = 0
    while (j := source.find("add_opt(common_arg(", i)) >= 0:
        k = j + len("add_opt(")
        depth, n, in_string, escaped = 0, k, False, False
        while n < len(source):
            c = source[n]
            if in_string:
                if escaped:
                    escaped = False
                elif c == "\\":
                    escaped = True
                elif c == '"':
                    in_string = False
            elif c == '"':
                in_string = True
            elif c == "(":
                depth += 1
            elif c == ")":
                depth -= 1
                if depth == 0:
                    break
            n += 1
        body = source[k:n + 1]
        # the flag lists open the constructor: common_arg({"-e", "--escape"}, {"--no-escape"}, "help", handler)
        lists = re.match(r"common_arg\(\s*((?:\{[^{}]*\}\s*,\s*)+)", body)
        flags = re.findall(r'"(-[^"]+)"', lists.group(1)) if lists else []
        out.append((flags, {w.replace("[0]", "") for w in _WRITE.findall(body)}))
        i = n
    return out


def reserved(arg_cpp: Path) -> dict[str, str]:
    """flag → why, for every option of ``arg_cpp`` that writes a reserved field (module doc)."""
    table: dict[str, str] = {}
    for flags, writes in options(arg_cpp.read_text(encoding="utf-8", errors="replace")):
        why = next((reason for w in sorted(writes) for prefix, reason in RESERVED if w.startswith(prefix)), None)
        for flag in flags:
            if why is not None:
                table[flag] = why
            elif flag in BY_NAME:
                table[flag] = BY_NAME[flag]
    return table


def sources() -> list[tuple[str, Path]]:
    out = []
    for build, var in (("0.3.36", "DFLASHKIT_LLAMA_CPP_SRC"), ("b11549", "DFLASHKIT_LLAMA_CPP_MAINLINE_SRC")):
        if os.environ.get(var):
            out.append((build, Path(os.environ[var]) / "common" / "arg.cpp"))
    return out


def render(table: dict[str, str], builds: list[str]) -> str:
    lines = ['"""The llama.cpp arguments dflashkit sets or measures at, and why: generated by tools/reserved_args.py from',
             f"``common/arg.cpp`` of the pinned builds ({', '.join(builds)}) — every option whose handler writes a model,",
             "the port or host, or a speculative, sampling, context, thread or prompt setting, under every alias; do",
             'not edit by hand."""', "", "RESERVED_ARGS: dict[str, str] = {"]
    lines += [f"    {flag!r}: {why!r}," for flag, why in sorted(table.items())]
    return "\n".join(lines + ["}", ""])


def main(argv: list[str]) -> int:
    found = sources()
    if len(found) < 2:
        print("set DFLASHKIT_LLAMA_CPP_SRC and DFLASHKIT_LLAMA_CPP_MAINLINE_SRC (both pinned source trees)",
              file=sys.stderr)
        return 2
    table: dict[str, str] = {**BY_NAME, **LEGACY}
    for _, path in found:
        table.update(reserved(path))
    text = render(table, [b for b, _ in found])
    if "--write" in argv:
        OUT.write_text(text, encoding="utf-8")
        print(f"wrote {OUT.relative_to(ROOT)}: {len(table)} arguments")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
