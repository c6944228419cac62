"""Build the code-editing and chat workloads deterministically, with a manifest of their sources.

``build_workloads`` works on local releases only (archives or directories), so the tests run it offline;
``default_releases`` fetches the default package list's sdists with pip (the network path, used once to make
the shipped sets in ``sglang_hybrid/data/workloads``).
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from .chat import ChatFilter, doc_section_records, docstring_records
from .code_edit import EditFilter, diff_signature, edit_pair_info, make_record
from .jsonl import Record, write_workload
from .releases import Release, fetch_sdist, read_release_files

BUILDER_VERSION = 1

# Consecutive releases of widely used packages whose sdists hold Python plus docs (.rst/.md), web assets
# (.js/.css/.html templates), C sources and config (.toml/.cfg). (name, old, new).
DEFAULT_CODE_PAIRS: tuple[tuple[str, str, str], ...] = (
    ("flask", "2.3.3", "3.0.0"),
    ("flask", "3.0.3", "3.1.0"),
    ("werkzeug", "2.3.8", "3.0.0"),
    ("werkzeug", "3.0.6", "3.1.0"),
    ("jinja2", "3.0.3", "3.1.0"),
    ("click", "8.1.8", "8.2.0"),
    ("sphinx", "7.1.2", "7.2.0"),
    ("sphinx", "7.4.7", "8.0.0"),
    ("markupsafe", "2.1.5", "3.0.0"),
    ("simplejson", "3.19.3", "3.20.1"),
    ("attrs", "23.2.0", "24.1.0"),
    ("mkdocs", "1.5.3", "1.6.0"),
    ("pygments", "2.17.2", "2.18.0"),
    ("markdown", "3.5.2", "3.6"),
    ("msgpack", "1.0.8", "1.1.0"),
    ("tornado", "6.3.3", "6.4"),
    ("docutils", "0.20.1", "0.21.1"),
    ("psutil", "5.9.8", "6.0.0"),
    ("coverage", "7.5.4", "7.6.0"),
)

# Shipped-set caps: enough requests for the claims, small enough for the package (< ~5 MB in all).
SHIPPED_MAX_CODE = 240
SHIPPED_MAX_CHAT = 240


@dataclass(frozen=True)
class BuildParams:
    """Everything that decides the output besides the releases."""

    edit: EditFilter = field(default_factory=EditFilter)
    chat: ChatFilter = field(default_factory=ChatFilter)
    max_code: int = SHIPPED_MAX_CODE  # 0 = no cap
    max_chat: int = SHIPPED_MAX_CHAT  # 0 = no cap
    docstring_share: float = 0.4  # at most this share of the chat set comes from docstrings

    def validate(self) -> None:
        self.edit.validate()
        self.chat.validate()
        if self.max_code < 0 or self.max_chat < 0:
            raise ValueError(f"max_code/max_chat: must be >= 0, got {self.max_code}, {self.max_chat}")
        if not (0.0 <= self.docstring_share <= 1.0):
            raise ValueError(f"docstring_share: must be in [0, 1], got {self.docstring_share}")


def _h(s: str) -> str:
    return hashlib.sha256(s.encode("utf-8")).hexdigest()


def _round_robin(buckets: dict[str, list[Any]], cap: int) -> list[Any]:
    """Take one item from each bucket in key order, again and again, until ``cap`` (0 = all)."""
    order = sorted(buckets)
    lists = [sorted(buckets[k], key=lambda r: _h(r[0].id)) for k in order]
    out: list[Any] = []
    depth = 0
    while any(depth < len(x) for x in lists):
        for x in lists:
            if depth < len(x):
                out.append(x[depth])
                if cap and len(out) >= cap:
                    return out
        depth += 1
    return out


def code_edit_candidates(pairs: Sequence[tuple[Release, Release]], params: BuildParams) -> list[tuple[Record, dict]]:
    """Every kept (record, manifest entry) of the given release pairs."""
    out = []
    for old_rel, new_rel in pairs:
        if old_rel.name != new_rel.name:
            raise ValueError(f"release pair: names differ ({old_rel.name} vs {new_rel.name})")
        old_files = read_release_files(old_rel.path)
        new_files = read_release_files(new_rel.path)
        seen_diffs: set[str] = set()  # the same change made to many files (generated test data) counts once
        for path in sorted(set(old_files) & set(new_files)):
            info = edit_pair_info(path, old_files[path], new_files[path], params.edit)
            if info is None:
                continue
            sig = _h(diff_signature(old_files[path], new_files[path]))
            if sig in seen_diffs:
                continue
            seen_diffs.add(sig)
            rec = make_record(old_rel.name, old_rel.version, new_rel.version, path,
                              old_files[path], new_files[path], info, params.edit.max_hunks_listed)
            meta = {"source": f"{old_rel.name} {old_rel.version} -> {new_rel.version}", "path": path,
                    "lang": info.lang, "similarity": info.similarity, "changed_lines": info.changed_lines,
                    "hunks": info.hunks}
            out.append((rec, meta))
    return out


def chat_candidates(releases: Sequence[Release], params: BuildParams) -> list[tuple[Record, dict]]:
    """Every chat (record, manifest entry) from the documentation and docstrings of the given releases."""
    out = []
    seen_answers: set[str] = set()
    for rel in releases:
        files = read_release_files(rel.path, max_bytes=1 << 20)
        for path, text in files.items():
            if path.endswith((".rst", ".md")):
                recs, src = doc_section_records(rel.name, rel.version, path, text, params.chat), "doc-section"
            elif path.endswith(".py") and "/tests/" not in f"/{path}" and "/test_" not in f"/{path}":
                recs, src = docstring_records(rel.name, rel.version, path, text, params.chat), "docstring"
            else:
                continue
            for rec in recs:
                key = _h(rec.output)
                if key in seen_answers:
                    continue
                seen_answers.add(key)
                out.append((rec, {"source": f"{rel.name} {rel.version}", "path": path, "from": src}))
    return out


def _select_code(cands: list[tuple[Record, dict]], cap: int) -> list[tuple[Record, dict]]:
    buckets: dict[str, list] = defaultdict(list)
    for rec, meta in cands:
        family = "python" if meta["lang"] == "python" else "other"
        buckets[f"{meta['source']}|{family}"].append((rec, meta))
    return _round_robin(buckets, cap)


def _select_chat(cands: list[tuple[Record, dict]], cap: int, docstring_share: float) -> list[tuple[Record, dict]]:
    docs: dict[str, list] = defaultdict(list)
    strings: dict[str, list] = defaultdict(list)
    for rec, meta in cands:
        (strings if meta["from"] == "docstring" else docs)[meta["source"]].append((rec, meta))
    if not cap:
        return _round_robin(docs, 0) + _round_robin(strings, 0)
    n_str = int(cap * docstring_share)
    picked_str = _round_robin(strings, n_str)
    picked_docs = _round_robin(docs, cap - len(picked_str))
    if len(picked_docs) < cap - len(picked_str):  # not enough sections: fill with docstrings
        picked_str = _round_robin(strings, cap - len(picked_docs))
    return picked_docs + picked_str


def _lengths(rec: Record, count_tokens: Callable[[str], int] | None) -> dict:
    d = {"prompt_chars": len(rec.prompt), "output_chars": len(rec.output),
         "prompt_lines": rec.prompt.count("\n") + 1, "output_lines": rec.output.count("\n") + 1}
    if count_tokens is not None:
        d["prompt_tokens"] = count_tokens(rec.prompt)
        d["output_tokens"] = count_tokens(rec.output)
    return d


def build_workloads(
    code_pairs: Sequence[tuple[Release, Release]],
    doc_releases: Sequence[Release],
    out_dir: str | Path,
    params: BuildParams = BuildParams(),
    count_tokens: Callable[[str], int] | None = None,
    tokenizer_name: str | None = None,
) -> dict:
    """Write ``code_edit.jsonl``, ``chat.jsonl`` and ``manifest.json`` into ``out_dir``; return the manifest.

    Deterministic: the same releases and parameters give byte-identical files (records are ordered by a hash of
    their id, so any prefix is a fair subsample).
    """
    params.validate()
    out = Path(out_dir)
    code = _select_code(code_edit_candidates(code_pairs, params), params.max_code)
    chat = _select_chat(chat_candidates(doc_releases, params), params.max_chat, params.docstring_share)
    files = {}
    entries = []
    for fname, picked in (("code_edit.jsonl", code), ("chat.jsonl", chat)):
        picked = sorted(picked, key=lambda rm: _h(rm[0].id))
        write_workload(out / fname, [r for r, _ in picked])
        data = (out / fname).read_bytes()
        langs: dict[str, int] = defaultdict(int)
        for _, meta in picked:
            langs[meta.get("lang", meta.get("from", "?"))] += 1
        files[fname] = {"records": len(picked), "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                        "by_kind": dict(sorted(langs.items()))}
        for rec, meta in picked:
            entries.append({"id": rec.id, "kind": rec.kind, **meta, **_lengths(rec, count_tokens)})

    def rel(r: Release) -> dict:
        return {"name": r.name, "version": r.version, "file": Path(r.path).name, "sha256": r.sha256, "origin": r.origin}

    manifest = {
        "builder": "sglang_hybrid.sim.workloads", "builder_version": BUILDER_VERSION,
        "how": ("`hybrid-spark workloads build --out DIR` (downloads the sdists below with pip download --no-deps "
                "--no-binary NAME); records are ordered by sha256(id), so any prefix is a fair subsample"),
        "params": asdict(params), "tokenizer": tokenizer_name if count_tokens else None,
        "code_pairs": [{"old": rel(a), "new": rel(b)} for a, b in code_pairs],
        "doc_releases": [rel(r) for r in doc_releases],
        "files": files,
        "records": entries,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return manifest


def default_releases(cache_dir: str | Path, pairs: Iterable[tuple[str, str, str]] = DEFAULT_CODE_PAIRS,
                     log: Callable[[str], None] = print) -> tuple[list[tuple[Release, Release]], list[Release]]:
    """Fetch (or reuse from ``cache_dir``) the sdists of ``pairs``; docs come from each package's newest release."""
    code_pairs = []
    newest: dict[str, Release] = {}
    for name, old, new in pairs:
        log(f"fetching {name} {old} and {new}")
        a, b = fetch_sdist(name, old, cache_dir), fetch_sdist(name, new, cache_dir)
        code_pairs.append((a, b))
        newest[name] = b
    return code_pairs, [newest[k] for k in sorted(newest)]
