"""``scripts/serve_cpu_demo.sh --dry-run``: the launch_server command it would run, and the commands it prints."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))

from server_harness import cli_flags  # noqa: E402


def test_cli_flags_translate_engine_kwargs():
    flags = cli_flags(dict(device="cpu", disable_cuda_graph=True, enable_mixed_chunk=False,
                           speculative_num_draft_tokens=None, mem_fraction_static=0.05))
    assert flags == ["--device", "cpu", "--disable-cuda-graph", "--mem-fraction-static", "0.05"]


def test_demo_dry_run_prints_the_server_and_the_commands_to_try():
    env = dict(os.environ, PYTHON=sys.executable)
    env.pop("SGLANG_PLUGINS", None)
    p = subprocess.run(["bash", os.path.join(ROOT, "scripts", "serve_cpu_demo.sh"), "--dry-run", "--port", "31999",
                        "--max-running-requests", "8"], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    server = next(ln for ln in p.stdout.splitlines() if ln.startswith("== server:"))
    for flag in ("-m sglang.launch_server", "--speculative-algorithm HYBRID_SPARK", "--device cpu",
                 "--attention-backend triton", "--disable-cuda-graph", "--host 127.0.0.1", "--port 31999",
                 "--chat-template ", "--max-running-requests 8"):
        assert flag in server, (flag, server)
    assert "/standalone" in server and "/target" in server
    assert "curl -s http://127.0.0.1:31999/v1/chat/completions" in p.stdout
    assert "-m sglang.benchmark.serving --backend sglang --host 127.0.0.1 --port 31999" in p.stdout


def test_demo_refuses_to_start_when_sglang_plugins_filters_the_plugin_out():
    env = dict(os.environ, PYTHON=sys.executable, SGLANG_PLUGINS="some_other_plugin")
    p = subprocess.run(["bash", os.path.join(ROOT, "scripts", "serve_cpu_demo.sh"), "--port", "31998"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 1
    assert "SGLANG_PLUGINS='some_other_plugin' filters out the 'hybrid_spark' plugin" in p.stderr, p.stderr


def test_a_launched_server_group_dies_with_the_process_that_launched_it():
    """``server_harness`` launches servers in their own session with PR_SET_PDEATHSIG: a test run that is killed
    leaves no server behind."""
    import time

    code = (
        "import os, subprocess, sys\n"
        f"sys.path.insert(0, {os.path.join(ROOT, 'tests', 'e2e')!r})\n"
        "from server_harness import _die_with_parent\n"
        "p = subprocess.Popen(['sleep', '60'], start_new_session=True, preexec_fn=_die_with_parent)\n"
        "print(p.pid, flush=True)\n"
        "os._exit(0)\n"  # no cleanup, like a SIGKILLed test run
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    pid = int(out.stdout.split()[0])
    for _ in range(50):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.kill(pid, 9)
    raise AssertionError("the launched process outlived its launcher")
