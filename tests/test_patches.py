"""``patches/``: each upstream diff applies cleanly (dry run) to the installed SGLang, and names the hook it retires.

A diff that no longer applies after a host upgrade is reported with the hook(s) it names: applied in reverse,
SGLang has taken the change and the hook can retire; neither way, SGLang changed around it and the hook needs a
look. Nothing in site-packages is written: every file a patch names is hashed (and its directory listed) before
and after the dry runs. Only ``importlib.util.find_spec("sglang")`` is used to locate SGLang (nothing imported).
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PATCH_DIR = os.path.join(ROOT, "patches")
README = os.path.join(PATCH_DIR, "README.md")
PATCHES = sorted(f for f in os.listdir(PATCH_DIR) if f.endswith(".patch")) if os.path.isdir(PATCH_DIR) else []
_NAME = re.compile(r"^\d\d-[a-z0-9-]+\.patch$")
_RETIRES = re.compile(r"^Retires:\s*(\S+)", re.M)


def _site_packages() -> str:
    spec = importlib.util.find_spec("sglang")
    if spec is None or spec.origin is None:
        pytest.skip("sglang is not installed")
    return os.path.dirname(os.path.dirname(spec.origin))


def _read(name: str) -> str:
    with open(os.path.join(PATCH_DIR, name)) as f:
        return f.read()


def _header(text: str) -> str:
    """The free text before the first file header of a patch."""
    return text.split("\n--- ", 1)[0]


def _targets(text: str) -> list[tuple[str, bool]]:
    """``(path relative to site-packages, is_new_file)`` for every file the patch touches."""
    out = []
    olds = re.findall(r"^--- (\S+)", text, re.M)
    news = re.findall(r"^\+\+\+ b/(\S+)", text, re.M)
    assert len(olds) == len(news) and news, "malformed patch: unpaired ---/+++ lines"
    for old, new in zip(olds, news):
        assert old == "/dev/null" or old == f"a/{new}", f"--- {old} does not match +++ b/{new}"
        assert new.startswith("sglang/"), f"{new}: paths must be a/sglang/... and b/sglang/..."
        out.append((new, old == "/dev/null"))
    return out


def _tool() -> list[str]:
    if shutil.which("patch"):
        return ["patch", "-p1", "--batch", "--force", "--no-backup-if-mismatch", "--silent"]
    pytest.skip("GNU patch is not installed")


def _dry_run(text: str, directory: str, reverse: bool = False) -> subprocess.CompletedProcess:
    cmd = _tool() + ["--dry-run", "-d", directory] + (["--reverse"] if reverse else [])
    return subprocess.run(cmd, input=text, capture_output=True, text=True, timeout=60)


def _snapshot(site: str, paths: list[str]) -> dict:
    """Hash and mtime of each target, and the listing of each target's directory (catches .orig / .rej)."""
    snap = {}
    for rel in paths:
        p = os.path.join(site, rel)
        if os.path.exists(p):
            with open(p, "rb") as f:
                snap[rel] = (hashlib.sha256(f.read()).hexdigest(), os.stat(p).st_mtime_ns)
        else:
            snap[rel] = None
        d = os.path.dirname(p)
        snap[d] = sorted(os.listdir(d)) if os.path.isdir(d) else None
    return snap


def _statements(node: ast.AST):
    """The statements of a module, class or function body, through if / with / try / loop blocks (not into
    nested definitions)."""
    for child in getattr(node, "body", []):
        yield child
        if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            for block in ("body", "orelse", "finalbody", "handlers"):
                for sub in getattr(child, block, []) or []:
                    yield from _statements(ast.Module(body=[sub], type_ignores=[]))


def _defined(dotted: str) -> bool:
    """Whether ``sglang_hybrid.<module>.<qualname>`` is defined in the plugin's source (a def, class or
    assignment, nested defs included), read with ``ast`` so nothing is imported."""
    parts = dotted.split(".")
    for i in range(len(parts) - 1, 0, -1):
        path = os.path.join(ROOT, *parts[:i]) + ".py"
        if os.path.isfile(path):
            break
    else:
        return False
    with open(path) as f:
        node: ast.AST = ast.parse(f.read(), path)
    for name in parts[i:]:
        found = None
        for child in _statements(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and child.name == name:
                found = child
            elif isinstance(child, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == name for t in child.targets):
                found = child
        if found is None:
            return False
        node = found
    return True


def test_patches_exist_and_match_readme():
    assert PATCHES, "patches/ holds no .patch file"
    bad = [p for p in PATCHES if not _NAME.match(p)]
    assert not bad, f"patch names must look like 01-what-it-does.patch: {bad}"
    with open(README) as f:
        readme = f.read()
    listed = set(re.findall(r"\b\d\d-[a-z0-9-]+\.patch\b", readme))
    assert listed == set(PATCHES), (
        f"README lists {sorted(listed - set(PATCHES))} with no file; files {sorted(set(PATCHES) - listed)} "
        "are not in the README")
    for name in PATCHES:
        assert re.search(rf"^\| `{re.escape(name)}` \|", readme, re.M), f"{name} has no row in the README table"
        assert f"**`{name}`.**" in readme, f"{name} has no rationale paragraph in the README"


@pytest.mark.parametrize("name", PATCHES)
def test_patch_names_the_hook_it_retires(name):
    text = _read(name)
    retires = _RETIRES.findall(_header(text))
    assert retires, f"{name}: no 'Retires: <module>.<function>' line in its header"
    with open(README) as f:
        row = next(line for line in f if line.startswith(f"| `{name}` |"))
    for dotted in retires:
        assert dotted.startswith("sglang_hybrid."), f"{name}: Retires {dotted}: not a plugin attribute"
        assert _defined(dotted), f"{name}: Retires {dotted}, which the plugin no longer defines"
        assert f"`{dotted}`" in row, f"{name}: the README row does not name {dotted}"


@pytest.mark.parametrize("name", PATCHES)
def test_patch_applies_cleanly_to_installed_sglang(name):
    site = _site_packages()
    text = _read(name)
    targets = _targets(text)
    paths = [rel for rel, _ in targets]
    before = _snapshot(site, paths)
    for rel, new in targets:
        exists = os.path.exists(os.path.join(site, rel))
        assert exists != new, f"{name}: {rel} {'already exists' if exists else 'is missing'} in {site}"
    res = _dry_run(text, site)
    if res.returncode != 0:
        retires = ", ".join(_RETIRES.findall(_header(text)))
        if _dry_run(text, site, reverse=True).returncode == 0:
            pytest.fail(f"{name} is already in the installed SGLang: retire {retires} and delete the patch")
        pytest.fail(f"{name} no longer applies to the installed SGLang ({site}); re-check {retires}:\n"
                    f"{res.stdout}{res.stderr}")
    assert _snapshot(site, paths) == before, f"{name}: the dry run changed files in {site}"


def test_all_patches_apply_together_and_compile():
    """In numeric order on a copy of the touched files; every patched file is valid Python."""
    site = _site_packages()
    with tempfile.TemporaryDirectory() as tmp:
        touched = set()
        for name in PATCHES:
            for rel, new in _targets(_read(name)):
                touched.add(rel)
                if not new and os.path.exists(os.path.join(site, rel)):
                    os.makedirs(os.path.dirname(os.path.join(tmp, rel)), exist_ok=True)
                    shutil.copy2(os.path.join(site, rel), os.path.join(tmp, rel))
        for name in PATCHES:
            res = subprocess.run(_tool() + ["-d", tmp], input=_read(name), capture_output=True, text=True,
                                 timeout=60)
            assert res.returncode == 0, f"{name} does not apply after the patches before it:\n{res.stdout}"
        for rel in sorted(touched):
            path = os.path.join(tmp, rel)
            with open(path) as f:
                compile(f.read(), path, "exec")
        leftovers = [f for _, _, fs in os.walk(tmp) for f in fs if f.endswith((".orig", ".rej"))]
        assert not leftovers, leftovers


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
