"""Run ``python -m sglang.launch_server`` on CPU as a subprocess, as a user would, and talk to it over HTTP.

The server gets the same CPU environment and arguments as the engine tests (``engine_harness.ENGINE_ENV`` and
``BASE_ENGINE_KWARGS``, turned into command-line flags), listens on 127.0.0.1 only, and runs in its own process
group so that :meth:`Server.stop` (SIGINT, then SIGKILL after a bound) reaches every process it spawned.

Usage::

    srv = Server.start(ServerConfig("hybrid", algorithm="HYBRID_SPARK", draft="standalone"), models)
    out = srv.post("/generate", {"text": "def add", "sampling_params": {"max_new_tokens": 8}})
    srv.stop()

A chat template (``CHAT_TEMPLATE``) is written next to the server's log and passed with ``--chat-template``: the
tiny tokenizer carries none, and writing it into the model directory would change the cached models.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Tuple

from engine_harness import BASE_ENGINE_KWARGS, ENGINE_ENV, REPO_ROOT, SPEC_KWARGS, STUB_DIR

HOST = "127.0.0.1"

# A minimal chat template in the tiny tokenizer's own special tokens.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)

# Server-only flags on top of the engine's.
SERVER_KWARGS: Dict[str, Any] = dict(log_level="info")


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the launching thread dies (Linux ``PR_SET_PDEATHSIG``); SGLang's
    own children exit when the launcher does."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1
    except Exception:  # noqa: BLE001 - not Linux: the caller's finally-kill still applies
        pass


def free_port() -> int:
    """An unused TCP port on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def cli_flags(kwargs: Dict[str, Any]) -> List[str]:
    """``sglang.Engine`` keyword arguments as ``launch_server`` flags: ``True`` -> ``--flag``; ``False`` / ``None``
    -> omitted (every boolean server flag defaults to off); anything else -> ``--flag value``."""
    out: List[str] = []
    for key, value in kwargs.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            out.append(flag)
        elif value is False or value is None:
            continue
        else:
            out += [flag, str(value)]
    return out


@dataclass(frozen=True)
class ServerConfig:
    """One server configuration: ``draft`` is a tiny-model name (``standalone`` / ``eagle3``) or a path."""

    name: str
    algorithm: Optional[str] = None
    draft: Optional[str] = None
    kwargs: Tuple[Tuple[str, Any], ...] = ()
    env: Tuple[Tuple[str, str], ...] = ()

    def resolve_kwargs(self, models: Any) -> Dict[str, Any]:
        kw = dict(BASE_ENGINE_KWARGS)
        kw.update(SERVER_KWARGS)
        kw["model_path"] = models.target
        if self.algorithm is not None:
            kw.update(SPEC_KWARGS)
            kw["speculative_algorithm"] = self.algorithm
            if self.draft is not None:
                kw["speculative_draft_model_path"] = getattr(models, self.draft, self.draft)
        kw.update(dict(self.kwargs))
        return kw


class ServerError(RuntimeError):
    """The server failed to start, died, or answered unexpectedly."""


class Server:
    """A running ``launch_server`` process group."""

    def __init__(self, config: ServerConfig, proc: subprocess.Popen, port: int, log_path: str, workdir: str):
        self.config = config
        self.proc = proc
        self.port = port
        self.log_path = log_path
        self.workdir = workdir
        self.start_s = 0.0
        self.url = f"http://{HOST}:{port}"

    # -- life cycle ---------------------------------------------------------------------------------------
    @classmethod
    def launch(cls, config: ServerConfig, models: Any, extra_args: Tuple[str, ...] = ()) -> "Server":
        """Start the server process group and return at once (call :meth:`wait_healthy` next). The server gets
        SIGKILL if this thread dies (so it cannot outlive a killed test run): launch from the main thread."""
        workdir = tempfile.mkdtemp(prefix=f"sglang-server-{config.name}-")
        template = os.path.join(workdir, "tiny_chat.jinja")
        with open(template, "w") as f:
            f.write(CHAT_TEMPLATE)
        port = free_port()
        kw = config.resolve_kwargs(models)
        kw.update(host=HOST, port=port, chat_template=template)
        argv = [sys.executable, "-m", "sglang.launch_server", *cli_flags(kw), *extra_args]
        env = dict(os.environ)
        env.update(ENGINE_ENV)
        env["PYTHONPATH"] = os.pathsep.join(
            [STUB_DIR, REPO_ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        )
        env.pop("SGLANG_HYBRID_RESOLVED_DRAFT_KIND", None)
        env.update(dict(config.env))
        log_path = os.path.join(workdir, "server.log")
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                argv, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, cwd=workdir, preexec_fn=_die_with_parent,
            )
        srv = cls(config, proc, port, log_path, workdir)
        srv._t0 = time.perf_counter()
        return srv

    @classmethod
    def start(
        cls, config: ServerConfig, models: Any, timeout_s: float = 420.0, extra_args: Tuple[str, ...] = ()
    ) -> "Server":
        """Launch the server and wait until ``/health`` answers 200 (raises :class:`ServerError`, after killing
        the process group, if it dies or does not get healthy in ``timeout_s``)."""
        srv = cls.launch(config, models, extra_args)
        srv.wait_healthy(timeout_s)
        return srv

    def wait_healthy(self, timeout_s: float = 420.0) -> None:
        """Wait for ``/health`` = 200; on failure kill the process group and raise :class:`ServerError`."""
        try:
            self._wait_healthy(timeout_s)
        except BaseException:
            self.kill()
            raise
        self.start_s = time.perf_counter() - self._t0

    def _wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerError(f"server {self.config.name!r} exited {self.proc.returncode}:\n{self.log_tail()}")
            try:
                status, _ = self.request("GET", "/health", timeout_s=5)
                if status == 200:
                    return
            except (OSError, urllib.error.URLError):
                pass
            time.sleep(1.0)
        raise ServerError(f"server {self.config.name!r} not healthy after {timeout_s:.0f} s:\n{self.log_tail()}")

    def log_tail(self, n: int = 6000) -> str:
        try:
            with open(self.log_path, "rb") as f:
                data = f.read()
            return data[-n:].decode("utf-8", "replace")
        except OSError:
            return "(no log)"

    def group_alive(self) -> bool:
        """Whether any process of the server's process group is still running."""
        try:
            os.killpg(self.proc.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        # A zombie leader counts as gone once reaped; reap it if it exited.
        self.proc.poll()
        try:
            os.killpg(self.proc.pid, 0)
        except ProcessLookupError:
            return False
        return True

    def interrupt(self, timeout_s: float = 60.0) -> float:
        """SIGINT to the server's main process (as Ctrl-C would); return seconds until the whole process group
        is gone. Raises :class:`ServerError` (after killing the group) if it is not gone within ``timeout_s``."""
        t0 = time.monotonic()
        try:
            os.kill(self.proc.pid, signal.SIGINT)
        except ProcessLookupError:
            pass
        while time.monotonic() - t0 < timeout_s:
            self.proc.poll()
            if not self.group_alive():
                return time.monotonic() - t0
            time.sleep(0.2)
        self.kill()
        raise ServerError(f"server {self.config.name!r} still running {timeout_s:.0f} s after SIGINT")

    def kill(self) -> None:
        """Stop the whole process group now (SIGKILL); idempotent."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            pass

    def stop(self, timeout_s: float = 60.0) -> None:
        """SIGINT, then SIGKILL of the group if it has not exited within ``timeout_s``."""
        if self.proc.poll() is None or self.group_alive():
            try:
                self.interrupt(timeout_s)
            except ServerError:
                pass
        self.kill()

    # -- HTTP -----------------------------------------------------------------------------------------------
    def request(
        self, method: str, path: str, body: Optional[dict] = None, timeout_s: float = 300.0,
        headers: Optional[Dict[str, str]] = None,
    ) -> Tuple[int, Any]:
        """One HTTP request; returns (status, parsed JSON or text). 4xx / 5xx are returned, not raised."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=dict(headers or {}))
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as resp:
                return resp.status, _parse(resp.read())
        except urllib.error.HTTPError as e:
            return e.code, _parse(e.read())

    def post(self, path: str, body: dict, timeout_s: float = 300.0, headers: Optional[Dict[str, str]] = None) -> Any:
        """POST JSON (with extra HTTP ``headers``); returns the parsed answer (raises :class:`ServerError` unless
        200)."""
        status, out = self.request("POST", path, body, timeout_s, headers)
        if status != 200:
            raise ServerError(f"POST {path} -> {status}: {out}")
        return out

    def get(self, path: str, timeout_s: float = 60.0) -> Any:
        status, out = self.request("GET", path, None, timeout_s)
        if status != 200:
            raise ServerError(f"GET {path} -> {status}: {out}")
        return out

    def stream(self, path: str, body: dict, timeout_s: float = 300.0) -> Iterator[dict]:
        """POST with ``stream: true``; yields every ``data:`` event as parsed JSON until ``[DONE]``. Closing the
        generator closes the connection (a client disconnect)."""
        req = urllib.request.Request(self.url + path, data=json.dumps(dict(body, stream=True)).encode(), method="POST")
        req.add_header("Content-Type", "application/json")
        resp = urllib.request.urlopen(req, timeout=timeout_s)
        try:
            for raw in resp:
                line = raw.decode("utf-8").strip()
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    return
                yield json.loads(payload)
        finally:
            resp.close()

    def internal_state(self) -> dict:
        """``/server_info`` -> ``internal_states[0]``."""
        return self.get("/server_info")["internal_states"][0]


def _parse(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace")


DEMO = ServerConfig("hybrid_spark_demo", algorithm="HYBRID_SPARK", draft="standalone")


def demo_command(port: int, extra: List[str], workdir: str) -> Tuple[List[str], Dict[str, str], Any]:
    """The launch_server command line and environment of ``scripts/serve_cpu_demo.sh`` (HYBRID_SPARK on the tiny
    models, built here if needed, chat template written into ``workdir``), and the models."""
    from tiny_models import build_tiny_models

    models = build_tiny_models()
    template = os.path.join(workdir, "tiny_chat.jinja")
    with open(template, "w") as f:
        f.write(CHAT_TEMPLATE)
    kw = DEMO.resolve_kwargs(models)
    kw.update(host=HOST, port=port, chat_template=template)
    env = dict(ENGINE_ENV)
    env.pop("SGLANG_PLUGINS")  # the user's own setting applies (the start-up check says if it filters us out)
    env["PYTHONPATH"] = os.pathsep.join([STUB_DIR, REPO_ROOT])
    return ["-m", "sglang.launch_server", *cli_flags(kw), *extra], env, models


def _main(argv: List[str]) -> int:
    """``python server_harness.py PORT WORKDIR [flags]``: print the demo's environment (``KEY=VALUE`` lines),
    a ``--`` line, then one launch_server argument per line, then ``TOKENIZER=path`` (for bench_serving)."""
    port, workdir, extra = int(argv[0]), argv[1], argv[2:]
    args, env, models = demo_command(port, extra, workdir)
    for k, v in env.items():
        print(f"{k}={v}")
    print("--")
    for a in args:
        print(a)
    print("--")
    print(f"TOKENIZER={models.tokenizer}")
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
