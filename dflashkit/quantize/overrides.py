"""``--tensor-type REGEX=TYPE``: the overrides of llama-quantize's per-tensor types, parsed as llama-quantize parses
them (``parse_tensor_type``: split at the first '=', the pattern lower-cased byte by byte, matched with a search),
with the types an override may name and a refusal of patterns that can backtrack for minutes on one tensor name.

The pattern is C++ ``std::regex``'s (ECMAScript grammar with POSIX bracket classes), so `translate_std_regex` turns
it into Python's dialect construct by construct — ``[[:digit:]]`` and the other classes, ``$`` as the end of the name,
ASCII ``\\d \\w \\s``, every literal in a bracket escaped (Python would warn about a nested set) — and refuses, naming
the construct, what std::regex reads otherwise or not at all (lookbehind, named groups, inline flags, possessive
quantifiers, ``[[.x.]]`` / ``[[=x=]]``, an empty ``[]``, an escape it does not define).
"""

from __future__ import annotations

import re
import warnings
from typing import Sequence

from gguf import GGMLQuantizationType

from dflashkit.codecs import QUANT_TYPES
from dflashkit.errors import UsageError

Q = GGMLQuantizationType

#: Types a ``--tensor-type`` override may name: the ones dflashkit's quantizers write (the codec registry).
OVERRIDE_TYPES: tuple[GGMLQuantizationType, ...] = tuple(QUANT_TYPES)

def parse_ggml_type(name: str | GGMLQuantizationType, what: str = "type") -> GGMLQuantizationType:
    """A ggml type name (case-insensitive, as llama-quantize's parse_ggml_type) among OVERRIDE_TYPES."""
    if isinstance(name, GGMLQuantizationType):
        t: GGMLQuantizationType | None = name
    else:
        t = Q.__members__.get(str(name).upper())  # no strip: llama-quantize refuses 'q8_0 ' too
    if t not in OVERRIDE_TYPES:
        raise UsageError(f"{what}: unsupported ggml type '{getattr(name, 'name', name)}' — choose one of "
                         f"{', '.join(x.name for x in OVERRIDE_TYPES)}")
    return t


def parse_tensor_type_override(spec: str) -> tuple[re.Pattern[str], GGMLQuantizationType]:
    """``"REGEX=TYPE"`` as llama-quantize's parse_tensor_type: split at the first '=', and the pattern is
    lower-cased (llama.cpp does so) before it is compiled; it is matched with a search (std::regex_search)."""
    pattern, sep, type_name = spec.partition("=")
    if not sep:
        raise UsageError(f"--tensor-type '{spec}': expected REGEX=TYPE, e.g. attn_v=q8_0")
    if not pattern:
        raise UsageError(f"--tensor-type '{spec}': missing the tensor name pattern before '='")
    if not type_name:
        raise UsageError(f"--tensor-type '{spec}': missing the type after '=' (e.g. {pattern}=q8_0)")
    qtype = parse_ggml_type(type_name, f"--tensor-type '{spec}'")
    lowered = "".join(c.lower() if c.isascii() else c for c in pattern)  # std::tolower, byte by byte
    try:
        translated = translate_std_regex(lowered)
    except _Hazard as exc:
        translated, problem = "", str(exc)
    except ValueError as exc:
        raise UsageError(f"--tensor-type '{spec}': bad regular expression ({exc})") from None
    else:
        problem = None
    try:
        if problem:
            raise UsageError(f"--tensor-type '{spec}': {problem} — a pattern that can backtrack for minutes on one "
                             "tensor name; write it without (e.g. blk\\.[0-9]+\\.ffn_down)")
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a warning is a construct read two ways: refused, never printed
            compiled = re.compile(translated, re.ASCII)
    except (ValueError, re.error, FutureWarning, DeprecationWarning) as exc:
        raise UsageError(f"--tensor-type '{spec}': bad regular expression ({exc})") from None
    problem = pattern_hazard(translated)
    if problem:
        raise UsageError(f"--tensor-type '{spec}': {problem} — a pattern that can backtrack for minutes on one "
                         "tensor name; write it without (e.g. blk\\.[0-9]+\\.ffn_down)")
    return compiled, qtype


#: POSIX bracket classes as std::regex reads them (C locale), as Python class bodies
_POSIX_CLASSES = {
    "alnum": "a-zA-Z0-9", "alpha": "a-zA-Z", "blank": " \\t", "cntrl": "\\x00-\\x1f\\x7f", "digit": "0-9",
    "d": "0-9", "graph": "\\x21-\\x7e", "lower": "a-z", "print": "\\x20-\\x7e",
    "punct": "\\x21-\\x2f\\x3a-\\x40\\x5b-\\x60\\x7b-\\x7e", "space": " \\t\\n\\r\\f\\v",
    "s": " \\t\\n\\r\\f\\v", "upper": "A-Z", "xdigit": "0-9A-Fa-f", "w": "a-zA-Z0-9_",
}
_CLASS_ESCAPES = "dwsDWS"
_CHAR_ESCAPES = {"n": "\\n", "t": "\\t", "r": "\\r", "f": "\\f", "v": "\\v", "0": "\\x00"}
_GROUP_OPENERS = ("(?:", "(?=", "(?!")


def _literal(c: str) -> str:
    """One character matched as itself (ASCII punctuation escaped: inside a bracket Python warns of nested sets)."""
    return c if c.isalnum() or c == "_" or not c.isascii() else "\\" + c


class _Hazard(ValueError):
    """A construct refused for the time it can take (`pattern_hazard`'s words), not for its dialect."""


def _refuse(construct: str, why: str = "which C++ std::regex (llama-quantize) reads differently or not at all") -> ValueError:
    return ValueError(f"{construct}: {why}")


def _escape(p: str, i: int, in_class: bool) -> tuple[str, int, bool]:
    """The escape at ``p[i] == '\\'``: (Python text, next index, is a single character)."""
    if i + 1 >= len(p):
        raise _refuse("a trailing backslash", "nothing to escape")
    c = p[i + 1]
    if c in _CLASS_ESCAPES:
        return "\\" + c, i + 2, False
    if c in _CHAR_ESCAPES:
        return _CHAR_ESCAPES[c], i + 2, True
    if c == "b":
        return ("\\x08" if in_class else "\\b"), i + 2, in_class
    if c == "c" and i + 2 < len(p) and p[i + 2].isascii() and p[i + 2].isalpha():
        return _literal(chr(ord(p[i + 2]) % 32)), i + 3, True
    for letter, width in (("x", 2), ("u", 4)):
        digits = p[i + 2:i + 2 + width]
        if c == letter and len(digits) == width and all(d in "0123456789abcdef" for d in digits):
            byte = int(digits, 16) & 0xFF  # std::regex<char> keeps the low byte of \uXXXX
            if byte >= 0x80:
                raise _refuse(f"the escape \\{letter}{digits}", "a byte past ASCII: std::regex matches bytes, "
                              "Python characters")
            return _literal(chr(byte)), i + 2 + width, True
    if c in "123456789":
        raise _Hazard("a back-reference")
    if c.isascii() and c.isalnum():
        raise _refuse(f"the escape \\{c}", "which C++ std::regex does not define (a back-reference or an unknown "
                      "escape)")
    return _literal(c), i + 2, True


def _bracket(p: str, i: int) -> tuple[str, int]:
    """The bracket expression starting at ``p[i] == '['``: (Python class, next index)."""
    out, i = ["["], i + 1
    if i < len(p) and p[i] == "^":
        out.append("^")
        i += 1
    if i < len(p) and p[i] == "]":
        raise _refuse("an empty bracket '[]'", "which matches nothing in std::regex's ECMAScript grammar")
    prev_single: str | None = None  # the last single character, for a range
    prev_class = False  # the last item was a class (\d, [:alpha:]): a '-' after it starts no range std::regex takes
    while i < len(p) and p[i] != "]":
        if p[i] == "-" and prev_class and i + 1 < len(p) and p[i + 1] != "]":
            raise _refuse("a range starting at a class", "which std::regex refuses (Invalid start of range)")
        prev_class = False
        if p.startswith("[:", i):
            end = p.find(":]", i + 2)
            name = p[i + 2:end] if end >= 0 else ""
            if name not in _POSIX_CLASSES:
                raise _refuse(f"the class [:{name}:]" if end >= 0 else "an unclosed '[:'", "not a POSIX class "
                              f"std::regex knows ({', '.join(sorted(_POSIX_CLASSES))})")
            out.append(_POSIX_CLASSES[name])
            i, prev_single, prev_class = end + 2, None, True
            continue
        if p.startswith("[.", i) or p.startswith("[=", i):
            raise _refuse(f"the {'collating element [.x.]' if p[i + 1] == '.' else 'equivalence class [=x=]'}",
                          "which has no Python counterpart")
        if p[i] == "-" and prev_single is not None and i + 1 < len(p) and p[i + 1] != "]":
            if p[i + 1] == "\\":
                hi, i, single = _escape(p, i + 1, True)
                if not single:
                    raise _refuse(f"a range ending in {hi}", "which std::regex refuses")
            elif p.startswith("[:", i + 1):
                raise _refuse("a range ending in a class", "which std::regex refuses")
            else:
                hi, i = _literal(p[i + 1]), i + 2
            out.append("-" + hi)
            prev_single = None
            continue
        if p[i] == "\\":
            text, i, single = _escape(p, i, True)
        else:
            text, i, single = _literal(p[i]), i + 1, True
        out.append(text)
        prev_single, prev_class = (text, False) if single else (None, True)
    if i >= len(p):
        raise _refuse("an unclosed '['", "a bracket expression needs its ']'")
    return "".join(out) + "]", i + 1


def translate_std_regex(pattern: str) -> str:
    """The ECMAScript ``std::regex`` ``pattern`` as a Python pattern (compile it with ``re.ASCII``), or ValueError
    naming the construct that has no faithful translation (module doc)."""
    if not pattern.isascii():
        raise _refuse(f"the character {next(c for c in pattern if not c.isascii())!r}", "past ASCII: std::regex "
                      "matches bytes (a quantifier after it repeats its last byte), Python characters")
    out: list[str] = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            text, i, _ = _escape(pattern, i, False)
            out.append(text)
        elif c == "[":
            text, i = _bracket(pattern, i)
            out.append(text)
        elif c == "(":
            if pattern.startswith("(?", i) and not pattern.startswith(_GROUP_OPENERS, i):
                raise _refuse(f"the group '{pattern[i:i + 4]}…'", "not ECMAScript (std::regex has (?:, (?= and (?! "
                              "only: no lookbehind, named groups or inline flags)")
            opener = next((g for g in _GROUP_OPENERS if pattern.startswith(g, i)), "(")
            out.append(opener)
            i += len(opener)
        elif c == "{":
            m = re.match(r"\{(\d+)(,(\d*))?\}", pattern[i:])
            if m is None:
                raise _refuse(f"the brace at '{pattern[i:i + 8]}'", "not a quantifier {n}, {n,} or {n,m} (std::regex "
                              "refuses it; Python would read it otherwise)")
            out.append(m.group(0))
            i += m.end()
        elif c == "$":
            out.append("\\Z")  # the end of the name (Python's $ also matches before a final newline)
            i += 1
        else:
            out.append(c)  # ^ . | ) * + ? and literals: the same in both
            i += 1
        if out[-1] in ("*", "+", "?") or out[-1][0] == "{":  # a quantifier: lazy is ECMAScript, possessive not
            if pattern.startswith("?", i):
                out.append("?")
                i += 1
            if pattern.startswith("+", i):
                raise _refuse(f"the possessive quantifier '{out[-1]}+'", "not ECMAScript")
    return "".join(out)


#: longest --tensor-type pattern (tensor names are at most 64 characters in ggml)
MAX_PATTERN_CHARS = 256


def pattern_hazard(pattern: str) -> str | None:
    """What makes a pattern backtrack exponentially in Python's engine (llama-quantize uses std::regex, which has
    the same exposure), or None: a quantifier over a group that itself holds an open-ended quantifier
    (``(a+)+``, ``(.*.*)*``), a back-reference, or an over-long pattern. Checked on the parsed pattern."""
    if len(pattern) > MAX_PATTERN_CHARS:
        return f"a pattern over {MAX_PATTERN_CHARS} characters"
    try:
        from re import _parser as parser  # type: ignore[attr-defined]  # Python ≥ 3.11
    except ImportError:  # Python 3.10
        import sre_parse as parser  # type: ignore[no-redef]
    repeats = {parser.MAX_REPEAT, parser.MIN_REPEAT, getattr(parser, "POSSESSIVE_REPEAT", parser.MAX_REPEAT)}

    def children(av: object) -> list:
        """The sub-patterns of one node's argument."""
        if isinstance(av, parser.SubPattern):
            return [av]
        if isinstance(av, (list, tuple)):
            return [x for item in av for x in children(item)]
        return []

    open_ended_total = [0]  # over the whole pattern, groups included: (.*)(.*)(.*)(.*)! is as steep as .*.*.*.*!

    def walk(sub: object, inside_repeat: bool) -> str | None:
        in_a_row = 0  # open-ended quantifiers over wildcards one after another (.*a.*a.*a.*: polynomial, steep)
        for op, av in sub:  # type: ignore[attr-defined]
            if op is parser.GROUPREF or op is getattr(parser, "GROUPREF_EXISTS", None):
                return "a back-reference"
            if op is parser.BRANCH and inside_repeat:
                return "an alternation inside a quantified group"
            if op in repeats:
                low, high, body = av
                open_ended = high is parser.MAXREPEAT or high > 1
                if inside_repeat and (open_ended or low != high):  # (a+)+, and (.?){30}: 2^30 ways to split
                    return "a quantifier nested in a quantified group"
                in_a_row += high is parser.MAXREPEAT
                open_ended_total[0] += high is parser.MAXREPEAT
                if in_a_row > 3 or open_ended_total[0] > 3:
                    return "more than three open-ended quantifiers"
                found = walk(body, inside_repeat or open_ended)
            else:
                found = next((f for child in children(av) if (f := walk(child, inside_repeat))), None)
            if found:
                return found
        return None

    return walk(parser.parse(pattern), False)



def normalize_overrides(
    overrides: Sequence[str | tuple[re.Pattern[str] | str, GGMLQuantizationType | str]],
) -> list[tuple[re.Pattern[str], GGMLQuantizationType]]:
    """Overrides given as ``"REGEX=TYPE"`` strings or (pattern, type) pairs -> compiled pairs, in order."""
    out = []
    for o in overrides:
        if isinstance(o, str):
            out.append(parse_tensor_type_override(o))
        else:
            pattern, qtype = o
            out.append((re.compile(pattern) if isinstance(pattern, str) else pattern, parse_ggml_type(qtype)))
    return out
