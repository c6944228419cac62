"""A tiny DSpark draft for the tiny target (``tiny_models``), in the format SGLang 0.5.23's ``DSparkDraftModel``
loads (``sglang/srt/models/dspark.py``); random, seeded weights, built once into the tiny models' cache.

Facts it follows (measured in ``shared/design/dspark-on-cpu.md``):

- ``architectures=["DSparkDraftModel"]``, ``model_type="qwen3"``, one layer, one head of the target's hidden size,
  the target's vocabulary; ``block_size`` = gamma; ``num_target_layers`` = the target's layer count.
- ``dflash_config.target_layer_ids = [0]``: the 2-layer target captures "the input of layer id + 1", so only id 0
  is capturable. ``mask_token_id`` must lie below the target vocabulary (2 is the pad token).
- ``markov_rank`` and ``markov_head_type`` at the top level (``build_markov_head`` reads them there).
- ``enable_confidence_head``: the confidence head (``confidence_head.proj``, input ``hidden + rank``) is required
  by the ``cap-accept`` and ``compact`` verify modes.
- Weights: ``layers.0.*``, ``norm``, ``hidden_norm``, ``fc`` [H, H x len(target_layer_ids)], the Markov head's
  ``markov_w1`` / ``markov_w2`` [V, rank] and the confidence head. Embeddings and LM head come from the target.

The drafter proposes mostly wrong tokens (random weights): it accepts about a third of its first tokens. Its
confidence head is set to say so (bias -0.8: confidences around sigmoid(-0.8) ~ 0.31, varying with the hidden
state), as a calibrated head would; the n-gram chain is what makes long accepts on repeating prompts, as with the
other tiny drafters.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile

import torch

MARKOV_RANK = 8
BUILDER_VERSION = 2  # part of the directory name: bump on any change of the weights or the config
CONFIDENCE_BIAS = -0.8


def build_tiny_dspark(models, gamma: int = 3, confidence: bool = True, vocab_size: int | None = None) -> str:
    """Path of the tiny DSpark draft for ``models`` (a ``TinyModels``); built on first use, atomically.

    ``vocab_size`` (default: the target's) lets a test build a draft whose vocabulary differs from the target's.
    """
    spec = models.spec
    vocab = spec.vocab_size if vocab_size is None else int(vocab_size)
    name = f"dspark{BUILDER_VERSION}-g{gamma}-c{int(confidence)}" + ("" if vocab_size is None else f"-v{vocab}")
    out = os.path.join(models.root, name)
    if os.path.isfile(os.path.join(out, "DONE")):
        return out
    tmp = tempfile.mkdtemp(prefix="dspark-build-", dir=models.root)
    try:
        _write(tmp, models, gamma, confidence, vocab)
        with open(os.path.join(tmp, "DONE"), "w") as f:
            f.write(name)
        try:
            os.rename(tmp, out)
        except OSError:  # another process built it first; its copy is identical
            if not os.path.isfile(os.path.join(out, "DONE")):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _write(out: str, models, gamma: int, confidence: bool, vocab: int) -> None:
    from safetensors.torch import save_file

    spec = models.spec
    h, f = spec.hidden_size, spec.intermediate_size
    cfg = {
        "architectures": ["DSparkDraftModel"],
        "model_type": "qwen3",
        "hidden_size": h,
        "intermediate_size": f,
        "num_hidden_layers": 1,
        "num_attention_heads": 1,
        "num_key_value_heads": 1,
        "head_dim": h,
        "vocab_size": vocab,
        "rms_norm_eps": spec.rms_norm_eps,
        "max_position_embeddings": spec.max_position_embeddings,
        "rope_theta": spec.rope_theta,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "block_size": gamma,
        "num_target_layers": spec.num_layers,
        "dflash_config": {"target_layer_ids": [0], "mask_token_id": 2, "block_size": gamma},
        "dspark_config": {"markov_rank": MARKOV_RANK, "markov_head_type": "vanilla"},
        "enable_confidence_head": confidence,
        "markov_rank": MARKOV_RANK,
        "markov_head_type": "vanilla",
    }
    with open(os.path.join(out, "config.json"), "w") as fh:
        json.dump(cfg, fh, indent=2, sort_keys=True)
    for name in os.listdir(models.tokenizer):
        shutil.copy(os.path.join(models.tokenizer, name), os.path.join(out, name))
    g = torch.Generator().manual_seed(spec.seed + 7 + gamma)

    def r(*shape: int, std: float = 0.05) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * std).contiguous()

    w = {
        "fc.weight": r(h, h),
        "hidden_norm.weight": torch.ones(h),
        "norm.weight": torch.ones(h),
        "markov_head.markov_w1.weight": r(vocab, MARKOV_RANK, std=0.5),
        "markov_head.markov_w2.weight": r(vocab, MARKOV_RANK, std=0.5),
        "layers.0.input_layernorm.weight": torch.ones(h),
        "layers.0.post_attention_layernorm.weight": torch.ones(h),
        "layers.0.self_attn.q_proj.weight": r(h, h),
        "layers.0.self_attn.k_proj.weight": r(h, h),
        "layers.0.self_attn.v_proj.weight": r(h, h),
        "layers.0.self_attn.o_proj.weight": r(h, h),
        "layers.0.self_attn.q_norm.weight": torch.ones(h),
        "layers.0.self_attn.k_norm.weight": torch.ones(h),
        "layers.0.mlp.gate_proj.weight": r(f, h),
        "layers.0.mlp.up_proj.weight": r(f, h),
        "layers.0.mlp.down_proj.weight": r(h, f),
    }
    if confidence:
        w["confidence_head.proj.weight"] = r(1, h + MARKOV_RANK, std=0.5)
        w["confidence_head.proj.bias"] = torch.full((1,), CONFIDENCE_BIAS)
    save_file(w, os.path.join(out, "model.safetensors"))
