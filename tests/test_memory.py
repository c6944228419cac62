"""memory.py: the device memory HYBRID_SPARK's state holds, by part (the workers log it at start-up and report
``device_bytes``)."""

import logging

import torch

from sglang_hybrid.config import HybridConfig
from sglang_hybrid.memory import device_bytes, summary, tensors_added
from sglang_hybrid.penalties import PenaltyTable
from sglang_hybrid.sglang_plugin.common import report_device_memory
from sglang_hybrid.step import HybridStep

GAMMA = 4


class _Holder:  # an object of this package's kind is followed; see test_only_this_packages_objects_are_followed
    __module__ = "sglang_hybrid.test_holder"

    def __init__(self, **kw):
        self.__dict__.update(kw)


def test_a_storage_counts_once_whatever_views_and_containers_reach_it():
    big = torch.zeros(100, 10)  # 4,000 bytes
    other = torch.zeros(7, dtype=torch.int64)  # 56
    holder = _Holder(a=big, b=big[3:], c={"x": [big.view(-1), (other,)]}, d=None, e="text", f=3)
    holder.me = holder  # a cycle
    assert device_bytes({"h": holder}, "cpu") == {"h": 4056, "total": 4056}


def test_a_part_shared_with_an_earlier_one_counts_in_the_first():
    t = torch.zeros(50)
    got = device_bytes({"first": _Holder(t=t), "second": (t, torch.zeros(2))}, "cpu")
    assert got == {"first": 200, "second": 8, "total": 208}


def test_only_this_packages_objects_are_followed_and_other_devices_are_not_counted():
    class Foreign:  # SGLang's objects (a model runner, a batch) are not ours to count
        def __init__(self):
            self.t = torch.zeros(1000)

    meta = torch.zeros(10, device="meta")
    got = device_bytes({"p": [Foreign(), meta, torch.nn.Linear(100, 100)]}, "cpu")
    assert got["total"] == 0


def test_a_workers_buffers_are_the_tensors_it_gained_since_the_snapshot():
    host_tensor = torch.zeros(3)
    worker = _Holder(host_tensor=host_tensor, step=_Holder(t=torch.zeros(9)))  # what the host set up before
    own = set(vars(worker))
    worker.buf = torch.zeros(4)
    worker.mask = torch.ones(2, dtype=torch.bool)
    worker.fn, worker.penalties, worker.none = len, _Holder(t=torch.zeros(5)), None  # not plain tensors: not here
    worker.host_tensor = torch.zeros(6)  # reassigned, but the attribute was there before the snapshot
    got = tensors_added(worker, own)
    assert [id(t) for t in got] == [id(worker.buf), id(worker.mask)]
    assert device_bytes({"worker buffers": got}, "cpu")["total"] == 4 * 4 + 2


def test_the_token_history_and_the_corpus_hold_what_the_readme_says():
    """The README's costs: the history ``slots x width x 4`` bytes (plus a few per-slot counters), the corpus 16
    bytes per entry, the penalty table ``(rows + 1) x vocab x 5`` bytes (plus per-row parameters)."""
    slots, width, entries, rows, vocab = 32, 4096, 1 << 14, 8, 5000
    step = HybridStep(HybridConfig(corpus="shared", corpus_entries=entries), num_slots=slots, width=width,
                      gamma=GAMMA, max_bs=8, device="cpu")
    pen = PenaltyTable(slots, vocab, rows, "cpu")
    got = device_bytes(step.device_parts(penalties=pen), "cpu")
    assert tuple(step.history.tokens.shape) == (slots, width)
    # the rows, plus per-slot lengths and the per-batch lookup buffers
    assert slots * width * 4 < got["token history"] <= slots * width * 4 + 64 * 1024
    assert 16 * entries <= got["corpus"] <= 16 * entries + 64 * 1024
    assert (rows + 1) * vocab * 5 <= got["penalties"] <= (rows + 1) * vocab * 5 + slots * 8 + (rows + 1) * 32
    assert got["online calibration"] > 0 and got["fairness"] == 0  # fairness off: nothing
    assert got["the rest of the step"] > 0
    assert got["total"] == sum(v for k, v in got.items() if k != "total")
    text = summary(got, {"token history": "32 slots"})
    assert text.startswith(f"{got['total'] / 2**20:.1f} MiB: token history") and "(32 slots)" in text
    assert "fairness" not in text  # parts holding nothing are left out


def _decode(step, g, sizes):
    for bs in sizes:
        slots = torch.randperm(8, generator=g)[:bs]
        prompt = torch.randint(10, 40, (bs, 24), generator=g, dtype=torch.int32)
        step.on_prefill(slots, prompt, torch.full((bs,), 24, dtype=torch.int32),
                        torch.randint(10, 40, (bs,), generator=g, dtype=torch.int32))
        for _ in range(3):
            prop = step.propose(slots, torch.randint(10, 40, (bs, GAMMA), generator=g, dtype=torch.int32))
            committed = torch.randint(10, 40, (bs, step.width + 1), generator=g, dtype=torch.int32)
            step.record(slots, prop, committed, torch.randint(1, 3, (bs,), generator=g, dtype=torch.int32))


def test_decode_steps_keep_the_state_the_report_counted(caplog):
    """The state is allocated at start-up: decode steps add only a few bytes per batch size the first time they
    meet it (a budget scalar, a cached weight: what the GPU warm-up creates before the report), and nothing after
    that. The workers' report (log line, metrics) carries the figure."""
    step = HybridStep(HybridConfig(corpus="shared", corpus_entries=1 << 12), num_slots=8, width=256, gamma=GAMMA,
                      max_bs=8, device="cpu")
    with caplog.at_level(logging.INFO, logger="sglang_hybrid"):
        start = report_device_memory(step)
    assert "HYBRID_SPARK holds" in caplog.text and "8 request slots x" in caplog.text
    assert step.metrics()["device_bytes"] == start["total"] > 0
    assert step.metrics()["device_bytes_history"] == start["token history"]
    g = torch.Generator().manual_seed(0)
    sizes = (1, 3, 8, 2)
    _decode(step, g, sizes)
    seen = device_bytes(step.device_parts(), "cpu")
    assert 0 <= seen["total"] - start["total"] <= 16 * len(sizes)
    _decode(step, g, sizes + sizes)
    assert device_bytes(step.device_parts(), "cpu") == seen


def test_the_planning_script_prints_each_configuration_by_part(capsys):
    """``scripts/device_memory.py``: one table row per ``slots x history`` pair, by part."""
    from tests.script_loader import load_script

    script = load_script("device_memory")
    assert script.main(["--configs", "16x16384,32x16384", "--vocab", "100", "--corpus-entries", "1024",
                        "--penalty-rows", "2", "--fairness-scope", "tenant"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header[0] == "slots x history" and header[-1] == "total (MiB)" and "penalties (MiB)" in header
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]
    assert [r[0] for r in rows] == ["16 x 16384", "32 x 16384"]
    hist = header.index("token history (MiB)")
    assert float(rows[0][hist]) == 1.0 and float(rows[1][hist]) == 2.0  # slots x 16384 x 4 B
    assert "fairness (MiB)" in header
