"""Built-in real models (transformers configs, nothing downloaded) and user factories, as Workloads:
a model, a fixed synthetic batch and a training step, ready for `trace` and `apply_schedule`."""

from __future__ import annotations

import importlib
import inspect
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from memsched.errors import MemschedError, UserCodeError, one_line

log = logging.getLogger(__name__)

BUILTIN_MODELS = (
    "gpt2",
    "gpt2-medium",
    "bert-base",
    "bert-large",
    "vit-base",
    "vit-large",
    "resnet50",
    "llama",
    "qwen2",
    "mistral",
)

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
"""The parameter dtypes a built-in workload can be built in (`--dtype`); the trace's `dtype` field names it."""


AUTOCAST: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp16": torch.float16}
"""The autocast dtypes a workload's forward can run under (`--autocast`)."""


def parse_autocast(name: str, device: str | torch.device = "cpu") -> torch.dtype:
    """'bf16' | 'fp16' (also 'bfloat16', 'float16') -> the autocast dtype on `device`; MemschedError for another
    name, and for fp16 on the CPU: most CPUs have no float16 arithmetic (it is emulated, slower than float32),
    and a float16 step needs a loss scaler the built-in step does not run."""
    key = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16"}.get(name, name)
    if key not in AUTOCAST:
        raise MemschedError(f"--autocast {name!r} is not supported; use one of {', '.join(AUTOCAST)}")
    if key == "fp16" and torch.device(device).type == "cpu":
        raise MemschedError(
            "--autocast fp16 on the CPU is not supported: CPUs have no fast float16 arithmetic and a float16 step "
            "needs loss scaling; use --autocast bf16 on the CPU (fp16 is for --device cuda)"
        )
    return AUTOCAST[key]


def compile_blocks(model: nn.Module, layers: Sequence[str] | None = None) -> int:
    """Compile each traced layer on its own (`block.compile()`, the torchtitan pattern: the model's own code
    calls the compiled blocks eagerly, so the tracer and the replay see each block's saved tensors as they are
    saved). `layers`: the layer patterns (default: the repeated blocks). Returns how many were compiled.
    MemschedError, with the fix, when torch cannot compile on this machine (checked on a one-line function
    first, so the failure is one line and not a traceback at the first step)."""
    from memsched.runtime.layers import find_layers

    check_compiler()
    found = find_layers(model, layers)
    for _, m in found:
        m.compile()
    return len(found)


def check_compiler() -> None:
    """MemschedError naming the cause and the fix when `torch.compile` cannot build kernels here (a Python
    Dynamo does not support, no C++ compiler for Inductor's CPU kernels)."""
    import torch._dynamo

    try:
        torch._dynamo.is_dynamo_supported()  # raises on a Python version it does not support
    except RuntimeError as e:
        raise MemschedError(f"--compile: torch.compile does not run here ({e}); drop --compile") from None

    def probe(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x * 2 + 1)

    try:
        # (Not reset afterwards: torch._dynamo.reset() would drop every compiled graph in the process.)
        torch.compile(probe)(torch.ones(8))
    except Exception as e:  # noqa: BLE001 - any failure of the compiler stack means the same thing here
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise MemschedError(
            f"--compile: torch.compile cannot build kernels on this machine ({type(e).__name__}: {first}); install "
            "a C++ compiler (g++) for Inductor, or drop --compile"
        ) from None


def parse_dtype(name: str) -> torch.dtype:
    """'float32' | 'bfloat16' | 'float16' (also 'fp32', 'bf16', 'fp16') -> torch.dtype; MemschedError otherwise."""
    key = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}.get(name, name)
    if key not in DTYPES:
        raise MemschedError(f"--dtype {name!r} is not supported; use one of {', '.join(DTYPES)}")
    return DTYPES[key]


@dataclass
class Workload:
    """A model plus what one training step feeds it."""

    model: nn.Module
    """The model, in training mode, on its device."""
    model_id: str
    """Identifier written into the trace, e.g. 'gpt2' or 'gpt2-small4'."""
    batch: dict[str, torch.Tensor]
    """Keyword inputs of one step (fixed, so every step does the same work), including labels."""
    batch_size: int
    """Batch size."""
    seq_len: int | None
    """Sequence length (None for image models)."""
    optimizer: torch.optim.Optimizer | None = None
    """The optimizer the step uses (its state is static memory)."""
    loss_fn: Callable[[Any], torch.Tensor] = field(default=lambda out: out.loss)
    """Turns the model's output into the scalar loss."""
    autocast: torch.dtype | None = None
    """The forward runs under `torch.autocast(device, dtype=autocast)` (mixed precision: float32 parameters,
    low-precision copies of weights and activations saved for the backward); None: no autocast."""

    def loss(self, model: Callable[..., Any] | None = None) -> torch.Tensor:
        """Forward one batch through `model` (default: the workload's model) and return the loss (the forward
        under autocast when `autocast` is set; the loss is computed as the model computes it, inside)."""
        if self.autocast is None:
            return self.loss_fn((model or self.model)(**self.batch))
        p = next(self.model.parameters(), None)
        device = p.device.type if p is not None else "cpu"
        with torch.autocast(device, dtype=self.autocast):
            return self.loss_fn((model or self.model)(**self.batch))

    def backward(self, model: Callable[..., Any] | None = None) -> torch.Tensor:
        """Forward and backward without the optimizer step (what gradient comparisons need)."""
        loss = self.loss(model)
        loss.backward()
        return loss.detach()

    def step(self, model: Callable[..., Any] | None = None) -> torch.Tensor:
        """One training step: zero grads, forward, backward, optimizer step.

        Gradients are zeroed in place, not freed (`set_to_none=False`): their buffers stay allocated across
        steps, as DDP's gradient buckets and FSDP's sharded gradients do, which is what the cost model's
        static gradient bytes describe. (A loop that frees them holds less in its forward than predicted.)"""
        if self.optimizer is not None:
            self.optimizer.zero_grad(set_to_none=False)
        loss = self.backward(model)
        if self.optimizer is not None:
            self.optimizer.step()
        return loss


def _tokens(gen: torch.Generator, vocab: int, batch: int, seq: int, device: torch.device) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, seq), generator=gen).to(device)


@dataclass
class _Built:
    """A built-in model with its fixed batch."""

    model: nn.Module
    batch: dict[str, torch.Tensor]
    seq_len: int | None


_LABELS: dict[str, Any] = {"num_labels": 10}
"""A classification head of 10 classes for the image models."""


def _gpt2(
    name: str, small: bool, layers: int | None, batch: int, seq: int, p: float | None, gen: Any, dev: Any
) -> _Built:
    import transformers as tf

    depth, width, heads = (12, 768, 12) if name == "gpt2" else (24, 1024, 16)
    vocab = 50257
    if small:
        depth, width, heads, vocab = 4, 64, 4, 1024
    kw: dict[str, Any] = {} if p is None else {"resid_pdrop": p, "embd_pdrop": p, "attn_pdrop": p}
    cfg = tf.GPT2Config(
        n_layer=layers or depth,
        n_embd=width,
        n_head=heads,
        vocab_size=vocab,
        n_positions=max(seq, 128 if small else 1024),
        bos_token_id=vocab - 1,
        eos_token_id=vocab - 1,
        use_cache=False,
        **kw,
    )
    model = tf.GPT2LMHeadModel(cfg)
    ids = _tokens(gen, vocab, batch, seq, dev)
    return _Built(model, {"input_ids": ids, "labels": ids}, seq)


def _bert(
    name: str, small: bool, layers: int | None, batch: int, seq: int, p: float | None, gen: Any, dev: Any
) -> _Built:
    import transformers as tf

    depth, width, heads, inter = (12, 768, 12, 3072) if name == "bert-base" else (24, 1024, 16, 4096)
    vocab = 30522
    if small:
        depth, width, heads, inter, vocab = 4, 64, 4, 256, 1024
    kw: dict[str, Any] = {} if p is None else {"hidden_dropout_prob": p, "attention_probs_dropout_prob": p}
    cfg = tf.BertConfig(
        num_hidden_layers=layers or depth,
        hidden_size=width,
        num_attention_heads=heads,
        intermediate_size=inter,
        vocab_size=vocab,
        max_position_embeddings=max(seq, 512),
        **kw,
    )
    model = tf.BertForMaskedLM(cfg)
    ids = _tokens(gen, vocab, batch, seq, dev)
    return _Built(model, {"input_ids": ids, "labels": ids}, seq)


@dataclass(frozen=True)
class _DecoderShape:
    """The full-size config of a built-in decoder, taken from the published model it is shaped like."""

    like: str
    """The published model whose config.json these numbers are (nothing is downloaded)."""
    layers: int
    """num_hidden_layers."""
    width: int
    """hidden_size."""
    inter: int
    """intermediate_size (the SwiGLU MLP's)."""
    heads: int
    """num_attention_heads."""
    kv_heads: int
    """num_key_value_heads (grouped-query attention)."""
    vocab: int
    """vocab_size."""
    tied: bool
    """tie_word_embeddings: the LM head shares the embedding matrix."""
    rope: dict[str, Any]
    """rope_parameters (theta, and Llama 3's frequency scaling)."""
    max_positions: int
    """max_position_embeddings."""
    eps: float
    """rms_norm_eps."""


_DECODERS: dict[str, _DecoderShape] = {
    "llama": _DecoderShape(
        "meta-llama/Llama-3.2-1B",
        16,
        2048,
        8192,
        32,
        8,
        128256,
        True,
        {
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        131072,
        1e-5,
    ),
    "qwen2": _DecoderShape(
        "Qwen/Qwen2.5-0.5B",
        24,
        896,
        4864,
        14,
        2,
        151936,
        True,
        {"rope_type": "default", "rope_theta": 1000000.0},
        32768,
        1e-6,
    ),
    "mistral": _DecoderShape(
        "mistralai/Mistral-7B-v0.3",
        32,
        4096,
        14336,
        32,
        8,
        32768,
        False,
        {"rope_type": "default", "rope_theta": 1000000.0},
        32768,
        1e-5,
    ),
}
"""llama, qwen2, mistral at full size. `--small` keeps each one's kind of config (grouped-query attention,
tied or untied head, its RoPE parameters, use_cache=True) at hidden size 64."""


def decoder_config(
    name: str, small: bool = False, layers: int | None = None, seq: int = 128, p: float | None = None
) -> Any:
    """The transformers config of built-in decoder `name` (llama | qwen2 | mistral), as `builtin_workload` builds
    it; `small` is the CPU size, `layers` overrides the depth, `p` the attention dropout."""
    import transformers as tf

    s = _DECODERS[name]
    depth, width, inter, heads, kv, vocab = s.layers, s.width, s.inter, s.heads, s.kv_heads, s.vocab
    if small:
        depth, width, inter, heads, kv, vocab = 4, 64, 176, 4, 2, 1024
    config_cls = {"llama": tf.LlamaConfig, "qwen2": tf.Qwen2Config, "mistral": tf.MistralConfig}[name]
    # Everything else is the config class's default, as a user's from_pretrained config would leave it:
    # use_cache=True (the replay switches it off for training forwards, and says so), no dropout.
    kw: dict[str, Any] = {} if p is None else {"attention_dropout": p}
    return config_cls(
        num_hidden_layers=layers or depth,
        hidden_size=width,
        intermediate_size=inter,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        vocab_size=vocab,
        tie_word_embeddings=s.tied,
        rope_parameters=dict(s.rope),
        max_position_embeddings=max(seq, s.max_positions),
        rms_norm_eps=s.eps,
        **kw,
    )


def decoder_class(name: str) -> type[nn.Module]:
    """The causal-LM class of built-in decoder `name`."""
    import transformers as tf

    cls: type[nn.Module] = {
        "llama": tf.LlamaForCausalLM,
        "qwen2": tf.Qwen2ForCausalLM,
        "mistral": tf.MistralForCausalLM,
    }[name]
    return cls


def _decoder(
    name: str, small: bool, layers: int | None, batch: int, seq: int, p: float | None, gen: Any, dev: Any
) -> _Built:
    cfg = decoder_config(name, small, layers, seq, p)
    model = decoder_class(name)(cfg)
    ids = _tokens(gen, cfg.vocab_size, batch, seq, dev)
    return _Built(model, {"input_ids": ids, "labels": ids}, seq)


def _vit(
    name: str, small: bool, layers: int | None, batch: int, p: float | None, gen: Any, dev: Any, dt: torch.dtype
) -> _Built:
    import transformers as tf

    depth, width, heads, inter = (12, 768, 12, 3072) if name == "vit-base" else (24, 1024, 16, 4096)
    image, patch = 224, 16
    if small:
        depth, width, heads, inter, image, patch = 4, 64, 4, 256, 32, 8
    kw: dict[str, Any] = {} if p is None else {"hidden_dropout_prob": p, "attention_probs_dropout_prob": p}
    cfg = tf.ViTConfig(
        num_hidden_layers=layers or depth,
        hidden_size=width,
        num_attention_heads=heads,
        intermediate_size=inter,
        image_size=image,
        patch_size=patch,
        **kw,
        **_LABELS,
    )
    model = tf.ViTForImageClassification(cfg)
    pixels = torch.randn(batch, 3, image, image, generator=gen).to(dev, dt)
    labels = torch.randint(0, 10, (batch,), generator=gen).to(dev)
    return _Built(model, {"pixel_values": pixels, "labels": labels}, (image // patch) ** 2 + 1)


def _resnet(small: bool, layers: int | None, batch: int, gen: Any, dev: Any, dt: torch.dtype) -> _Built:
    import transformers as tf

    depths, hidden, emb, image = [3, 4, 6, 3], [256, 512, 1024, 2048], 64, 224
    if small:
        depths, hidden, emb, image = [1, 1, 1, 1], [32, 64, 128, 256], 16, 64
    if layers is not None:
        if layers < 4:
            raise MemschedError(f"resnet50 has four stages: --layers must be >= 4, got {layers}")
        depths = [layers // 4 + (1 if k < layers % 4 else 0) for k in range(4)]
    cfg = tf.ResNetConfig(depths=depths, hidden_sizes=hidden, embedding_size=emb, layer_type="bottleneck", **_LABELS)
    model = tf.ResNetForImageClassification(cfg)
    pixels = torch.randn(batch, 3, image, image, generator=gen).to(dev, dt)
    labels = torch.randint(0, 10, (batch,), generator=gen).to(dev)
    return _Built(model, {"pixel_values": pixels, "labels": labels}, None)


def builtin_workload(
    name: str,
    *,
    batch_size: int = 2,
    seq_len: int = 128,
    num_layers: int | None = None,
    small: bool = False,
    device: str | torch.device = "cpu",
    dropout: float | None = None,
    seed: int = 0,
    optimizer: str = "adamw",
    dtype: str | torch.dtype = "float32",
    compile: bool = False,
    autocast: str | None = None,
) -> Workload:
    """A transformers model built from its config (random weights, no download).

    small: a narrow version (hidden size 64) for CPU tests and demos; num_layers overrides the depth
    (for resnet50, the number of bottleneck layers, spread over the four stages). llama, qwen2 and mistral are
    shaped like Llama-3.2-1B, Qwen2.5-0.5B and Mistral-7B-v0.3 (`_DECODERS`), with their configs' defaults.
    dropout None keeps the config's default (0.1 for the transformers, which is what RNG-preserving recompute
    must survive; 0 for the decoders' attention).
    dtype: the parameters' (and image inputs') dtype, float32 | bfloat16 | float16. The whole model is cast
    (pure low-precision training, as memory-bound runs do; the optimizer state follows the parameters), so
    every saved activation has that dtype too and the trace's `dtype` field says it.
    compile: each block compiled on its own (`compile_blocks`). autocast: 'bf16' | 'fp16', the forward under
    autocast (`Workload.autocast`; fp16 only on CUDA). Both are part of the model id (`+compile`,
    `+autocast-bf16`), so a trace taken one way is not replayed the other way unnoticed.
    """
    try:
        import transformers  # noqa: F401
    except ModuleNotFoundError as e:  # pragma: no cover - transformers is a runtime dependency
        raise MemschedError("built-in models need transformers: pip install 'memsched[runtime]'") from e
    if batch_size < 1 or seq_len < 1:
        raise MemschedError(f"batch size and sequence length must be >= 1 (got {batch_size}, {seq_len})")
    if num_layers is not None and num_layers < 1:
        raise MemschedError(f"--layers must be >= 1, got {num_layers}")
    if dropout is not None and not 0.0 <= dropout < 1.0:  # NaN fails too
        raise MemschedError(f"--dropout must be a probability from 0 up to (not including) 1, got {dropout}")
    dt = dtype if isinstance(dtype, torch.dtype) else parse_dtype(dtype)
    dev = torch.device(device)
    amp = parse_autocast(autocast, dev) if autocast is not None else None
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    if name in ("gpt2", "gpt2-medium"):
        built = _gpt2(name, small, num_layers, batch_size, seq_len, dropout, gen, dev)
    elif name in ("bert-base", "bert-large"):
        built = _bert(name, small, num_layers, batch_size, seq_len, dropout, gen, dev)
    elif name in ("vit-base", "vit-large"):
        built = _vit(name, small, num_layers, batch_size, dropout, gen, dev, dt)
    elif name == "resnet50":
        built = _resnet(small, num_layers, batch_size, gen, dev, dt)
    elif name in _DECODERS:
        built = _decoder(name, small, num_layers, batch_size, seq_len, dropout, gen, dev)
    else:
        raise MemschedError(f"unknown model {name!r}; use one of {', '.join(BUILTIN_MODELS)} or package.module:factory")
    model = built.model
    nn.Module.to(model, dev, dt).train()
    suffix = f"-small{num_layers or ''}" if small else (f"-{num_layers}l" if num_layers else "")
    if compile:
        compile_blocks(model)
        suffix += "+compile"
    if amp is not None:
        suffix += "+autocast-" + {torch.bfloat16: "bf16", torch.float16: "fp16"}[amp]
    opt = _optimizer(model, optimizer)
    return Workload(model, f"{name}{suffix}", built.batch, batch_size, built.seq_len, opt, autocast=amp)


def _optimizer(model: nn.Module, kind: str) -> torch.optim.Optimizer | None:
    if kind == "none":
        return None
    if kind == "adamw":
        return torch.optim.AdamW(model.parameters(), lr=1e-4)
    if kind == "sgd":
        return torch.optim.SGD(model.parameters(), lr=1e-3)
    raise MemschedError(f"unknown optimizer {kind!r}; use adamw, sgd or none")


FACTORY_FLAGS: dict[str, str] = {
    "batch_size": "--batch-size",
    "seq_len": "--seq-len",
    "num_layers": "--layers",
    "small": "--small",
    "device": "--device",
    "dropout": "--dropout",
    "optimizer": "--optimizer",
    "dtype": "--dtype",
    "compile": "--compile",
    "autocast": "--autocast",
}
"""The factory arguments the CLI can pass, and the flag that sets each (for the errors)."""


def _given(name: str, value: Any) -> bool:
    """Whether a workload argument was asked for. None is 'not given' (the factory's own default wins);
    `small=False` and float32 ask for nothing either: a factory that takes neither builds what it builds."""
    if value is None:
        return False
    if name in ("small", "compile"):
        return bool(value)
    if name == "dtype":
        return value not in ("float32", torch.float32)
    return True


def load_factory(spec: str, *, strict: bool = False, **kwargs: Any) -> Workload:
    """Call `package.module:factory` (the contract: docs/factory.md). It returns a Workload; of the keyword
    arguments (batch_size, seq_len, num_layers, small, device, dropout, optimizer, dtype, compile, autocast),
    those given (not None) are passed on. One the factory does not declare is an error naming the flag (`strict`, what
    `memsched trace` does), else a warning: never silently dropped. Arguments not given are not passed, so
    the factory's own defaults win."""
    mod_name, sep, attr = spec.partition(":")
    if not sep or not mod_name or not attr:
        raise MemschedError(f"model {spec!r}: write a factory as package.module:function")
    try:
        mod = importlib.import_module(mod_name)
    except ImportError as e:
        raise MemschedError(f"model {spec!r}: cannot import {mod_name!r} ({e}); check PYTHONPATH") from None
    factory = getattr(mod, attr, None)
    if not callable(factory):
        raise MemschedError(f"model {spec!r}: {mod_name} has no callable {attr!r}")
    params = inspect.signature(factory).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    dtype = kwargs.get("dtype")
    if _given("dtype", dtype) and "dtype" not in params and not takes_any:
        # A dtype the factory cannot honour would be a silent float32 run named otherwise.
        raise MemschedError(f"model {spec!r}: --dtype {dtype} needs a factory that takes a `dtype` argument")
    given = {k: v for k, v in kwargs.items() if _given(k, v)}
    refused = [k for k in given if k not in params and not takes_any]
    if refused:
        flags = ", ".join(
            FACTORY_FLAGS.get(k, k) + ("" if k in ("small", "compile") else f" {given[k]}") for k in refused
        )
        args = ", ".join(f"`{k}`" for k in refused)
        msg = (
            f"model {spec!r}: {attr}() takes no {args} argument, so {flags} would be ignored; drop the flag, "
            f"or add the argument to the factory (docs/factory.md)"
        )
        if strict:
            raise MemschedError(msg)
        log.warning("%s", msg)
    try:
        out = factory(**{k: v for k, v in given.items() if k not in refused})
    except MemschedError:
        raise
    except Exception as e:
        # The user's own code: its error and where to look, not an internal error of memsched's.
        raise UserCodeError(
            f"model {spec!r}: the factory {attr}() raised {type(e).__name__}: {one_line(e)}; fix the factory "
            "(calling it alone shows the traceback; docs/factory.md)"
        ) from e
    if not isinstance(out, Workload):
        raise MemschedError(
            f"model {spec!r}: the factory returned {type(out).__name__}; return a memsched.runtime.Workload "
            "(model, batch of keyword inputs, batch_size, seq_len)"
        )
    return out


_UNUSED_BY = {
    "vit-base": ("seq_len",),
    "vit-large": ("seq_len",),
    "resnet50": ("seq_len", "dropout"),
}
"""The flags each built-in model has no use for (`workload`)."""


def workload(name: str, *, strict: bool = False, **kwargs: Any) -> Workload:
    """A built-in model by name, or a `package.module:factory` (`load_factory`). Arguments that are None
    take the built-in's defaults, or the factory's own."""
    if ":" in name:
        return load_factory(name, strict=strict, **kwargs)
    given = {k: v for k, v in kwargs.items() if v is not None}
    unused = [k for k in _UNUSED_BY.get(name, ()) if k in given]
    if unused and strict:
        # As a factory's flags (load_factory): a flag the user gave that the model cannot use is refused, not
        # dropped in silence. (Not strict: the caller passes what a trace records, such as a ViT's patch count.)
        flags = ", ".join(f"{FACTORY_FLAGS.get(k, k)} {given[k]}" for k in unused)
        raise MemschedError(
            f"model {name!r} does not use {flags} (an image model has no sequence; ResNet-50 no dropout); drop it"
        )
    return builtin_workload(name, **{k: v for k, v in given.items() if k not in unused})
