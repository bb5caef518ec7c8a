"""``--tensor-type REGEX=TYPE``: the overrides of llama-quantize's per-tensor types, parsed as llama-quantize parses
them (``parse_tensor_type``: split at the first '=', the pattern lower-cased byte by byte, matched with a search),
with the types an override may name and a refusal of patterns that can backtrack for minutes on one tensor name.

The pattern is C++ ``std::regex``'s (ECMAScript grammar with POSIX bracket classes), so `translate_std_regex` turns
it into Python's dialect construct by construct — ``[[:digit:]]`` and the other classes, ``$`` as the end of the name,
ASCII ``\\d \\w \\s``, every literal in a bracket escaped (Python would warn about a nested set) — and refuses, naming
the construct, what std::regex reads otherwise or not at all (lookbehind, named groups, inline flags,
``[[.x.]]`` / ``[[=x=]]``, an empty ``[]``, an escape it does not define, a quantifier after an assertion).

Repetition is std::regex's too (`_Automaton`): libstdc++ copies a sub-automaton once per count of ``{m,n}`` and
refuses a pattern past 100000 states, and reads a count as a C ``int`` (``{0,4294967296}`` is ``{0,0}``); the
states are counted as libstdc++ 12 inserts them, so a pattern is refused exactly where llama-quantize refuses it.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass, field
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


#: libstdc++'s _GLIBCXX_REGEX_STATE_LIMIT: std::regex throws error_space past this many automaton states
REGEX_STATE_LIMIT = 100_000


@dataclass
class _Piece:
    """One term of an alternative, as libstdc++'s compiler builds it (bits/regex_compiler.tcc)."""

    states: int  # the states its compilation inserted
    clone: int  # the states one copy of it inserts (`_M_clone` copies those reachable from its start)
    at: int  # its first item in the translator's output
    atom: bool = True  # std::regex quantifies atoms and groups, not assertions (^ $ \b (?= (?!)
    quantified: bool = False


@dataclass
class _Level:
    """An open group (or the whole pattern): its finished alternatives' (states, clone) and the current one's terms."""

    opener: str
    at: int
    alternatives: list[tuple[int, int]] = field(default_factory=list)
    terms: list[_Piece] = field(default_factory=list)

    def close_alternative(self) -> None:
        # every alternative ends in a dummy state (_M_alternative's empty tail)
        self.alternatives.append((sum(t.states for t in self.terms) + 1, sum(t.clone for t in self.terms) + 1))
        self.terms = []

    def disjunction(self) -> tuple[int, int]:
        self.close_alternative()
        states, clone = self.alternatives[0]
        for more_states, more_clone in self.alternatives[1:]:  # each '|': an alternative state and a dummy end
            states, clone = states + more_states + 2, clone + more_clone + 2
        return states, clone


def _int32(digits: str) -> int:
    """A repetition count as libstdc++ 12 reads it: accumulated in a long, returned as an int (modulo 2^32)."""
    return (int(digits) + 2**31) % 2**32 - 2**31


class _Automaton:
    """The states libstdc++ 12's std::regex compiler inserts for the pattern being translated (checked state for
    state against the compiled NFA of g++ 12 and against llama-quantize): a refusal past `REGEX_STATE_LIMIT`, the
    counts of ``{m,n}`` as it reads them, and the quantifier rules it has and Python's ``re`` has not."""

    def __init__(self) -> None:
        self.levels = [_Level("", 0)]

    def term(self, at: int, atom: bool = True) -> None:
        self.levels[-1].terms.append(_Piece(1, 1, at, atom))

    def open(self, opener: str, at: int) -> None:
        self.levels.append(_Level(opener, at))

    def alternation(self) -> None:
        self.levels[-1].close_alternative()

    def close(self) -> None:
        if len(self.levels) < 2:
            return  # an unmatched ')': Python's re names it
        level = self.levels.pop()
        states, clone = level.disjunction()
        extra = {"(": 2, "(?:": 1}.get(level.opener, 2)  # begin / end of a capture; a dummy; lookahead and accept
        self.levels[-1].terms.append(_Piece(states + extra, clone + extra, level.at, level.opener in ("(", "(?:")))

    def quantify(self, text: str, out: list[str]) -> str:
        """The quantifier ``text`` (``*``, ``+``, ``?`` or a brace) on the last term: Python's spelling of what
        std::regex repeats (a count as it reads it; a quantified term grouped, as std::regex quantifies it again)."""
        terms = self.levels[-1].terms
        if not terms:
            return text  # nothing to repeat: Python's re names it
        piece = terms[-1]
        if not piece.atom:
            raise _refuse(f"the quantifier '{text}' after an assertion", "which std::regex refuses (^, $, \\b and "
                          "lookaheads match a position, nothing to repeat)")
        if piece.quantified:  # a** and a{2}{3}: std::regex repeats the repetition; Python's re needs a group
            out[piece.at] = "(?:" + out[piece.at]
            out.append(")")
        added = {"*": 1, "+": 1, "?": 2}.get(text)
        if added is not None:
            piece.states, piece.clone = piece.states + added, piece.clone + added
        else:
            low_digits, comma, high_digits = text[1:-1].partition(",")
            low = _int32(low_digits)
            mandatory = max(low, 0)
            if comma and not high_digits:  # {m,}: m copies, then one copy under a repeat
                tail, text = piece.clone + 1, f"{{{mandatory},}}"
            else:
                optional = _int32(high_digits) - low if comma else 0
                if optional < 0:
                    raise _refuse(f"the repetition '{text}'", f"std::regex reads its bounds as C ints ({low} and "
                                  f"{_int32(high_digits)}) and refuses a maximum below the minimum")
                tail, text = 1 + optional * (piece.clone + 1), f"{{{mandatory},{mandatory + optional}}}"
            piece.clone = 1 + mandatory * piece.clone + tail  # a dummy start, then the copies: the original is left
            piece.states += piece.clone
        piece.quantified = True
        return text

    def check(self) -> None:
        """Refuse a pattern std::regex refuses for its size (`REGEX_STATE_LIMIT`)."""
        while len(self.levels) > 1:
            self.close()  # an unclosed '(': Python's re names it; count what there is
        states = self.levels[0].disjunction()[0] + 3  # the pattern's begin, end and accept states
        if states > REGEX_STATE_LIMIT:
            raise _refuse(f"the repetition makes {states} automaton states", f"C++ std::regex (llama-quantize) "
                          f"refuses a pattern of more than {REGEX_STATE_LIMIT} (Number of NFA states exceeds limit); "
                          "use + or * or a smaller count")


def translate_std_regex(pattern: str) -> str:
    """The ECMAScript ``std::regex`` ``pattern`` as a Python pattern (compile it with ``re.ASCII``), or ValueError
    naming the construct that has no faithful translation (module doc)."""
    if not pattern.isascii():
        raise _refuse(f"the character {next(c for c in pattern if not c.isascii())!r}", "past ASCII: std::regex "
                      "matches bytes (a quantifier after it repeats its last byte), Python characters")
    out: list[str] = []
    nfa = _Automaton()
    i = 0
    while i < len(pattern):
        c = pattern[i]
        at = len(out)
        quantifier = None
        if c == "\\":
            text, i, _ = _escape(pattern, i, False)
            out.append(text)
            nfa.term(at, atom=text != "\\b")
        elif c == "[":
            text, i = _bracket(pattern, i)
            out.append(text)
            nfa.term(at)
        elif c == "(":
            if pattern.startswith("(?", i) and not pattern.startswith(_GROUP_OPENERS, i):
                raise _refuse(f"the group '{pattern[i:i + 4]}…'", "not ECMAScript (std::regex has (?:, (?= and (?! "
                              "only: no lookbehind, named groups or inline flags)")
            opener = next((g for g in _GROUP_OPENERS if pattern.startswith(g, i)), "(")
            out.append(opener)
            nfa.open(opener, at)
            i += len(opener)
        elif c == "{":
            m = re.match(r"\{(\d+)(,(\d*))?\}", pattern[i:])
            if m is None:
                raise _refuse(f"the brace at '{pattern[i:i + 8]}'", "not a quantifier {n}, {n,} or {n,m} (std::regex "
                              "refuses it; Python would read it otherwise)")
            quantifier = m.group(0)
            i += m.end()
        elif c in "*+?":
            quantifier = c
            i += 1
        else:
            out.append("\\Z" if c == "$" else c)  # $: the end of the name (Python's also matches before a final \n)
            if c == "|":
                nfa.alternation()
            elif c == ")":
                nfa.close()
            else:
                nfa.term(at, atom=c not in "^$")  # ^ . and literals: the same in both
            i += 1
        if quantifier is not None:
            out.append(nfa.quantify(quantifier, out))
            if pattern.startswith("?", i):  # lazy; a '+' after it is no possessive: std::regex repeats it again
                out.append("?")
                i += 1
    nfa.check()
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
