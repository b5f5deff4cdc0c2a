"""Tiny Qwen2-architecture policies built from a config, and save/load that also serves real checkpoints.

A CPU run trains a :class:`transformers.Qwen2ForCausalLM` built from a :class:`TinyModelConfig` preset;
a GPU run loads a real Qwen checkpoint with :func:`load_policy`. Both go through the same class, so
everything downstream (log-probs, rollout, update) is one code path.

Presets (vocabulary of 512 tokens, tied embeddings; ``tests/test_models_factory.py`` checks the counts):

========= ====== ====== ===== ======== ====== ==========
preset    hidden layers heads kv heads ffn    parameters
========= ====== ====== ===== ======== ====== ==========
``nano``  64     4      4     2        256    0.28 M
``tiny``  128    5      4     2        384    1.05 M
``small`` 256    6      8     4        512    3.67 M
``base``  384    8      6     2        1024   12.8 M      (GPU runs: ``experiments/configs/gpu``)
``medium`` 512   12     8     4        1536   38.0 M      (GPU runs)
========= ====== ====== ===== ======== ====== ==========

``base`` and ``medium`` are the GPU presets (10-50 M parameters, 12x and 36x ``tiny``): on one GPU, HF
generation of models this small is bound by kernel launches, not arithmetic (measured for
``tiny`` on one H200), so they should cost little more per step than ``tiny`` there (not yet measured on a GPU).
"""
from __future__ import annotations

import dataclasses
import logging
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Literal

import torch
from safetensors import SafetensorError
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from drmas.checkpoints import write_manifest
from drmas.io import WriteFailed, atomic_folder
from drmas.models.tokenizer import is_drmas_tokenizer, is_drmas_tokenizer_folder, load_tokenizer, save_tokenizer

logger = logging.getLogger(__name__)

AttnImplementation = Literal["sdpa", "eager"]


@dataclass(frozen=True)
class TinyModelConfig:
    """Shape of a small Qwen2-architecture decoder."""

    hidden_size: int = 64
    """Width of the residual stream."""
    num_layers: int = 4
    """Number of decoder blocks."""
    num_heads: int = 4
    """Query heads per attention layer; ``hidden_size`` must be a multiple."""
    num_kv_heads: int = 2
    """Key/value heads (grouped-query attention); must divide ``num_heads``."""
    intermediate_size: int = 256
    """Width of the SwiGLU feed-forward layer."""
    max_position_embeddings: int = 2048
    """Longest prompt + response the model is meant for (RoPE itself has no hard limit)."""
    rope_theta: float = 10_000.0
    """RoPE base; Qwen2.5 uses 1e6 for 32k contexts, 1e4 is enough for short CPU sequences."""
    tie_word_embeddings: bool = True
    """Share the input embedding and the output projection (as the small Qwen2.5 models do)."""
    vocab_size: int | None = None
    """Vocabulary size; ``None`` = taken from the tokenizer by :func:`build_policy`."""
    attn_implementation: AttnImplementation = "sdpa"
    """Attention kernel: ``sdpa`` (PyTorch fused) or ``eager`` (reference)."""

    def __post_init__(self) -> None:
        if min(self.hidden_size, self.num_layers, self.num_heads, self.num_kv_heads, self.intermediate_size) < 1:
            raise ValueError(f"all sizes must be >= 1, got {self}")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size={self.hidden_size} is not a multiple of num_heads={self.num_heads}; "
                             f"pick num_heads dividing hidden_size")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_kv_heads={self.num_kv_heads} must divide num_heads={self.num_heads}")
        if self.attn_implementation not in ("sdpa", "eager"):
            raise ValueError(f"attn_implementation={self.attn_implementation!r}; use 'sdpa' or 'eager'")


MODEL_PRESETS: dict[str, TinyModelConfig] = {
    "nano": TinyModelConfig(hidden_size=64, num_layers=4, num_heads=4, num_kv_heads=2, intermediate_size=256),
    "tiny": TinyModelConfig(hidden_size=128, num_layers=5, num_heads=4, num_kv_heads=2, intermediate_size=384),
    "small": TinyModelConfig(hidden_size=256, num_layers=6, num_heads=8, num_kv_heads=4, intermediate_size=512),
    "base": TinyModelConfig(hidden_size=384, num_layers=8, num_heads=6, num_kv_heads=2, intermediate_size=1024),
    "medium": TinyModelConfig(hidden_size=512, num_layers=12, num_heads=8, num_kv_heads=4, intermediate_size=1536),
}


def model_preset(name: str) -> TinyModelConfig:
    """The registered :class:`TinyModelConfig` called ``name``."""
    if name not in MODEL_PRESETS:
        raise ValueError(f"unknown model preset {name!r}; registered: {sorted(MODEL_PRESETS)}")
    return MODEL_PRESETS[name]


def qwen2_config(cfg: TinyModelConfig, tokenizer: PreTrainedTokenizerBase) -> Qwen2Config:
    """The ``Qwen2Config`` of ``cfg``; the vocabulary and special-token ids come from ``tokenizer``."""
    vocab_size = cfg.vocab_size if cfg.vocab_size is not None else len(tokenizer)
    if vocab_size < len(tokenizer):
        raise ValueError(f"vocab_size={vocab_size} is smaller than the tokenizer ({len(tokenizer)} tokens); "
                         f"leave vocab_size=None to take it from the tokenizer")
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
        tie_word_embeddings=cfg.tie_word_embeddings,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        use_cache=True,
    )
    config._attn_implementation = cfg.attn_implementation
    return config


def build_policy(cfg: TinyModelConfig | str, tokenizer: PreTrainedTokenizerBase, seed: int) -> Qwen2ForCausalLM:
    """A freshly initialized float32 ``Qwen2ForCausalLM`` (deterministic given ``seed``), in train mode."""
    if isinstance(cfg, str):
        cfg = model_preset(cfg)
    config = qwen2_config(cfg, tokenizer)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.to(torch.float32)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.train()
    logger.info("built Qwen2 policy: %s, %.3f M parameters", dataclasses.asdict(cfg), count_parameters(model) / 1e6)
    return model


def count_parameters(model: torch.nn.Module) -> int:
    """Number of distinct parameters (tied weights counted once)."""
    return sum(p.numel() for p in model.parameters())


@contextmanager
def written_folder(folder: Path) -> Iterator[Path]:
    """:func:`drmas.io.atomic_folder` for a checkpoint or tokenizer folder: a write that fails (a full disk;
    safetensors reports it as its own error) is one :class:`WriteFailed` naming ``folder`` and saying what was
    kept (the temporary folder is removed)."""
    try:
        with atomic_folder(folder) as tmp:
            yield tmp
    except (OSError, SafetensorError) as exc:
        if isinstance(exc, WriteFailed):
            raise
        cause = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc).splitlines()[0]
        kept = "the previous one is unchanged" if folder.exists() else "nothing was written there"
        raise WriteFailed(f"{folder}: the checkpoint could not be written ({cause}); {kept} (the temporary folder is "
                          "removed); free space and run the same command again", getattr(exc, "errno", None)) from None


def save_policy(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, folder: str | Path,
                built_by: dict | None = None, extra_files: dict[str, str] | None = None) -> Path:
    """Write model (safetensors + config + generation config), tokenizer, ``extra_files`` (name -> text, e.g. a
    model card) and sha256 manifest (``drmas.checkpoints``, with ``built_by`` when given: what built it) to
    ``folder`` atomically.

    Everything goes to a temporary sibling folder that is renamed onto ``folder`` at the end
    (:func:`drmas.io.atomic_folder`), so a reader never sees a half-written checkpoint; an existing
    ``folder`` is replaced.
    """
    folder = Path(folder)
    with written_folder(folder) as tmp:
        model.save_pretrained(str(tmp), safe_serialization=True)
        if is_drmas_tokenizer(tokenizer):
            save_tokenizer(tokenizer, tmp)
        else:
            tokenizer.save_pretrained(str(tmp))
        for name, text in (extra_files or {}).items():
            (tmp / name).write_text(text)
        write_manifest(tmp, **({"built_by": built_by} if built_by else {}))
    return folder


def llama_equivalent(model: Qwen2ForCausalLM) -> LlamaForCausalLM:
    """The same function as the Qwen2 ``model``, as a ``LlamaForCausalLM``: Qwen2 is Llama with biases on the
    query, key and value projections, which Llama's ``attention_bias`` adds together with one on the output
    projection, set here to zero. Every weight is copied (``tests/test_export.py``: equal logits).

    Why: ``AutoTokenizer`` on a folder whose config says ``qwen2`` always builds ``Qwen2Tokenizer``, whose NFC
    normalizer drmas's tokenizer does not have (:mod:`drmas.models.tokenizer`); beside a Llama config it reads
    ``tokenizer.json`` as written. Sliding-window attention (not used by the presets) has no Llama form."""
    c = model.config
    if getattr(c, "use_sliding_window", False):
        raise ValueError("a Qwen2 model with sliding-window attention has no Llama equivalent")
    config = LlamaConfig(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
        num_key_value_heads=c.num_key_value_heads, head_dim=c.hidden_size // c.num_attention_heads,
        hidden_act=c.hidden_act, max_position_embeddings=c.max_position_embeddings, rms_norm_eps=c.rms_norm_eps,
        rope_parameters=c.rope_parameters, tie_word_embeddings=c.tie_word_embeddings, attention_bias=True,
        mlp_bias=False, attention_dropout=c.attention_dropout, eos_token_id=c.eos_token_id,
        pad_token_id=c.pad_token_id, bos_token_id=c.bos_token_id, use_cache=True)
    config._attn_implementation = c._attn_implementation
    weights = dict(model.state_dict())
    for i in range(c.num_hidden_layers):
        weights[f"model.layers.{i}.self_attn.o_proj.bias"] = torch.zeros(c.hidden_size, dtype=model.dtype)
    llama = LlamaForCausalLM(config).to(dtype=model.dtype, device=model.device)
    llama.load_state_dict(weights, strict=True)
    llama.generation_config = model.generation_config
    return llama.train(model.training)


def load_policy(
    path_or_dir: str | Path, dtype: torch.dtype = torch.float32, attn_implementation: AttnImplementation = "sdpa",
    device: torch.device | str = "cpu", trust_remote_code: bool = False,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a policy saved by :func:`save_policy` or a real checkpoint (a folder or a hub name; any
    causal-LM architecture transformers knows, e.g. Qwen2.5/Qwen3/Llama-3.2 for the paper runs), its
    weights on ``device``.

    The tokenizer comes from :func:`~drmas.models.tokenizer.load_tokenizer` when the folder carries the
    drmas marker, else from ``AutoTokenizer`` (real checkpoints). A checkpoint's own Python code (a hub model
    or tokenizer class) runs only with ``trust_remote_code`` (``models.<key>.trust_remote_code``). Returned in
    train mode.
    """
    model = AutoModelForCausalLM.from_pretrained(str(path_or_dir), dtype=dtype, attn_implementation=attn_implementation,
                                                 trust_remote_code=trust_remote_code)
    model.to(device)
    if Path(path_or_dir).is_dir() and is_drmas_tokenizer_folder(path_or_dir):
        tokenizer = load_tokenizer(path_or_dir)
    else:
        tokenizer = AutoTokenizer.from_pretrained(str(path_or_dir), trust_remote_code=trust_remote_code)
    model.train()
    return model, tokenizer
