"""Local text corpora for tokenizer training and calibration: Python's own standard library, or files on disk.

Everything here is deterministic: files are visited in sorted order of their relative paths, decoding follows
the file's PEP 263 encoding cookie, and a file that cannot be decoded or parsed is skipped (the same files on
every run). ``corpus_digest`` fingerprints the exact text so a fit can record what it was made from.

The stdlib corpus (``stdlib_documents``) has two kinds of document:

* ``code``: every ``.py`` file of the standard library, except test suites (``test``, ``tests``,
  ``idle_test``), installed third-party packages (``site-packages``), the generated codec tables under
  ``encodings/`` (machine-written charmaps, not text) and ``pydoc_data/topics.py`` (prose, see below);
* ``prose``: the docstrings of each module joined in source order, every page of the reference documentation
  that ships as ``pydoc_data/topics.py`` (one document per topic), and any ``.txt``/``.rst`` file outside the
  excluded folders.

Served requests (``request_documents``, any ``.jsonl`` file named in a corpus): one JSON object a line with
string fields ``prompt`` and ``output`` (optional ``id`` and ``kind``), the format of a server's request log and
of ``hybrid-spark workloads``. The prompt is the history the drafter searches, the output the text it drafts.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import os
import sysconfig
import tokenize
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from ..jsonl_io import json_lines

__all__ = ["Document", "stdlib_root", "stdlib_documents", "path_documents", "request_documents", "corpus_digest"]

_EXCLUDED_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__", "encodings"}
_PROSE_SUFFIXES = {".txt", ".rst", ".md"}
_TOPICS = "pydoc_data/topics.py"
_MIN_PROSE_CHARS = 200


@dataclass(frozen=True)
class Document:
    """One document of a corpus: ``name`` (a relative path, ``path:part`` for sub-documents), its ``kind``
    (``"code"`` or ``"prose"``) and its ``text``."""

    name: str
    kind: str
    text: str
    prompt: str | None = None  # a served request: the prompt, whose output is ``text``


def stdlib_root() -> Path:
    """The directory of the running interpreter's pure-Python standard library."""
    return Path(sysconfig.get_paths()["stdlib"])


def _walk(root: Path, suffixes: set[str]) -> list[Path]:
    out: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _EXCLUDED_DIRS and not d.startswith("config-"))
        for f in filenames:
            if Path(f).suffix in suffixes:
                out.append(Path(dirpath) / f)
    return sorted(out, key=lambda p: p.relative_to(root).as_posix())


def _read_python(path: Path) -> str | None:
    try:
        with tokenize.open(path) as fh:
            return fh.read()
    except (SyntaxError, UnicodeDecodeError, OSError, LookupError):
        return None


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None


def _docstrings(source: str) -> str:
    """The module's, classes' and functions' docstrings, in source order, joined by blank lines."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return ""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=True)
            if doc:
                found.append((getattr(node, "lineno", 0), doc))
    found.sort(key=lambda t: t[0])
    return "\n\n".join(d for _, d in found)


def _topics(source: str) -> list[tuple[str, str]]:
    """The ``topics`` dict of ``pydoc_data/topics.py`` (the reference manual's pages), sorted by key."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "topics" for t in node.targets):
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                return []
            if isinstance(value, dict):
                return sorted((str(k), str(v)) for k, v in value.items())
    return []


def stdlib_documents(root: str | os.PathLike | None = None, *, code: bool = True, prose: bool = True) -> list[Document]:
    """The standard-library corpus (see the module docstring), code documents first, then prose.

    ``root`` defaults to the running interpreter's stdlib; a different Python version gives a different corpus.
    The result is cached per process (the files are read and parsed once).
    """
    base = Path(root) if root is not None else stdlib_root()
    return list(_stdlib_documents(str(base.resolve()), code, prose))


@functools.lru_cache(maxsize=4)
def _stdlib_documents(root: str, code: bool, prose: bool) -> tuple[Document, ...]:
    base = Path(root)
    if not base.is_dir():
        raise FileNotFoundError(f"stdlib root {str(base)!r} is not a directory")
    code_docs: list[Document] = []
    prose_docs: list[Document] = []
    for path in _walk(base, {".py"}):
        rel = path.relative_to(base).as_posix()
        src = _read_python(path)
        if src is None:
            continue
        if rel == _TOPICS:
            if prose:
                prose_docs.extend(Document(f"{rel}:{k}", "prose", v) for k, v in _topics(src)
                                  if len(v) >= _MIN_PROSE_CHARS)
            continue
        if code and src.strip():
            code_docs.append(Document(rel, "code", src))
        if prose:
            doc = _docstrings(src)
            if len(doc) >= _MIN_PROSE_CHARS:
                prose_docs.append(Document(f"{rel}:docstrings", "prose", doc))
    if prose:
        for path in _walk(base, _PROSE_SUFFIXES):
            text = _read_text(path)
            if text and len(text) >= _MIN_PROSE_CHARS:
                prose_docs.append(Document(path.relative_to(base).as_posix(), "prose", text))
    return tuple(code_docs + prose_docs)


def path_documents(paths: Sequence[str | os.PathLike]) -> list[Document]:
    """Documents from files and directories (recursively: ``.py`` as code, ``.txt``/``.rst``/``.md`` as prose).

    A named file is always read (as UTF-8, code if it ends in ``.py``); unreadable files inside directories
    are skipped. Raises ``FileNotFoundError`` naming a path that does not exist.
    """
    docs: list[Document] = []
    for p in paths:
        path = Path(p)
        if path.is_dir():
            for f in _walk(path, {".py"} | _PROSE_SUFFIXES):
                text = _read_python(f) if f.suffix == ".py" else _read_text(f)
                if text and text.strip():
                    kind = "code" if f.suffix == ".py" else "prose"
                    docs.append(Document(f"{path.name}/{f.relative_to(path).as_posix()}", kind, text))
        elif path.is_file() and path.suffix == ".jsonl":
            docs.extend(request_documents(path))
        elif path.is_file():
            text = _read_python(path) if path.suffix == ".py" else None
            if text is None:
                text = path.read_text(encoding="utf-8", errors="replace")
            docs.append(Document(path.name, "code" if path.suffix == ".py" else "prose", text))
        else:
            raise FileNotFoundError(f"corpus path {str(path)!r} does not exist")
    return docs


def request_documents(path: str | os.PathLike) -> list[Document]:
    """The served requests of a JSONL file (see the module doc); a bad line raises ``ValueError`` naming it."""
    path = Path(path)
    docs: list[Document] = []
    for where, rec in json_lines(path):
        if not isinstance(rec, dict) or not all(isinstance(rec.get(k), str) for k in ("prompt", "output")):
            raise ValueError(f"{where}: a request needs string fields 'prompt' and 'output'")
        name = f"{path.name}:{rec.get('id', where.rsplit(':', 1)[1])}"
        docs.append(Document(name, str(rec.get("kind", "request")), rec["output"], rec["prompt"]))
    if not docs:
        raise ValueError(f"{path}: no requests")
    return docs


def corpus_digest(docs: Iterable[Document]) -> str:
    """SHA-256 over the documents' names, kinds, texts (and prompts, for requests), in order (hex, 16 digits)."""
    h = hashlib.sha256()
    for d in docs:
        for part in (d.name, d.kind, d.text) + (() if d.prompt is None else (d.prompt,)):
            b = part.encode("utf-8", errors="surrogatepass")
            h.update(len(b).to_bytes(8, "little"))
            h.update(b)
    return h.hexdigest()[:16]
