"""The one-line start-up warning when SGLang will not know HYBRID_SPARK (entry point missing or filtered)."""

import os
import subprocess
import sys

import pytest

from sglang_hybrid.sglang_plugin.startup_check import launch_problem, plugin_reach_problem, requested_algorithm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STUB = os.path.join(ROOT, "tests", "sgl_kernel_stub")
INSTALLED = {"hybrid_spark", "other_plugin"}


@pytest.mark.parametrize("value", [None, "", "hybrid_spark", "other_plugin, hybrid_spark", " hybrid_spark ,"])
def test_no_warning_when_sglang_loads_the_plugin(value):
    env = {} if value is None else {"SGLANG_PLUGINS": value}
    assert plugin_reach_problem(env, INSTALLED) is None


def test_warns_when_sglang_plugins_filters_it_out():
    msg = plugin_reach_problem({"SGLANG_PLUGINS": "other_plugin"}, INSTALLED)
    assert msg is not None and "\n" not in msg
    assert "SGLANG_PLUGINS='other_plugin' filters out the 'hybrid_spark' plugin" in msg
    assert "HYBRID_SPARK" in msg and "add hybrid_spark to SGLANG_PLUGINS" in msg


def test_warns_when_the_entry_point_is_not_installed():
    msg = plugin_reach_problem({}, {"other_plugin"})
    assert msg is not None and "\n" not in msg
    assert "entry point 'hybrid_spark' (group sglang.srt.plugins) is not installed" in msg and "pip install" in msg


def test_launch_problem_only_for_hybrid_spark_launches():
    bad_env = {"SGLANG_PLUGINS": "other_plugin"}
    assert requested_algorithm(["--model-path", "m", "--speculative-algorithm", "hybrid_spark"]) == "hybrid_spark"
    assert requested_algorithm(["--speculative-algorithm=EAGLE3"]) == "EAGLE3"
    assert requested_algorithm(["--model-path", "m"]) is None
    assert launch_problem(["--speculative-algorithm", "EAGLE3"], bad_env, INSTALLED) is None
    assert launch_problem(["--model-path", "m"], bad_env, INSTALLED) is None
    assert "filters out" in launch_problem(["--speculative-algorithm=hybrid_spark"], bad_env, INSTALLED)
    assert launch_problem(["--speculative-algorithm", "HYBRID_SPARK"], {}, INSTALLED) is None


def _python(code_or_module, args=(), plugins="other_plugin"):
    env = dict(os.environ, SGLANG_USE_CPU_ENGINE="1", PYTHONPATH=STUB + os.pathsep + ROOT, SGLANG_PLUGINS=plugins)
    cmd = [sys.executable, *code_or_module, *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)


def test_preflight_command_prints_one_line_and_fails():
    p = _python(["-m", "sglang_hybrid.sglang_plugin.startup_check"], ["--speculative-algorithm", "HYBRID_SPARK"])
    assert p.returncode == 1
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "filters out the 'hybrid_spark' plugin" in lines[0], p.stderr
    ok = _python(["-m", "sglang_hybrid.sglang_plugin.startup_check"], ["--speculative-algorithm", "HYBRID_SPARK"],
                 plugins="hybrid_spark")
    assert ok.returncode == 0 and ok.stderr.strip() == "", ok.stderr


def test_registering_by_hand_in_a_filtered_process_warns_that_the_scheduler_will_not_know_it():
    code = (
        "import logging; logging.basicConfig(level=logging.WARNING, format='%(levelname)s %(message)s')\n"
        "from sglang_hybrid.sglang_plugin.plugin import register\n"
        "print('REGISTERED', register())\n"
    )
    p = _python(["-c", code])
    assert "REGISTERED True" in p.stdout, p.stdout + p.stderr
    warn = [ln for ln in p.stderr.splitlines() if "filters out the 'hybrid_spark' plugin" in ln]
    assert len(warn) == 1 and "registered in this process only, not in SGLang's scheduler" in warn[0], p.stderr
