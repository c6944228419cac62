"""The shipped default table, and the ``hybrid-spark calibrate`` command end to end (text and model sources)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from sglang_hybrid.calibration import DEFAULT_TABLE_PATH, CalibrationTable
from sglang_hybrid.calibration.cli import main
from sglang_hybrid.calibration.corpus import stdlib_root
from sglang_hybrid.calibration.fit import check_monotone
from sglang_hybrid.ngram import NgramConfig

DIRECTION = {"increasing": 1, "decreasing": -1}


def test_shipped_default_loads_covers_and_is_sane():
    t = CalibrationTable.load_default(NgramConfig())
    assert t.source == str(DEFAULT_TABLE_PATH)
    t.check_covers(NgramConfig(n_min=3, n_max=6, max_draft=7))
    assert np.all((t.q >= 0) & (t.q <= 1)) and np.all(np.isfinite(t.q))
    assert not t.has_agree
    assert t.fit["source"] == "text" and t.fit["ngram"] == {"n_min": 2, "n_max": 8, "max_draft": 16, "window": 0}
    assert t.trials is not None and t.trials.sum() == t.fit["trials"] > 1_000_000
    for view in ("q", "survival"):
        assert 0 < t.heldout[view]["ece"] < 0.02
        assert t.heldout[view]["auc"] > 0.7
    # the survival of a long match starting a chain is well above that of a short one
    def first(n: int) -> float:
        return float(t.lookup(np.array(n), np.array(1), np.array(1), np.array(0)))

    assert first(8) > first(2) + 0.3


def test_shipped_default_is_monotone_as_declared():
    t = CalibrationTable.load_default()
    declared = {k: DIRECTION[v] for k, v in t.fit["monotone"].items()}
    assert declared["match_len"] == 1
    assert check_monotone(t, declared) == []
    assert np.all(np.diff(t.q, axis=0) >= 0)  # longer matches are never predicted worse


def _small_corpus(tmp_path):
    d = tmp_path / "corpus"
    d.mkdir()
    for name in ("textwrap.py", "shlex.py", "colorsys.py", "bisect.py", "heapq.py", "fnmatch.py"):
        shutil.copy(stdlib_root() / name, d / name)
    (d / "notes.txt").write_text("Calibration notes. " * 40 + "\n" + "The n-gram drafter copies text. " * 20)
    return d


def test_cli_small_fit_is_deterministic(tmp_path, capsys):
    corpus = _small_corpus(tmp_path)
    args = ["--corpus", str(corpus), "--seed", "1", "--max-doc-tokens", "1024", "--heldout-frac", "0.3"]
    assert main(args + ["--out", str(tmp_path / "a.json"), "--plot", str(tmp_path / "a.png")]) == 0
    out = capsys.readouterr().out
    assert "survival  ECE" in out and "AUC" in out
    assert (tmp_path / "a.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from sglang_hybrid.cli import main as hybrid_main  # the `hybrid-spark calibrate` entry point

    assert hybrid_main(["calibrate"] + args + ["--out", str(tmp_path / "b.json")]) == 0
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    t = CalibrationTable.load(tmp_path / "a.json", NgramConfig())
    assert t.fit["corpus"] == str(corpus) and t.fit["holdout"]["heldout_drafts"] > 0
    # another seed gives another split
    assert main(args[:2] + ["--seed", "2", "--max-doc-tokens", "1024", "--out", str(tmp_path / "c.json")]) == 0
    assert (tmp_path / "c.json").read_bytes() != (tmp_path / "a.json").read_bytes()


def test_cli_errors(tmp_path, capsys):
    assert main(["--source", "model"]) == 2
    assert "--model" in capsys.readouterr().err
    assert main(["--corpus", str(tmp_path / "missing"), "--out", str(tmp_path / "x.json")]) == 2
    assert "missing" in capsys.readouterr().err
    assert main(["--window", "4", "--corpus", str(_small_corpus(tmp_path)), "--out", str(tmp_path / "x.json")]) == 2
    assert "--replay history" in capsys.readouterr().err


def test_cli_model_source_with_a_tiny_llama(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    from transformers import LlamaConfig, LlamaForCausalLM

    from sglang_hybrid.tokenizer import DEFAULT_VOCAB_SIZE

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=DEFAULT_VOCAB_SIZE, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                      bos_token_id=0, eos_token_id=0, pad_token_id=0)
    model_dir = tmp_path / "tiny-llama"
    LlamaForCausalLM(cfg).save_pretrained(model_dir)
    corpus = _small_corpus(tmp_path)
    out = tmp_path / "model.json"
    rc = main(["--source", "model", "--model", str(model_dir), "--draft-model", str(model_dir),
               "--corpus", str(corpus), "--prompt-tokens", "64", "--max-new-tokens", "48", "--batch-size", "4",
               "--heldout-frac", "0.3", "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    t = CalibrationTable.load(out, NgramConfig())
    assert t.has_agree  # a draft model was given: the 'agree' feature is fit
    assert t.fit["source"] == "model" and t.fit["target"] == "greedy continuations of tiny-llama"
    assert t.fit["generation"]["max_new_tokens"] == 48 and t.fit["draft_model"] == "tiny-llama"
    assert t.trials.sum() > 0
    obj = json.loads(out.read_text())
    assert [f["name"] for f in obj["features"]][-1] == "agree"
    # The corpus's table from the same model's continuations (the model generates once more; no draft model).
    rc = main(["--candidate", "corpus", "--source", "model", "--model", str(model_dir), "--corpus", str(corpus),
               "--prompt-tokens", "64", "--max-new-tokens", "48", "--batch-size", "4", "--max-draft", "8",
               "--out", str(tmp_path / "corpus.json")])
    assert rc == 0, capsys.readouterr().err
    from sglang_hybrid.calibration.corpus_table import CorpusTable

    ct = CorpusTable.load(tmp_path / "corpus.json")
    assert ct.fit_meta["source"] == "model" and ct.fit_meta["generation"]["max_new_tokens"] == 48
    assert ct.max_draft == 8 and ct.fit_meta["drafts"] > 0


def _requests_file(tmp_path, n=24):
    """Edit-like served requests: the output copies most of the prompt's code with a change in the middle."""
    rng = np.random.default_rng(3)
    lines = [f"    value_{i} = compute(item_{i}, scale={i % 7})" for i in range(60)]
    recs = []
    for k in range(n):
        old = "\n".join(lines[k: k + 30])
        cut = int(rng.integers(5, 25))
        new = "\n".join(lines[k: k + cut] + [f"    extra_{k} = None"] + lines[k + cut: k + 30])
        recs.append({"id": f"r{k}", "kind": "code-edit", "prompt": f"Edit this:\n{old}\n", "output": new})
    f = tmp_path / "requests.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return f


def test_request_documents_keep_their_prompt_output_split(tmp_path):
    from sglang_hybrid.calibration.corpus import request_documents
    from sglang_hybrid.calibration.sources import request_token_docs
    from sglang_hybrid.tokenizer import load_tokenizer

    docs = request_documents(_requests_file(tmp_path, n=3))
    assert [d.name for d in docs] == ["requests.jsonl:r0", "requests.jsonl:r1", "requests.jsonl:r2"]
    tok = load_tokenizer()
    seqs, plens = request_token_docs(docs, tok)
    for d, s, p in zip(docs, seqs, plens):
        assert s[:p].tolist() == tok.encode(d.prompt, add_special_tokens=False).ids
        assert s[p:].tolist() == tok.encode(d.text, add_special_tokens=False).ids
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a", "output": "b"}\n{"prompt": "a"}\n')
    with pytest.raises(ValueError, match="bad.jsonl:2: a request needs string fields"):
        request_documents(bad)
    bad.write_text('{"prompt": "a", "output": "b"}\nnot json\n')
    with pytest.raises(ValueError, match="bad.jsonl:2: not valid JSON"):
        request_documents(bad)


def test_cli_fits_on_served_requests_mixed_with_text(tmp_path, capsys):
    reqs = _requests_file(tmp_path)
    corpus = _small_corpus(tmp_path)
    base = ["--seed", "1", "--max-doc-tokens", "1024", "--heldout-frac", "0.3"]
    assert main(["--corpus", str(corpus)] + base + ["--out", str(tmp_path / "text.json")]) == 0
    assert main(["--corpus", str(corpus), str(reqs)] + base + ["--out", str(tmp_path / "mixed.json")]) == 0
    capsys.readouterr()
    text = CalibrationTable.load(tmp_path / "text.json", NgramConfig())
    mixed = CalibrationTable.load(tmp_path / "mixed.json", NgramConfig())
    assert mixed.fit["corpus_requests"] == 24 and text.fit["corpus_requests"] == 0
    # The requests copy their prompts: in-prompt matches are predicted to survive longer once they are seen.
    assert mixed.fit["tokens"] > text.fit["tokens"]
    assert float(mixed.q[..., 1].mean()) > float(text.q[..., 1].mean())
    assert main(["--source", "model", "--model", str(tmp_path), "--corpus", str(reqs),
                 "--out", str(tmp_path / "x.json")]) == 2
    assert "use them with --source text" in capsys.readouterr().err
