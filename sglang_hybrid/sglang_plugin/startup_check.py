"""Why SGLang would not know HYBRID_SPARK: one line a user can act on.

SGLang loads plugins from the entry-point group ``sglang.srt.plugins`` in each of its processes (launcher,
spawned scheduler, detokenizer), keeping only the names listed in ``SGLANG_PLUGINS`` when that is set. When the
entry point is missing or filtered out, none of this package runs inside SGLang, and the user only sees SGLang's
``Unknown speculative algorithm name: HYBRID_SPARK``. So the check runs where this package does run:

* :func:`~sglang_hybrid.sglang_plugin.plugin.register` warns when it is called in a process SGLang's own
  processes will not follow (registered by hand, the entry point missing or filtered): the launcher then knows
  HYBRID_SPARK but the scheduler will not;
* ``hybrid-spark check`` prints it;
* ``python -m sglang_hybrid.sglang_plugin.startup_check [launch_server flags]`` prints it when the flags request
  HYBRID_SPARK and exits 1 (``scripts/serve_cpu_demo.sh`` runs it before starting the server).
"""

from __future__ import annotations

import os
import sys
from typing import Iterable, Mapping, Optional, Sequence

GROUP = "sglang.srt.plugins"
ENTRY_POINT = "hybrid_spark"
ALGO_NAME = "HYBRID_SPARK"


def installed_entry_points() -> set:
    """Names of the installed entry points of SGLang's general plugin group."""
    from importlib.metadata import entry_points

    return {ep.name for ep in entry_points(group=GROUP)}


def plugin_reach_problem(
    env: Optional[Mapping[str, str]] = None, names: Optional[Iterable[str]] = None
) -> Optional[str]:
    """One line saying why SGLang's processes will not load this plugin, or ``None`` when they will.

    ``env`` defaults to ``os.environ`` and ``names`` to the installed entry points; SGLang's filter is
    ``SGLANG_PLUGINS``, a comma-separated list of entry-point names (empty or unset: load all)."""
    env = os.environ if env is None else env
    names = installed_entry_points() if names is None else set(names)
    if ENTRY_POINT not in names:
        return (
            f"sglang-hybrid: entry point {ENTRY_POINT!r} (group {GROUP}) is not installed, so SGLang's processes "
            f"(the scheduler included) never register {ALGO_NAME}: pip install sglang-hybrid (or pip install -e "
            "the checkout) in the Python that runs SGLang"
        )
    allowed = env.get("SGLANG_PLUGINS", "") or ""
    allowed_set = {x.strip() for x in allowed.split(",") if x.strip()}
    if allowed_set and ENTRY_POINT not in allowed_set:
        return (
            f"sglang-hybrid: SGLANG_PLUGINS={allowed!r} filters out the {ENTRY_POINT!r} plugin, so SGLang does "
            f"not know {ALGO_NAME}: add {ENTRY_POINT} to SGLANG_PLUGINS or unset it"
        )
    return None


def requested_algorithm(argv: Sequence[str]) -> Optional[str]:
    """The value of ``--speculative-algorithm`` in launch_server flags (last one wins), or ``None``."""
    value = None
    for i, arg in enumerate(argv):
        if arg == "--speculative-algorithm" and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith("--speculative-algorithm="):
            value = arg.split("=", 1)[1]
    return value


def launch_problem(
    argv: Sequence[str], env: Optional[Mapping[str, str]] = None, names: Optional[Iterable[str]] = None
) -> Optional[str]:
    """The one-line warning for launch_server flags that request HYBRID_SPARK which SGLang will not know."""
    algo = requested_algorithm(argv)
    if algo is None or algo.upper() != ALGO_NAME:
        return None
    return plugin_reach_problem(env, names)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Print the warning for these launch_server flags (exit 1), or nothing (exit 0)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    problem = launch_problem(argv)
    if problem:
        print(problem, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
