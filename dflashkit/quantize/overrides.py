"""``--tensor-type REGEX=TYPE``: the overrides of llama-quantize's per-tensor types, parsed as llama-quantize parses
them (``parse_tensor_type``: split at the first '=', the pattern lower-cased, matched with a search), with the types
an override may name and a refusal of patterns that can backtrack for minutes on one tensor name.
"""

from __future__ import annotations

import re
from typing import Sequence

from gguf import GGMLQuantizationType

from dflashkit.errors import UsageError

Q = GGMLQuantizationType

#: Types a ``--tensor-type`` override may name: the ones dflashkit's quantizers write.
OVERRIDE_TYPES: tuple[GGMLQuantizationType, ...] = (
    Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q6_K, Q.Q5_K, Q.Q4_K, Q.Q3_K, Q.Q2_K, Q.Q5_1, Q.Q5_0, Q.Q4_1, Q.Q4_0,
    Q.IQ4_NL, Q.IQ4_XS,
)

def parse_ggml_type(name: str | GGMLQuantizationType, what: str = "type") -> GGMLQuantizationType:
    """A ggml type name (case-insensitive, as llama-quantize's parse_ggml_type) among OVERRIDE_TYPES."""
    if isinstance(name, GGMLQuantizationType):
        t: GGMLQuantizationType | None = name
    else:
        t = Q.__members__.get(str(name).strip().upper())
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
    try:
        compiled = re.compile(pattern.lower())
    except re.error as exc:
        raise UsageError(f"--tensor-type '{spec}': bad regular expression ({exc})") from None
    problem = pattern_hazard(pattern.lower())
    if problem:
        raise UsageError(f"--tensor-type '{spec}': {problem} — a pattern that can backtrack for minutes on one "
                         "tensor name; write it without (e.g. blk\\.[0-9]+\\.ffn_down)")
    return compiled, qtype


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
