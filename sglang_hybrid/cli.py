"""``hybrid-spark``: the project's command line.

Subcommands: ``simulate`` (replay workloads through the real drafting and selection code), ``workloads``
(build the code-edit and chat workloads), ``calibrate`` (fit an n-gram calibration table) and ``check``
(verify the installed SGLang matches the API the plugin was built for, that HYBRID_SPARK registers, and
that SGLang's processes will load the plugin: entry point installed, not filtered out by ``SGLANG_PLUGINS``) and
``replay-drafters`` (replay the model-free drafters, per-request n-gram and cross-request corpus, on a workload).
"""

from __future__ import annotations

import sys


def _check(argv: list[str]) -> int:
    from .sglang_plugin.hooks import SUPPORTED_SGLANG, check_host_api, sglang_version
    from .sglang_plugin.plugin import register

    problems = check_host_api()
    print(f"sglang {sglang_version()} (built for {SUPPORTED_SGLANG})")
    for p in problems:
        print(f"  mismatch: {p}")
    ok = register()
    print("HYBRID_SPARK registered" if ok else "HYBRID_SPARK NOT registered")
    from .sglang_plugin.startup_check import plugin_reach_problem

    reach = plugin_reach_problem()
    print(reach or "SGLang's processes load the hybrid_spark plugin (entry point installed, not filtered)")
    return 0 if ok and not problems and not reach else 1


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {
        "simulate": "sglang_hybrid.sim.simulate_cli",
        "workloads": "sglang_hybrid.sim.workloads_cli",
        "calibrate": "sglang_hybrid.calibration.cli",
        "replay-drafters": "sglang_hybrid.sim.replay_drafters",
    }
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        print("\nusage: hybrid-spark {simulate,workloads,calibrate,check,replay-drafters} [options]  (each takes --help)")
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "check":
        return _check(rest)
    if cmd not in commands:
        print(f"hybrid-spark: unknown command {cmd!r}; choose from simulate, workloads, calibrate, check, replay-drafters",
              file=sys.stderr)
        return 2
    import importlib

    return int(importlib.import_module(commands[cmd]).main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
