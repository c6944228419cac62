"""Tiny offline models for running the real SGLang engine on a CPU: built deterministically, cached on disk.

``build_tiny_models()`` returns the paths of
- a byte-level BPE tokenizer (vocabulary 512) trained with ``tokenizers`` on a fixed in-code corpus, saved as an
  HF tokenizer directory (its files are also copied next to every model);
- ``target``: a tiny ``LlamaForCausalLM`` (hidden 64, 2 layers, ONE attention head of dimension 64: SGLang's
  Triton attention kernels run under the Triton interpreter on CPU, one program per (request, head), so every
  extra head multiplies the cost) saved with ``save_pretrained`` (safetensors);
- ``standalone``: a smaller (1-layer) ``LlamaForCausalLM`` for ``STANDALONE``: the target's embeddings, first
  layer, final norm and LM head;
- ``eagle3``: an EAGLE-3 draft head in the format of SGLang's ``LlamaForCausalLMEagle3``
  (``sglang/srt/models/llama_eagle3.py``): ``config.json`` with ``architectures=["LlamaForCausalLMEagle3"]``,
  ``draft_vocab_size`` and ``eagle_config.eagle_aux_hidden_state_layer_ids = [-1, 0]`` (SGLang captures the
  input of layer ``id + 1``: here the embeddings and layer 0's output; its default ``[2, L // 2, L - 3]``,
  ``sglang/srt/models/llama.py: set_eagle3_layers_to_capture``, does not fit a 2-layer target); weights ``fc.weight``,
  ``midlayer.*`` (legacy name of ``layers.0``), ``norm.weight``, ``lm_head.weight`` (embeddings are shared
  with the target at load time).

The weights are random but structured so that the drafters are useful and imperfect: every target layer adds
only a scaled-down update (``layer_scale``) to the residual stream, so the target is close to a bigram model
``lm_head(norm(embed(x)))``; the 1-layer standalone draft misses the second layer's update; the EAGLE-3 head is
built to predict that bigram of its input token at every draft step (see ``_eagle3_weights``). Logits have a
standard deviation of about ``logit_scale`` so greedy decisions have clear margins.

Models are cached under ``$SGLANG_HYBRID_TEST_CACHE`` (default ``~/.cache/sglang_hybrid_tests``) in a directory
named by a hash of the builder's parameters and of this file's source, and built atomically (temp dir + rename).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from typing import Dict, List, Optional

import torch

BUILDER_VERSION = 3

BOS, EOS, PAD = "<|bos|>", "<|eos|>", "<|pad|>"

_CORPUS = """\
The quick brown fox jumps over the lazy dog while the cat sleeps on the warm mat.
Speculative decoding drafts several tokens cheaply and verifies them with the target model in one pass.
A model-free drafter copies spans of the prompt; a model-based drafter proposes tokens from its own network.
def add(a, b):
    return a + b

def scale(values, factor):
    return [v * factor for v in values]

class Counter:
    def __init__(self):
        self.count = 0

    def step(self, n=1):
        self.count += n
        return self.count

for i in range(10):
    print(i, add(i, i), scale([i, i + 1], 2))
Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30.
Edit the file, keep the rest of it unchanged, and return the whole file with the change applied.
It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of foolishness.
import os, sys, json
with open("data.json") as f:
    data = json.load(f)
if data and "key" in data:
    value = data["key"]
else:
    value = None
"""


@dataclass(frozen=True)
class TinySpec:
    """Parameters of the tiny models (all of them enter the cache key)."""

    vocab_size: int = 512
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 1
    num_kv_heads: int = 1
    intermediate_size: int = 128
    max_position_embeddings: int = 1024
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    layer_scale: float = 0.15
    logit_scale: float = 3.0
    eagle_qk_gain: float = 3.0
    eagle_aux_layer_ids: tuple = (-1, 0)
    seed: int = 0

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    def key(self) -> str:
        with open(os.path.abspath(__file__), "rb") as f:  # any edit of the builder invalidates the cache
            source = hashlib.sha256(f.read()).hexdigest()
        blob = json.dumps(
            {"spec": dataclasses.asdict(self), "version": BUILDER_VERSION, "source": source}, sort_keys=True
        )
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class TinyModels:
    """Paths of the built models (every directory also holds the tokenizer files)."""

    root: str
    tokenizer: str
    target: str
    standalone: str
    eagle3: str
    spec: TinySpec


def default_cache_dir() -> str:
    """``$SGLANG_HYBRID_TEST_CACHE`` or ``~/.cache/sglang_hybrid_tests``."""
    return os.environ.get("SGLANG_HYBRID_TEST_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "sglang_hybrid_tests"
    )


def build_tiny_models(cache_dir: Optional[str] = None, spec: TinySpec = TinySpec()) -> TinyModels:
    """Build (or reuse from the cache) the tokenizer, target, standalone draft and EAGLE-3 head."""
    cache_dir = cache_dir or default_cache_dir()
    root = os.path.join(cache_dir, f"tiny-{spec.key()}")
    if not os.path.isfile(os.path.join(root, "DONE")):
        os.makedirs(cache_dir, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix="tiny-build-", dir=cache_dir)
        try:
            _build_all(tmp, spec)
            with open(os.path.join(tmp, "DONE"), "w") as f:
                f.write(spec.key())
            try:
                os.rename(tmp, root)
            except OSError:  # another process won the race; its copy is identical
                if not os.path.isfile(os.path.join(root, "DONE")):
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return TinyModels(
        root=root,
        tokenizer=os.path.join(root, "tokenizer"),
        target=os.path.join(root, "target"),
        standalone=os.path.join(root, "standalone"),
        eagle3=os.path.join(root, "eagle3"),
        spec=spec,
    )


# ------------------------------------------------------------------------------------------------------------


def _build_tokenizer(out_dir: str, spec: TinySpec) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        special_tokens=[BOS, EOS, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS.splitlines(keepends=True) * 4, trainer=trainer)
    if tok.get_vocab_size() != spec.vocab_size:
        raise RuntimeError(f"tokenizer vocabulary is {tok.get_vocab_size()}, expected {spec.vocab_size}")
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD)
    fast.save_pretrained(out_dir)


def _llama_config(spec: TinySpec, num_layers: int):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=spec.max_position_embeddings,
        rms_norm_eps=spec.rms_norm_eps,
        rope_theta=spec.rope_theta,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=2,
        torch_dtype="float32",
    )


def _target_weights(spec: TinySpec) -> Dict[str, torch.Tensor]:
    """Explicit, seeded weights (independent of transformers' initialisers)."""
    g = torch.Generator().manual_seed(spec.seed)
    h, f, hd = spec.hidden_size, spec.intermediate_size, spec.head_dim
    q_out, kv_out = spec.num_heads * hd, spec.num_kv_heads * hd

    def randn(*shape: int, std: float) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * std

    w: Dict[str, torch.Tensor] = {"model.embed_tokens.weight": randn(spec.vocab_size, h, std=1.0)}
    for i in range(spec.num_layers):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = torch.ones(h)
        w[p + "post_attention_layernorm.weight"] = torch.ones(h)
        w[p + "self_attn.q_proj.weight"] = randn(q_out, h, std=h**-0.5)
        w[p + "self_attn.k_proj.weight"] = randn(kv_out, h, std=h**-0.5)
        w[p + "self_attn.v_proj.weight"] = randn(kv_out, h, std=h**-0.5)
        w[p + "self_attn.o_proj.weight"] = randn(h, q_out, std=spec.layer_scale * q_out**-0.5)
        w[p + "mlp.gate_proj.weight"] = randn(f, h, std=h**-0.5)
        w[p + "mlp.up_proj.weight"] = randn(f, h, std=h**-0.5)
        w[p + "mlp.down_proj.weight"] = randn(h, f, std=2.0 * spec.layer_scale * f**-0.5)
    w["model.norm.weight"] = torch.ones(h)
    w["lm_head.weight"] = randn(spec.vocab_size, h, std=spec.logit_scale * h**-0.5)
    return w


def _save_llama(out_dir: str, spec: TinySpec, weights: Dict[str, torch.Tensor], num_layers: int) -> None:
    from transformers import LlamaForCausalLM

    config = _llama_config(spec, num_layers)
    model = LlamaForCausalLM(config).to(torch.float32)
    missing, unexpected = model.load_state_dict(weights, strict=False)
    missing = [m for m in missing if "rotary_emb" not in m]
    if missing or unexpected:
        raise RuntimeError(f"tiny llama weights mismatch: missing={missing} unexpected={unexpected}")
    model.save_pretrained(out_dir, safe_serialization=True)


def _eagle3_weights(spec: TinySpec, target: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """An EAGLE-3 head that predicts ``lm_head(norm(embed(x)))`` for its input token ``x`` (the bigram the
    target is close to), at every draft step.

    The input layer sees ``[e ; hidden_norm(h_in)]`` (``e`` the normalised embedding, ``h_in`` the incoming hidden
    state, which is also the residual). q and k read ``e`` with a large gain, so each position attends almost only
    to itself; v is ``e - hidden_norm(h_in)`` and o_proj the identity, so the layer output is
    ``e - hidden_norm(h_in) + h_in``. With ``fc = 0`` the first step (``h_in = fc(aux) = 0``) gives ``e``, and every
    later step (``h_in`` = the previous step's ``e'``, already of unit RMS) gives ``e - e' + e' = e`` again. The MLP
    adds a small random perturbation, so the head is good but not exact."""
    g = torch.Generator().manual_seed(spec.seed + 1)
    h, f, hd = spec.hidden_size, spec.intermediate_size, spec.head_dim
    n_aux = len(spec.eagle_aux_layer_ids)
    eye_embed_half = torch.cat([torch.eye(h), torch.zeros(h, h)], dim=1)  # [h, 2h]: pick the embedding half
    embed_minus_hidden = torch.cat([torch.eye(h), -torch.eye(h)], dim=1)  # [h, 2h]: e - hidden_norm(h_in)
    if spec.num_heads * hd != h or spec.num_kv_heads != spec.num_heads:
        raise ValueError("the EAGLE-3 head assumes num_kv_heads == num_heads and num_heads * head_dim == hidden")
    gain = spec.eagle_qk_gain
    return {
        "fc.weight": torch.zeros(h, n_aux * h),
        "midlayer.input_layernorm.weight": torch.ones(h),
        "midlayer.hidden_norm.weight": torch.ones(h),
        "midlayer.post_attention_layernorm.weight": torch.ones(h),
        "midlayer.self_attn.q_proj.weight": gain * eye_embed_half,
        "midlayer.self_attn.k_proj.weight": gain * eye_embed_half,
        "midlayer.self_attn.v_proj.weight": embed_minus_hidden,
        "midlayer.self_attn.o_proj.weight": torch.eye(h),
        "midlayer.mlp.gate_proj.weight": torch.randn(f, h, generator=g) * h**-0.5,
        "midlayer.mlp.up_proj.weight": torch.randn(f, h, generator=g) * h**-0.5,
        "midlayer.mlp.down_proj.weight": torch.randn(h, f, generator=g) * (0.1 * f**-0.5),
        "norm.weight": target["model.norm.weight"].clone(),
        "lm_head.weight": target["lm_head.weight"].clone(),
    }


def _save_eagle3(out_dir: str, spec: TinySpec, weights: Dict[str, torch.Tensor]) -> None:
    from safetensors.torch import save_file

    os.makedirs(out_dir, exist_ok=True)
    cfg = _llama_config(spec, 1).to_dict()
    cfg.update(
        architectures=["LlamaForCausalLMEagle3"],
        model_type="llama",
        draft_vocab_size=spec.vocab_size,
        target_hidden_size=spec.hidden_size,
        eagle_config={
            "eagle_aux_hidden_state_layer_ids": list(spec.eagle_aux_layer_ids),
            "use_aux_hidden_state": True,
        },
    )
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
    save_file({k: v.contiguous() for k, v in weights.items()}, os.path.join(out_dir, "model.safetensors"))


def _build_all(root: str, spec: TinySpec) -> None:
    torch_state = torch.random.get_rng_state()
    try:
        tok_dir = os.path.join(root, "tokenizer")
        _build_tokenizer(tok_dir, spec)
        target = _target_weights(spec)
        _save_llama(os.path.join(root, "target"), spec, target, spec.num_layers)
        draft = {
            k: v for k, v in target.items() if not k.startswith("model.layers.") or k.startswith("model.layers.0.")
        }
        _save_llama(os.path.join(root, "standalone"), spec, draft, 1)
        _save_eagle3(os.path.join(root, "eagle3"), spec, _eagle3_weights(spec, target))
        for sub in ("target", "standalone", "eagle3"):
            for name in os.listdir(tok_dir):
                shutil.copy(os.path.join(tok_dir, name), os.path.join(root, sub, name))
    finally:
        torch.random.set_rng_state(torch_state)


def load_tokenizer(models: TinyModels):
    """The tiny HF tokenizer (``PreTrainedTokenizerFast``)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(models.tokenizer)


def encode(models: TinyModels, texts: List[str]) -> List[List[int]]:
    """Token ids of each text (no special tokens added)."""
    tok = load_tokenizer(models)
    return [tok.encode(t, add_special_tokens=False) for t in texts]
