"""The workload builder (offline, on two tiny fake releases), the JSONL format and the shipped sets."""

from __future__ import annotations

import hashlib
import json
import subprocess
import tarfile
from pathlib import Path

import pytest

from sglang_hybrid.sim import releases, workloads_cli
from sglang_hybrid.sim.code_edit import EditFilter, describe_change, edit_pair_info
from sglang_hybrid.sim.jsonl import WorkloadFormatError, read_workload
from sglang_hybrid.sim.releases import fetch_sdist, local_release, read_release_files
from sglang_hybrid.sim.workloads import BuildParams, build_workloads

DATA = Path(__file__).resolve().parent.parent / "sglang_hybrid" / "data" / "workloads"

CORE_V1 = '''"""Core helpers of fakepkg."""

import os


def load(path, encoding="utf-8"):
    """Read a whole file."""
    with open(path, encoding=encoding) as f:
        return f.read()


def save(path, text):
    """Write a whole file."""
    with open(path, "w") as f:
        f.write(text)


class Store:
    """A key-value store kept in a directory."""

    def __init__(self, root):
        self.root = root

    def get(self, key):
        return load(os.path.join(self.root, key))

    def put(self, key, value):
        save(os.path.join(self.root, key), value)

    def keys(self):
        return sorted(os.listdir(self.root))
''' + "".join(f"\n\ndef helper_{i}(x):\n    return x * {i} + len(str(x))\n" for i in range(12))

CORE_V2 = CORE_V1.replace(
    '''    def put(self, key, value):
        save(os.path.join(self.root, key), value)
''',
    '''    def put(self, key, value, overwrite=True):
        target = os.path.join(self.root, key)
        if not overwrite and os.path.exists(target):
            raise KeyError(key)
        save(target, value)

    def delete_entry_permanently(self, key):
        os.remove(os.path.join(self.root, key))
''')

APP_V1 = "".join(f"function handler{i}(event) {{\n  console.log('event {i}', event.type);\n  return {i};\n}}\n\n"
                 for i in range(14))
APP_V2 = APP_V1.replace("return 3;", "return computeThreeFromScratch(event);").replace(
    "console.log('event 7', event.type);", "console.debug('event 7', event.type, event.detail);")

PARA = ("The store keeps every value in its own file under the root directory, so that two processes can "
        "share it without a server. Reads are plain file reads and writes replace the file in one step. ")
GUIDE_MD = (f"# Fakepkg guide\n\nIntro text.\n\n## Storing values\n\n{PARA * 4}\n\n## Reading values back\n\n"
            f"{PARA.replace('store', 'reader') * 4}\n\n## Changelog\n\n{PARA * 4}\n")
INTRO_RST = f"Introduction\n============\n\n{PARA * 3}\n\nInstallation\n------------\n\n{PARA * 2}\n"


def _write_release(root: Path, version: str) -> Path:
    d = root / f"fakepkg-{version}"
    files = {
        "fakepkg/core.py": CORE_V1 if version == "1.0" else CORE_V2,
        "fakepkg/same.py": CORE_V1,
        "fakepkg/__init__.py": f'"""fakepkg."""\n__version__ = "{version}"\n' + "# padding line\n" * 80,
        "fakepkg/big.py": ("x = 1\n" * 2000) + (f"y = '{version}'\n"),
        "fakepkg/rewrite.py": (CORE_V1 if version == "1.0" else APP_V1.replace("function", "def").replace("{", ":")),
        "static/app.js": APP_V1 if version == "1.0" else APP_V2,
        "docs/guide.md": GUIDE_MD,
        "docs/intro.rst": INTRO_RST,
        "PKG-INFO": f"Name: fakepkg\nVersion: {version}\n" * 50,
        "logo.png": "\x89PNG not text\x00",
    }
    for rel, text in files.items():
        p = d / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text, encoding="utf-8")
    return d


@pytest.fixture(scope="module")
def fake(tmp_path_factory):
    root = tmp_path_factory.mktemp("releases")
    a, b = _write_release(root, "1.0"), _write_release(root, "1.1")
    archives = []
    for d in (a, b):
        arc = root / f"{d.name}.tar.gz"
        with tarfile.open(arc, "w:gz") as t:
            for p in sorted(d.rglob("*")):
                t.add(p, arcname=str(p.relative_to(root)), recursive=False)
        archives.append(arc)
    return a, b, archives[0], archives[1]


def _build(a, b, out: Path, **kw):
    pair = (local_release("fakepkg", "1.0", a), local_release("fakepkg", "1.1", b))
    return build_workloads([pair], [pair[1]], out, BuildParams(max_code=0, max_chat=0, **kw))


def test_reads_archive_and_directory_alike(fake):
    a, _, arc_a, _ = fake
    from_dir, from_tar = read_release_files(a), read_release_files(arc_a)
    assert from_dir == from_tar
    assert "fakepkg/core.py" in from_dir and "static/app.js" in from_dir
    assert "PKG-INFO" not in from_dir and "logo.png" not in from_dir


def test_build_is_deterministic(fake, tmp_path):
    a, b, arc_a, arc_b = fake
    m1 = _build(a, b, tmp_path / "one")
    m2 = _build(a, b, tmp_path / "two")
    for name in ("code_edit.jsonl", "chat.jsonl", "manifest.json"):
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes(), name
    assert m1 == m2
    # Archives instead of directories: the same records (only the manifest's source digests differ).
    _build(arc_a, arc_b, tmp_path / "tar")
    for name in ("code_edit.jsonl", "chat.jsonl"):
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "tar" / name).read_bytes(), name


def test_code_edit_records_are_real_partial_edits(fake, tmp_path):
    a, b, _, _ = fake
    m = _build(a, b, tmp_path)
    recs = {r.id: r for r in read_workload(tmp_path / "code_edit.jsonl")}
    paths = sorted(rid.split("/", 2)[2] for rid in recs)
    # unchanged, version-bump-only, oversized, rewritten, binary and metadata files are all left out
    assert paths == ["fakepkg/core.py", "static/app.js"]
    core = recs["code-edit/fakepkg-1.0..1.1/fakepkg/core.py"]
    assert core.kind == "code-edit"
    assert core.output == CORE_V2
    assert CORE_V1 in core.prompt
    # the instruction describes the change (where, which new names) without giving the new code
    assert "delete_entry_permanently" in core.prompt
    assert "raise KeyError(key)" not in core.prompt and "if not overwrite" not in core.prompt
    assert m["files"]["code_edit.jsonl"]["records"] == 2
    langs = {e["lang"] for e in m["records"] if e["kind"] == "code-edit"}
    assert langs == {"python", "javascript"}


def test_chat_answers_are_not_in_their_prompts(fake, tmp_path):
    a, b, _, _ = fake
    _build(a, b, tmp_path)
    recs = read_workload(tmp_path / "chat.jsonl")
    assert len(recs) >= 3
    titles = " ".join(r.prompt for r in recs)
    assert "Changelog" not in titles  # changelog sections are not chat material
    for r in recs:
        assert r.kind == "chat" and len(r.output) >= 500
        chunks = [r.output[i: i + 40] for i in range(0, len(r.output) - 40, 20)]
        assert not any(c in r.prompt for c in chunks), r.id


def test_filters_and_instruction():
    flt = EditFilter(min_bytes=10, max_bytes=10_000)
    assert edit_pair_info("a.py", "x = 1\n" * 20, "x = 1\n" * 20, flt) is None  # no change
    assert edit_pair_info("a.py", 'v = "1.0"\nx = 2\n' * 10, 'v = "1.0"\nx = 2\n' * 9 + 'v = "1.1"\nx = 2\n', flt) is None
    assert edit_pair_info("a.bin", "a\n" * 20, "b\n" * 20, flt) is None  # not a kept language
    old = "a\nb\nc\nd\ne\nf\ng\nh\n"
    bullets, changed, hunks = describe_change(old, old.replace("b\n", "B\n").replace("h\n", "h\ni\n"), "text")
    assert hunks == 2 and changed == 3
    assert bullets[0].startswith("Line 2") and bullets[1].startswith("After line 8")


def test_format_errors_name_the_line(tmp_path):
    good = {"id": "x", "kind": "chat", "prompt": "p", "output": "o"}
    cases = [({**good, "kind": "poem"}, "kind"), ({k: v for k, v in good.items() if k != "output"}, "missing"),
             ({**good, "extra": 1}, "unknown field"), ({**good, "prompt": 3}, "prompt")]
    for obj, word in cases:
        p = tmp_path / "w.jsonl"
        p.write_text(json.dumps(good) + "\n" + json.dumps({**obj, "id": "y"}) + "\n")
        with pytest.raises(WorkloadFormatError, match=word) as e:
            read_workload(p)
        assert ":2:" in str(e.value)
    p.write_text(json.dumps(good) + "\n" + json.dumps(good) + "\n")
    with pytest.raises(WorkloadFormatError, match="duplicate id"):
        read_workload(p)


def test_cli_build_from_local_pair(fake, tmp_path, capsys):
    a, b, _, _ = fake
    out = tmp_path / "cli"
    rc = workloads_cli.main(["build", "--local-pair", "fakepkg", "1.0", str(a), "1.1", str(b), "--out", str(out),
                             "--max-code", "0", "--max-chat", "0"])
    assert rc == 0
    m = json.loads((out / "manifest.json").read_text())
    assert m["tokenizer"] and all("output_tokens" in e for e in m["records"])  # token counts, shipped tokenizer
    assert workloads_cli.main(["stats", str(out / "code_edit.jsonl")]) == 0
    assert "output tokens" in capsys.readouterr().out
    assert workloads_cli.main(["build", "--local-pair", "fakepkg", "1.0", str(tmp_path / "nope"), "1.1", str(b),
                               "--out", str(out)]) == 2


def test_fetch_sdist_reuses_the_cache_without_network(tmp_path, monkeypatch, fake):
    _, _, arc_a, _ = fake
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "FakePkg-1.0.tar.gz").write_bytes(arc_a.read_bytes())

    def no_network(*a, **k):
        raise AssertionError("pip must not run when the sdist is cached")

    monkeypatch.setattr(releases.subprocess, "run", no_network)
    rel = fetch_sdist("fakepkg", "1.0", cache)
    assert rel.path.name == "FakePkg-1.0.tar.gz" and rel.origin == "pypi-sdist"
    assert rel.sha256 == hashlib.sha256(arc_a.read_bytes()).hexdigest()
    # not cached: pip download is called (here it fails, and the error says so)
    monkeypatch.setattr(releases.subprocess, "run",
                        lambda *a, **k: subprocess.CompletedProcess(a, 1, "", "no such package"))
    with pytest.raises(RuntimeError, match="pip download fakepkg==9.9 failed"):
        fetch_sdist("fakepkg", "9.9", cache)


def test_shipped_workloads():
    manifest = json.loads((DATA / "manifest.json").read_text())
    total = 0
    for name, kind in (("code_edit.jsonl", "code-edit"), ("chat.jsonl", "chat")):
        path = DATA / name
        data = path.read_bytes()
        total += len(data)
        assert hashlib.sha256(data).hexdigest() == manifest["files"][name]["sha256"], f"{name} differs from manifest"
        recs = read_workload(path)
        assert len(recs) >= 200 and all(r.kind == kind for r in recs)
    assert total + len((DATA / "manifest.json").read_bytes()) < 5_000_000
    code = [e for e in manifest["records"] if e["kind"] == "code-edit"]
    assert len({e["lang"] for e in code}) >= 5
    assert len({e["source"] for e in code}) >= 10
    assert all(0.5 <= e["similarity"] < 1.0 for e in code)
    assert all(1024 <= len(r.output.encode()) <= 8192 for r in read_workload(DATA / "code_edit.jsonl"))
    assert all(e["origin"] == "pypi-sdist" for p in manifest["code_pairs"] for e in p.values())
