"""Chat requests whose good answers do not repeat the prompt.

Sources are a release's own documentation: a section of an ``.rst``/``.md`` document (the question names the
topic, the reference answer is the section's text) or a long docstring of a Python function or class (the
question names the object and its signature, the answer is the docstring). The answer text never appears in
the prompt, so an n-gram drafter finds little to copy beyond names.
"""

from __future__ import annotations

import ast
import hashlib
import re
import textwrap
from dataclasses import dataclass
from pathlib import PurePosixPath

from .jsonl import Record

_RST_UNDERLINE = re.compile(r"^([=\-~^\"'`+*#])\1{2,}\s*$")
_MD_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")
_ROLE = re.compile(r":[\w:-]+:`([^`<]*?)(\s*<[^>]*>)?`")
_SKIP_TITLE = re.compile(r"^(v(ersion)?\s*\d|release|changes|changelog|history|unreleased|\d+\.\d+)", re.IGNORECASE)
_SKIP_FILE = re.compile(r"(change|history|news|license|authors|contributors|release)", re.IGNORECASE)

QUESTION_TEMPLATES = (
    "I'm using {pkg}. Can you explain {topic}?",
    "What should I know about {topic} in {pkg}? Please answer in a few paragraphs.",
    "How does {topic} work in {pkg}? Give me an overview with the important details.",
    "Write a short guide to {topic} for someone who is new to {pkg}.",
    "In {pkg}, what is {topic} about, and when would I use it?",
    "Could you describe {topic} ({pkg}) in your own words, with any caveats?",
)
DOCSTRING_TEMPLATES = (
    "What does `{obj}` in {pkg} do? Explain its parameters and behaviour.\n\nSignature: `{sig}`",
    "I found `{obj}` in {pkg} (module `{module}`). How do I use it, and what does it return?\n\n`{sig}`",
    "Document `{sig}` from {pkg} for me: what it is for, its arguments and any caveats.",
)


@dataclass(frozen=True)
class ChatFilter:
    """Answer length bounds (characters) and how code-heavy a section may be."""

    min_chars: int = 500
    max_chars: int = 4000
    max_markup_fraction: float = 0.5

    def validate(self) -> None:
        if not (0 < self.min_chars <= self.max_chars):
            raise ValueError(f"min_chars/max_chars: need 0 < min_chars <= max_chars, got {self.min_chars}, {self.max_chars}")


def _pick(templates: tuple[str, ...], key: str) -> str:
    return templates[int(hashlib.sha256(key.encode()).hexdigest(), 16) % len(templates)]


def _clean_title(t: str) -> str:
    t = _ROLE.sub(lambda m: m.group(1), t)
    return t.replace("``", "").replace("`", "").replace("**", "").strip().rstrip(":")


def split_sections(text: str, lang: str) -> list[tuple[str, str]]:
    """(title, body) pairs of an rst or markdown document, in order."""
    lines = text.split("\n")
    heads: list[tuple[int, int, str]] = []  # (title line, first body line, title)
    i = 0
    while i < len(lines):
        if lang == "markdown":
            m = _MD_HEADING.match(lines[i])
            if m:
                heads.append((i, i + 1, m.group(2)))
        elif (i + 1 < len(lines) and lines[i].strip() and not _RST_UNDERLINE.match(lines[i])
              and _RST_UNDERLINE.match(lines[i + 1]) and len(lines[i + 1].strip()) >= len(lines[i].strip())):
            heads.append((i, i + 2, lines[i].strip()))
            i += 1
        i += 1
    out = []
    for k, (ti, bi, title) in enumerate(heads):
        end = heads[k + 1][0] if k + 1 < len(heads) else len(lines)
        if lang != "markdown" and end < len(lines) and k + 1 < len(heads):
            # an overline belongs to the next title
            if end > 0 and _RST_UNDERLINE.match(lines[end - 1]):
                end -= 1
        body = "\n".join(lines[bi:end]).strip("\n")
        out.append((title, body))
    return out


def _markup_fraction(body: str) -> float:
    lines = [ln for ln in body.split("\n") if ln.strip()]
    if not lines:
        return 1.0
    markup = sum(1 for ln in lines if ln.startswith(("    ", "\t", ".. ", "|", "+-", "===", ">>>", "```")))
    return markup / len(lines)


def doc_section_records(pkg: str, version: str, path: str, text: str, flt: ChatFilter) -> list[Record]:
    """Chat records from the sections of one documentation file."""
    lang = "markdown" if path.endswith(".md") else "rst"
    if _SKIP_FILE.search(PurePosixPath(path).name):
        return []
    out = []
    for n, (title, body) in enumerate(split_sections(text, lang)):
        topic = _clean_title(title)
        if not topic or _SKIP_TITLE.match(topic) or len(topic) > 80:
            continue
        if not (flt.min_chars <= len(body) <= flt.max_chars):
            continue
        if _markup_fraction(body) > flt.max_markup_fraction:
            continue
        rid = f"chat/{pkg}-{version}/{path}#{n}"
        q = _pick(QUESTION_TEMPLATES, rid).format(pkg=pkg, topic=f"\"{topic}\"")
        out.append(Record(rid, "chat", q, body))
    return out


def _signature(node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef, src: str) -> str:
    if isinstance(node, ast.ClassDef):
        return f"class {node.name}"
    seg = " ".join(ast.unparse(node.args).split())
    if len(seg) > 160:
        seg = seg[:157] + "..."
    return f"{node.name}({seg})"


def docstring_records(pkg: str, version: str, path: str, text: str, flt: ChatFilter) -> list[Record]:
    """Chat records from the long docstrings of public functions and classes of one Python file."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return []
    module = path[:-3].replace("/", ".")
    for prefix in ("src.",):
        if module.startswith(prefix):
            module = module[len(prefix):]
    out = []

    def visit(body: list[ast.stmt], qual: str) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                if node.name.startswith("_"):
                    continue
                name = f"{qual}{node.name}"
                doc = ast.get_docstring(node, clean=True)
                if doc and flt.min_chars <= len(doc) <= flt.max_chars and _markup_fraction(doc) <= flt.max_markup_fraction:
                    rid = f"chat/{pkg}-{version}/{path}::{name}"
                    q = _pick(DOCSTRING_TEMPLATES, rid).format(
                        pkg=pkg, obj=f"{module}.{name}", module=module, sig=_signature(node, text))
                    out.append(Record(rid, "chat", q, textwrap.dedent(doc).strip()))
                if isinstance(node, ast.ClassDef):
                    visit(node.body, f"{name}.")

    visit(tree.body, "")
    return out
