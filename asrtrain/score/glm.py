"""NIST GLM (global mapping) rules, applied to transcripts exactly as SCTK's csrfilt.sh/rfilter1 do.

A GLM file holds string-rewriting rules ``A => B`` or ``A => B / C __ D`` (format NIST1, see SCTK's
``GLMRules.txt``).  rfilter1 moves a cursor over the line *character by character*; at each position
the first rule (in file order) whose input ``A`` and contexts ``C`` / ``D`` match the *input* text
is applied, otherwise the character is copied.  Rules are not word-aware: ``[ ] __ [ ]`` contexts
are what restrict most Hub5 rules to whole words.  csrfilt.sh wraps rfilter1: it keeps only the GLM
sections whose ``;; INPUT_DEPENDENT_APPLICATION = "<regexp>"`` matches the input type (``stm`` for
references, ``ctm`` for hypotheses, where contractions become alternations ``{HE IS / HE HAS}``),
upper-cases the text, spaces out parentheses, applies the rules, splits hyphenated words (``-dh``)
and spreads optional-deletion parentheses over every word inside them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from asrtrain import AsrtrainError

_ASCII_UPPER = str.maketrans("abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ")
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
# C isspace() in the "C" locale.
_C_SPACE = " \t\n\v\f\r"


def ascii_upper(text: str) -> str:
    """Upper-case a-z only, like perl ``tr/a-z/A-Z/`` and C toupper() in the C locale."""
    return text.translate(_ASCII_UPPER)


def ascii_lower(text: str) -> str:
    """Lower-case A-Z only, like sclite's case-insensitive mode."""
    return text.translate(_ASCII_LOWER)


@dataclass(frozen=True)
class GlmRule:
    """One rewriting rule ``source => target / left __ right`` (contexts may be empty)."""

    source: str
    target: str
    left: str
    right: str
    line: int


def _strip_brackets(text: str, start: int, end: int) -> tuple[int, int]:
    # rfilter1 removes one pair of [ ] or " " bounding a field, to allow leading/trailing spaces.
    if start <= end and (
        (text[start] == "[" and text[end] == "]") or (text[start] == '"' and text[end] == '"')
    ):
        return start + 1, end - 1
    return start, end


def _field(text: str, start: int, end: int) -> str:
    return text[start : end + 1] if end >= start else ""


def _rtrim(text: str, start: int, end: int) -> int:
    """Move ``end`` back over white space, not before ``start`` (rfilter1's order of tests)."""
    while text[end] in _C_SPACE and end > start:
        end -= 1
    return end


def _after_marker(text: str, start: int, end: int) -> str:
    """The field after the marker at ``start`` (``=>``, ``/`` or ``__``) up to ``end``: skip the
    marker's characters, then white space, then one pair of bounding brackets."""
    while text[start] not in _C_SPACE and start < end:
        start += 1
    if start >= end:
        return ""
    while text[start] in _C_SPACE:
        start += 1
    return _field(text, *_strip_brackets(text, start, end))


def _parse_rule(line: str, lineno: int, path: Path) -> GlmRule:
    """Parse a NIST1 data line the way rfilter1's r_process_data_line does (quirks included)."""
    ieq = line.find("=>")
    if ieq < 0:
        raise AsrtrainError(f"{path}:{lineno}: GLM rule has no '=>': {line.strip()!r}")
    # The context marker is the last '/', unless a '[' follows it with no ']' before that '['
    # (C compares the two strchr() pointers, and a missing one is NULL, smaller than any other).
    icontext = line.rfind("/")
    islot = -1
    if icontext >= 0:
        irmark = line.find("]", icontext)
        ilmark = line.find("[", icontext)
        if irmark < ilmark:
            icontext = -1
        else:
            islot = line.find("_", icontext)
    last = len(line.rstrip(_C_SPACE)) - 1

    # left-hand side
    source = ""
    start = len(line) - len(line.lstrip(_C_SPACE))
    if start < ieq:
        source = _field(line, *_strip_brackets(line, start, _rtrim(line, start, ieq - 1)))
    # right-hand side, then the contexts: each field starts after its marker (=>, /, __)
    end = last if icontext < 0 else _rtrim(line, ieq, icontext - 1)
    target = _after_marker(line, ieq, end)
    left = right = ""
    if icontext >= 0 and islot >= 0:
        left = _after_marker(line, icontext, _rtrim(line, icontext, islot - 1))
        right = _after_marker(line, islot, last)
    return GlmRule(source, target, left, right, lineno)


def _atobool(value: str) -> bool:
    return value.strip().upper() in ("T", "TRUE", "YES", "Y")


class Glm:
    """A parsed GLM rule set, restricted to the sections that apply to one input type.

    ``input_type`` is ``"stm"`` or ``"ctm"`` and ``purpose`` ``"ref"`` or ``"hyp"``, as csrfilt.sh's
    ``-i`` and ``-t`` options; ``Glm.empty()`` is a rule set that maps nothing.
    """

    def __init__(self, rules: list[GlmRule], copy_no_hit: bool = True, case_sensitive: bool = True,
                 name: str = "") -> None:
        self.rules = rules
        self.copy_no_hit = copy_no_hit
        self.case_sensitive = case_sensitive
        self.name = name
        # rfilter1's left-corner index (rules by first source character, in file order), refined
        # here by the first two characters; the candidates keep file order so the first match
        # still wins exactly as in rfilter1.
        self._prepared: list[tuple[int, str, str, str, str]] = []
        for i, rule in enumerate(rules):
            if not rule.source:
                continue  # rfilter1 indexes these under '\0', which never matches
            up = (lambda t: t) if case_sensitive else ascii_upper
            self._prepared.append((i, up(rule.source), up(rule.left), up(rule.right),
                                   rule.target))
        self._candidates: dict[str, list[tuple[int, str, str, str, str]]] = {}
        self._memo: dict[str, str] = {}

    def _rules_at(self, key2: str) -> list[tuple[int, str, str, str, str]]:
        found = self._candidates.get(key2)
        if found is None:
            found = [r for r in self._prepared
                     if r[1][0] == key2[0] and (len(r[1]) == 1 or r[1][:2] == key2[:2])]
            self._candidates[key2] = found
        return found

    @classmethod
    def empty(cls) -> Glm:
        return cls([], name="(none)")

    @classmethod
    def load(cls, path: Path, input_type: str = "stm", purpose: str = "ref") -> Glm:
        from asrtrain.score.lines import read_lines

        path = Path(path)
        numbered = read_lines(path, "GLM")
        if not numbered:
            raise AsrtrainError(f"{path}: GLM file is empty")
        # csrfilt.sh: keep only the regions whose INPUT_DEPENDENT_APPLICATION regexp matches the
        # input type or the data purpose.
        kept: list[tuple[int, str]] = []
        applies = True
        for lineno, line in numbered:
            m = re.match(r';;\s+INPUT_DEPENDENT_APPLICATION\s*=\s*"([^"]*)"', line)
            if m:
                expr = m.group(1).lower()
                applies = bool(re.search(expr, input_type.lower())) or bool(
                    purpose and re.search(expr, purpose.lower())
                )
            if applies:
                kept.append((lineno, line))
        if not kept:
            raise AsrtrainError(f"{path}: GLM file is empty")
        first = kept[0][1]
        comment_flag = ""
        for ch in first:
            if not (33 <= ord(ch) <= 126):
                break
            comment_flag += ch
        rules: list[GlmRule] = []
        copy_no_hit = True
        case_sensitive = True
        fmt = "NIST1"
        name = path.name
        for lineno, line in kept[1:]:
            line = line.rstrip("\r\n").rstrip(_C_SPACE)
            if not line or (comment_flag and line.startswith(comment_flag)):
                continue
            if line[0] == "*":
                m = re.search(r"[\"']([^\"']*)[\"']", line)
                if not m:
                    raise AsrtrainError(f"{path}:{lineno}: GLM header line has no quoted value")
                value, upper = m.group(1), ascii_upper(line)
                if "NAME" in upper:
                    name = value
                if "FORMAT" in upper:
                    fmt = value
                if "COPY_NO_HIT" in upper:
                    copy_no_hit = _atobool(value)
                if "CASE_SENSITIVE" in upper:
                    case_sensitive = _atobool(value)
                continue
            if comment_flag and comment_flag in line:
                cut = line.index(comment_flag)
                line = line[:cut] + " " * (len(line) - cut)
            if not line.strip(_C_SPACE):
                raise AsrtrainError(f"{path}:{lineno}: GLM rule line is blank after its comment")
            rules.append(_parse_rule(line, lineno, path))
        if fmt != "NIST1":
            raise AsrtrainError(f"{path}: GLM format {fmt!r} is not supported (only NIST1)")
        return cls(rules, copy_no_hit, case_sensitive, name)

    def rewrite(self, text: str) -> str:
        """Apply the rules to one line of text (rfilter1's apply_rules2)."""
        out: list[str] = []
        pos = 0
        n = len(text)
        cmp_text = text if self.case_sensitive else ascii_upper(text)
        while pos < n:
            hit = None
            for _, src, left, right, target in self._rules_at(cmp_text[pos:pos + 2]):
                if not cmp_text.startswith(src, pos):
                    continue
                if left and (pos < len(left) or cmp_text[pos - len(left):pos] != left):
                    continue
                if right and not cmp_text.startswith(right, pos + len(src)):
                    continue
                hit = (src, target)
                break
            if hit is not None:
                out.append(hit[1])
                pos += len(hit[0])
            else:
                if self.copy_no_hit:
                    out.append(text[pos])
                pos += 1
        return "".join(out)


_OPT_DEL_BAD = re.compile(r"\s\([^()]+\)")


def check_optional_parens(text: str) -> bool:
    """csrfilt.sh's validateOptDelTags: parentheses must form ``(word ...)`` groups, not nested."""
    t = text.replace("(", "( ").replace(")", " )")
    t = " " + t + " "
    t = t.replace("(", "   (")
    t = t.replace(")", ")  ", 1)
    t = _OPT_DEL_BAD.sub("", t)
    return "(" not in t and ")" not in t


_DELETE_HYPHEN = re.compile(r"([^( ])-(?=[^) ])")
_PROPAGATE = re.compile(r"(\(\s+[^()\s]+\s+)([^()\s]+)")


def csr_filter_text(field: str, glm: Glm, upcase: bool = True, delete_hyphens: bool = True) -> str:
    """Filter the transcript field of one line like csrfilt.sh (``-dh``, no ``-s``) does.

    ``field`` is what csrfilt.sh cuts out of the line: for an STM line the text after the labels
    with its surrounding spaces (``" hello there "``), for a CTM line the bare word.  Returns the
    filtered words separated by single spaces; alternations stay written ``{A B / C}`` as rfilter1
    outputs them.
    """
    key = f"{int(upcase)}{int(delete_hyphens)}{field}"
    cached = glm._memo.get(key)
    if cached is not None:
        return cached
    result = _csr_filter_text(field, glm, upcase, delete_hyphens)
    if len(glm._memo) < 200_000:
        glm._memo[key] = result
    return result


def _csr_filter_text(field: str, glm: Glm, upcase: bool, delete_hyphens: bool) -> str:
    t = ascii_upper(field) if upcase else field
    t = " " + t.replace("(", "( ").replace(")", " )") + " "
    t = glm.rewrite(t)
    if delete_hyphens:
        t = _DELETE_HYPHEN.sub(r"\1 ", t)
    while True:
        t2 = _PROPAGATE.sub(r"\1) ( \2", t, count=1)
        if t2 == t:
            break
        t = t2
    t = t[1:] if t.startswith(" ") else t
    t = t[:-1] if t.endswith(" ") else t
    t = re.sub(r"\(\s+", "(", t)
    t = re.sub(r"\s+\)", ")", t)
    return re.sub(r"[ \t]+", " ", t).strip(" \t")
