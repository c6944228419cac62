"""Code-editing requests from real edits: the same file in two released versions of a package.

A pair is kept when the change is real but partial: both versions are text of ``min_bytes..max_bytes``, at
least ``min_changed_lines`` lines differ, not every changed line is a version/date/copyright bump, and the
line-level similarity is at least ``min_similarity`` (and the file is not identical). The prompt holds the old
file and an instruction that describes the change (where, how many lines, which names appear or disappear)
without giving the new text; the reference output is the new file.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from .jsonl import Record
from .releases import language_of

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]{2,}")
_BUMP = re.compile(r"(version|copyright|release|__version__|\b(19|20)\d\d\b|\b\d+\.\d+(\.\d+)?\b)", re.IGNORECASE)
_HEADERS = {
    "python": re.compile(r"^\s*(async\s+def|def|class)\s+\w+"),
    "cython": re.compile(r"^\s*(cp?def|def|class|cdef\s+class)\s+\w+"),
    "javascript": re.compile(r"(\bfunction\b\s*\w*\s*\(|^\s*class\s+\w+|^\s*[\w.$]+\s*[:=]\s*(async\s+)?function|=>\s*\{\s*$)"),
    "typescript": re.compile(r"(\bfunction\b\s*\w*\s*\(|^\s*(export\s+)?class\s+\w+)"),
    "css": re.compile(r"^[^\s{][^{]*\{\s*$"),
    "markdown": re.compile(r"^#{1,6}\s+\S"),
    "c": re.compile(r"^[A-Za-z_][\w\s\*]*\([^;]*$"),
    "cpp": re.compile(r"^[A-Za-z_][\w\s\*:<>]*\([^;]*$"),
    "toml": re.compile(r"^\s*\[[^\]]+\]\s*$"),
    "ini": re.compile(r"^\s*\[[^\]]+\]\s*$"),
    "html": re.compile(r"^\s*<(h[1-6]|section|div|form|table|head|body|script|style)\b|\{%\s*block\b"),
    "jinja": re.compile(r"\{%\s*(block|macro)\b"),
    "yaml": re.compile(r"^[A-Za-z_][\w-]*:\s*$"),
}
_RST_UNDERLINE = re.compile(r"^([=\-~^\"'`+*#:.])\1{2,}\s*$")


@dataclass(frozen=True)
class EditFilter:
    """Which file pairs count as real, partial edits."""

    min_bytes: int = 1024
    max_bytes: int = 8192
    min_changed_lines: int = 2
    min_similarity: float = 0.5
    max_hunks_listed: int = 12

    def validate(self) -> None:
        if not (0 < self.min_bytes <= self.max_bytes):
            raise ValueError(f"min_bytes/max_bytes: need 0 < min_bytes <= max_bytes, got {self.min_bytes}, {self.max_bytes}")
        if self.min_changed_lines < 1:
            raise ValueError(f"min_changed_lines: must be >= 1, got {self.min_changed_lines}")
        if not (0.0 <= self.min_similarity < 1.0):
            raise ValueError(f"min_similarity: must be in [0, 1), got {self.min_similarity}")


@dataclass(frozen=True)
class EditInfo:
    """What the manifest records about one kept pair."""

    path: str
    lang: str
    similarity: float
    changed_lines: int
    hunks: int


def _header_before(lines: list[str], i: int, lang: str) -> str | None:
    """The nearest structural line (def/class/heading/selector...) at or before line index ``i``."""
    if lang in ("rst", "text"):
        for k in range(min(i, len(lines) - 1), 0, -1):
            if _RST_UNDERLINE.match(lines[k]) and lines[k - 1].strip() and not _RST_UNDERLINE.match(lines[k - 1]):
                return lines[k - 1].strip()
        return None
    rx = _HEADERS.get(lang)
    if rx is None:
        return None
    for k in range(min(i, len(lines) - 1), -1, -1):
        if rx.search(lines[k]):
            s = lines[k].strip()
            return s if len(s) <= 80 else s[:77] + "..."
    return None


_KEYWORDS = frozenset(
    "and as assert async await break class continue def del elif else except finally for from global if import in "
    "is lambda nonlocal not or pass raise return try while with yield True False None self cls const let var "
    "function this new typeof void null undefined true false static struct return int char void unsigned long "
    "double float sizeof include define endif ifdef ifndef the and for with that this from are was".split())
_DEFINES = re.compile(r"\b(?:def|class|function|cdef|struct)\s+([A-Za-z_][A-Za-z0-9_]*)")


def _names(lines: list[str], absent_from: str, limit: int = 6) -> list[str]:
    """Identifiers of ``lines`` absent from ``absent_from``: definitions first, keywords left out."""
    seen: list[str] = []
    ordered = [m for line in lines for m in _DEFINES.findall(line)] + [m for line in lines for m in _IDENT.findall(line)]
    for m in ordered:
        if m in _KEYWORDS:
            continue
        if m not in seen and not re.search(r"(?<![A-Za-z0-9_])" + re.escape(m) + r"(?![A-Za-z0-9_])", absent_from):
            seen.append(m)
            if len(seen) >= limit:
                return seen
    return seen


def _merge_opcodes(ops: list[tuple[str, int, int, int, int]], gap: int = 2) -> list[tuple[int, int, int, int]]:
    hunks: list[list[int]] = []
    for tag, i1, i2, j1, j2 in ops:
        if tag == "equal":
            continue
        if hunks and i1 - hunks[-1][1] <= gap:
            hunks[-1][1] = i2
            hunks[-1][3] = j2
        else:
            hunks.append([i1, i2, j1, j2])
    return [tuple(h) for h in hunks]  # type: ignore[misc]


def describe_change(old: str, new: str, lang: str, max_hunks: int = 12) -> tuple[list[str], int, int]:
    """Instruction bullets for turning ``old`` into ``new`` (no new text given verbatim beyond names).

    Returns (bullets, changed line count, hunk count).
    """
    a, b = old.split("\n"), new.split("\n")
    sm = difflib.SequenceMatcher(None, a, b, autojunk=False)
    hunks = _merge_opcodes(sm.get_opcodes())
    bullets: list[str] = []
    changed = 0
    for i1, i2, j1, j2 in hunks:
        removed, added = a[i1:i2], b[j1:j2]
        changed += len(removed) + len(added)
        if len(bullets) >= max_hunks:
            continue
        where = _header_before(a, max(i1 - 1, 0) if i1 > 0 else 0, lang)
        ctx = f" (in `{where}`)" if where else ""
        if removed and added:
            what = (f"Lines {i1 + 1}-{i2}{ctx}: replace these {len(removed)} line(s) with {len(added)} line(s)"
                    if len(removed) > 1 else f"Line {i1 + 1}{ctx}: replace it with {len(added)} line(s)")
        elif added:
            what = f"After line {i1}{ctx}: insert {len(added)} new line(s)"
        else:
            what = (f"Lines {i1 + 1}-{i2}{ctx}: delete them" if len(removed) > 1
                    else f"Line {i1 + 1}{ctx}: delete it")
        new_names = _names(added, old)
        gone = _names(removed, new)
        if new_names:
            what += "; it introduces " + ", ".join(f"`{n}`" for n in new_names)
        if gone:
            what += ("; and drops " if new_names else "; it drops ") + ", ".join(f"`{n}`" for n in gone)
        bullets.append(what + ".")
    if len(hunks) > max_hunks:
        bullets.append(f"... and {len(hunks) - max_hunks} more change(s) of the same kind further down.")
    return bullets, changed, len(hunks)


def _changed_lines(old: str, new: str) -> list[str]:
    a, b = old.split("\n"), new.split("\n")
    return [line for line in difflib.unified_diff(a, b, lineterm="", n=0)
            if line[:1] in "+-" and not line.startswith(("+++", "---"))]


def diff_signature(old: str, new: str) -> str:
    """The removed and added lines of a change (without positions): equal for the same edit made twice."""
    return "\n".join(_changed_lines(old, new))


def _is_bump_only(old: str, new: str) -> bool:
    return all(_BUMP.search(line) or not line[1:].strip() for line in _changed_lines(old, new))


def edit_pair_info(path: str, old: str, new: str, flt: EditFilter) -> EditInfo | None:
    """Return the pair's description if it passes the filter, else None."""
    lang = language_of(path)
    if lang is None or old == new:
        return None
    for t in (old, new):
        if not (flt.min_bytes <= len(t.encode("utf-8")) <= flt.max_bytes):
            return None
    a, b = old.split("\n"), new.split("\n")
    sim = difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()
    if sim < flt.min_similarity:
        return None
    if _is_bump_only(old, new):
        return None
    _, changed, hunks = describe_change(old, new, lang, flt.max_hunks_listed)
    if changed < flt.min_changed_lines:
        return None
    return EditInfo(path, lang, round(sim, 4), changed, hunks)


def make_prompt(name: str, old_version: str, new_version: str, path: str, old: str, new: str,
                lang: str, max_hunks: int = 12) -> str:
    """The edit request: the old file, then what to change, then the answer format."""
    bullets, _, _ = describe_change(old, new, lang, max_hunks)
    body = old if old.endswith("\n") else old + "\n"
    return (
        f"Here is the file `{path}` from {name} {old_version}:\n\n"
        f"```{lang}\n{body}```\n\n"
        f"Update it for {name} {new_version}. Make these changes:\n"
        + "".join(f"- {b}\n" for b in bullets)
        + "\nReply with the complete updated file and nothing else."
    )


def make_record(name: str, old_version: str, new_version: str, path: str, old: str, new: str,
                info: EditInfo, max_hunks: int = 12) -> Record:
    """A ``code-edit`` workload record for one kept pair."""
    rid = f"code-edit/{name}-{old_version}..{new_version}/{path}"
    prompt = make_prompt(name, old_version, new_version, path, old, new, info.lang, max_hunks)
    return Record(rid, "code-edit", prompt, new)
