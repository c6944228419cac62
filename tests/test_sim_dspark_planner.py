"""The simulator's DSpark planner equals SGLang 0.5.23's (CPU torch path), and the simulator path never imports
SGLang."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from sglang_hybrid.selection.sps import SpsTable, roofline_sps_table
from sglang_hybrid.sim.dspark_planner import DSparkPlanner


def _random_table(rng, max_tokens):
    probes = np.unique(np.concatenate([[1], rng.integers(2, max_tokens, size=12)]))
    t = 1.0 + np.cumsum(rng.uniform(0.0, 0.3, size=probes.size))
    return SpsTable(tuple(int(p) for p in probes), tuple(float(x) for x in 300.0 / t), int(max_tokens), "random")


@pytest.mark.parametrize("bs,gamma", [(1, 7), (4, 7), (13, 3), (32, 7), (128, 7)])
def test_planner_equals_sglang(bs, gamma):
    from sglang.kernels.ops.speculative.dspark.dspark_schedule import schedule_verify_lens_topk
    from sglang.srt.speculative.dspark_components.dspark_planner import (
        DSparkScheduleConfig,
        compute_verify_token_budget,
    )
    from sglang.srt.speculative.dspark_components.dspark_sps import SpsCostTable

    rng = np.random.default_rng(bs * 31 + gamma)
    cfg = DSparkScheduleConfig(gamma=gamma)
    for trial in range(8):
        table = roofline_sps_table() if trial == 0 else _random_table(rng, bs * (gamma + 1) + 2)
        theirs_table = SpsCostTable(sample_batch_tokens=list(table.sample_batch_tokens),
                                    sample_steps_per_sec=list(table.sample_steps_per_sec),
                                    max_batch_tokens=table.max_batch_tokens)
        conf = rng.uniform(0.0, 1.0, size=(bs, gamma))
        if trial % 2:
            conf = np.round(conf * 4) / 4  # ties
        if trial == 3:
            conf[:, -1] = 0.0  # below survival_eps
        conf = torch.tensor(conf, dtype=torch.float32)
        surv = torch.cumprod(conf, 1)
        ours = DSparkPlanner(gamma, table)
        k = ours.budget(surv)
        assert k == compute_verify_token_budget(history_survival_probs=surv, sps_table=theirs_table, cfg=cfg).budget
        for budget in sorted({0, 1, k, bs, bs * gamma // 2, bs * gamma, bs * gamma + 3}):
            assert torch.equal(ours.verify_lens(conf, budget),
                               schedule_verify_lens_topk(confidence=conf, budget=budget, cfg=cfg))


def test_simulator_path_imports_no_sglang():
    code = ("import sys\n"
            "from sglang_hybrid.sim import simulate_cli, runner, report, policies\n"
            "from sglang_hybrid.sim.runner import SimOptions, make_policy, load_sps\n"
            "opts = SimOptions(batch_size=4)\n"
            "for name in ('dspark', 'ngram', 'hybrid'):\n"
            "    make_policy(name, opts, load_sps(None))\n"
            "bad = sorted(m for m in sys.modules if m == 'sglang' or m.startswith('sglang.'))\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True)
