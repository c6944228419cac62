"""Run a snippet in fresh-process conditions without paying SGLang's import for each case.

A fresh ``python -c`` that imports SGLang and loads the plugin takes 12-25 s here; a test module that resolves
twenty configurations would spend minutes on imports alone. ``ForkedSGLang`` starts one process that imports
SGLang's modules (those the plugin's host check reads, ``hooks.HOST_ATTRS``) and then forks a child per case.
The child sets the case's environment, points its stdout and stderr at a file, and runs the snippet.
``load_plugins()`` runs inside the snippet, in the child. So each case starts as a fresh process would: nothing
registered or patched, its own environment, and nothing carried over from earlier cases. What the parent
imported is shared, read-only, and imported with the same base environment.
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
import tempfile

_SERVER = r"""
import importlib, json, os, sys, tempfile
from sglang.srt.server_args import prepare_server_args  # noqa: F401  (the import each case would pay)
from sglang_hybrid.sglang_plugin import hooks
for _attr in hooks.HOST_ATTRS:
    try:
        importlib.import_module(_attr.target.partition(":")[0])
    except Exception:
        pass  # the child's own host check reports it
_CASE = compile(sys.argv[1], "<case>", "exec")
print("READY", flush=True)
while True:
    line = sys.stdin.readline()
    if not line:
        break
    req = json.loads(line)
    with tempfile.TemporaryFile() as log:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
            os.environ.clear()
            os.environ.update(req["env"])
            sys.argv = ["-c", *req["args"]]
            code = 0
            try:
                exec(_CASE, {"__name__": "__main__"})
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            except BaseException:
                import traceback
                traceback.print_exc()
                code = 1
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        log.seek(0)
        out = log.read().decode(errors="replace")
    print(json.dumps({"rc": os.waitstatus_to_exitcode(status), "out": out}), flush=True)
"""


class ForkedSGLang:
    """``run(args, env)`` runs ``code`` as ``python -c code *args`` would with environment ``env`` (the whole
    environment, not additions); returns ``(exit status, stdout and stderr interleaved)``."""

    def __init__(self, code: str, env: dict[str, str], timeout: float = 300.0) -> None:
        self.timeout = timeout
        self._errors = tempfile.TemporaryFile()
        self._proc = subprocess.Popen([sys.executable, "-c", _SERVER, code], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=self._errors, env=env, text=True)
        ready = self._readline()
        if ready.strip() != "READY":
            raise RuntimeError(f"the forking process did not start: {ready!r}\n{self._stderr()}")

    def run(self, args: list[str], env: dict[str, str]) -> tuple[int, str]:
        self._proc.stdin.write(json.dumps({"args": list(args), "env": dict(env)}) + "\n")
        self._proc.stdin.flush()
        reply = json.loads(self._readline())
        return reply["rc"], reply["out"]

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.stdin.close()
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._errors.close()

    def _readline(self) -> str:
        with selectors.DefaultSelector() as sel:
            sel.register(self._proc.stdout, selectors.EVENT_READ)
            if not sel.select(self.timeout):
                self._proc.kill()
                raise TimeoutError(f"no reply in {self.timeout} s\n{self._stderr()}")
        line = self._proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the forking process exited ({self._proc.wait()})\n{self._stderr()}")
        return line

    def _stderr(self) -> str:
        self._errors.seek(0)
        return self._errors.read().decode(errors="replace")[-4000:]
