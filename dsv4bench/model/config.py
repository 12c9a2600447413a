"""Model configurations (docs/model-math.md §1): Flash, Pro and a tiny one with the real structure.

`ModelConfig` mirrors the reference `ModelArgs`; `to_hf()` / `from_hf()` convert to and from the
HF `config.json` keys of §1.1 (one table, `HF_KEYS`), so a checkpoint directory carries its own
configuration. Construction checks every field's type and value (a `ConfigError` names the
config.json key), so a bad config.json never reaches the model as a ZeroDivisionError or worse.

`tiny` keeps every code path of the real models at toy widths: a SWA-only layer, CSA (m=4) and
HCA (m=128) layers, hash-routed (layers < n_hash_layers) and bias-routed MoE layers, and the
SWA-only MTP block. The window (128) and the compression ratios are the real ones, so a
300-token generation crosses the CSA and HCA block boundaries several times.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any, Mapping

# Expert weight formats: the official MXFP4 (e2m1 packed in I8, ue8m0 scale per 32 along K) and
# NVIDIA's requantised NVFP4 (e2m1 packed in U8, e4m3 scale per 16 along K, fp32 global scale).
EXPERT_DTYPES = ("fp4", "nvfp4")


class ConfigError(ValueError):
    """A configuration that cannot be used; the message names the offending key."""


def is_int(v: Any) -> bool:
    """A JSON integer (a bool is not one)."""
    return isinstance(v, int) and not isinstance(v, bool)


def shown(v: Any) -> str:
    """A value as an error message shows it: its repr (cut) and its type, `'64' (str)`."""
    s = repr(v)
    return f"{s[:40]}... ({type(v).__name__})" if len(s) > 40 else f"{s} ({type(v).__name__})"


REQUIRED = object()
# field, its config.json key ("a.b" = key b of the object a), the default of an absent key
HF_KEYS: tuple[tuple[str, str, Any], ...] = (
    ("name", "dsv4bench_name", "checkpoint"),
    ("vocab_size", "vocab_size", REQUIRED),
    ("dim", "hidden_size", REQUIRED),
    ("n_layers", "num_hidden_layers", REQUIRED),
    ("n_heads", "num_attention_heads", REQUIRED),
    ("head_dim", "head_dim", REQUIRED),
    ("rope_head_dim", "qk_rope_head_dim", REQUIRED),
    ("q_lora_rank", "q_lora_rank", REQUIRED),
    ("o_groups", "o_groups", REQUIRED),
    ("o_lora_rank", "o_lora_rank", REQUIRED),
    ("window_size", "sliding_window", REQUIRED),
    ("compress_ratios", "compress_ratios", REQUIRED),
    ("index_n_heads", "index_n_heads", REQUIRED),
    ("index_head_dim", "index_head_dim", REQUIRED),
    ("index_topk", "index_topk", REQUIRED),
    ("n_routed_experts", "n_routed_experts", REQUIRED),
    ("n_activated_experts", "num_experts_per_tok", REQUIRED),
    ("moe_inter_dim", "moe_intermediate_size", REQUIRED),
    ("n_hash_layers", "num_hash_layers", REQUIRED),
    ("route_scale", "routed_scaling_factor", REQUIRED),
    ("n_shared_experts", "n_shared_experts", 1),
    ("n_mtp_layers", "num_nextn_predict_layers", 1),
    ("compress_rope_theta", "compress_rope_theta", 160000.0),
    ("rope_theta", "rope_theta", 10000.0),
    ("rope_factor", "rope_scaling.factor", 1.0),
    ("original_seq_len", "rope_scaling.original_max_position_embeddings", 0),
    ("beta_fast", "rope_scaling.beta_fast", 32),
    ("beta_slow", "rope_scaling.beta_slow", 1),
    ("swiglu_limit", "swiglu_limit", 10.0),
    ("hc_mult", "hc_mult", 4),
    ("hc_sinkhorn_iters", "hc_sinkhorn_iters", 20),
    ("hc_eps", "hc_eps", 1e-6),
    ("norm_eps", "rms_norm_eps", 1e-6),
    ("max_position_embeddings", "max_position_embeddings", 1048576),
    ("bos_token_id", "bos_token_id", 0),
    ("eos_token_id", "eos_token_id", 1),
    ("expert_dtype", "expert_dtype", "fp4"),
    ("score_func", "scoring_func", "sqrtsoftplus"),
)
HF_KEY = {f: key for f, key, _ in HF_KEYS}
# constant keys of the official config.json that no field carries
HF_CONSTANTS = {
    "architectures": ["DeepseekV4ForCausalLM"],
    "model_type": "deepseek_v4",
    "num_key_value_heads": 1,
    "norm_topk_prob": True,
    "topk_method": "noaux_tc",
    "tie_word_embeddings": False,
    "quantization_config": {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "scale_fmt": "ue8m0",
        "weight_block_size": [128, 128],
        "activation_scheme": "dynamic",
    },
    "torch_dtype": "bfloat16",
}
ROPE_SCALING_TYPE = "yarn"
# integer fields that may be 0 (every other integer field must be positive; floats positive, finite)
MAY_BE_ZERO = ("n_hash_layers", "n_mtp_layers", "original_seq_len", "bos_token_id", "eos_token_id")
# field annotation (a string: `from __future__ import annotations`) -> (type test, what a message asks for)
TYPES = {
    "int": (is_int, "an integer"),
    "float": (lambda v: is_int(v) or isinstance(v, float), "a number"),
    "str": (lambda v: isinstance(v, str), "a string"),
    "tuple[int, ...]": (lambda v: isinstance(v, (list, tuple)) and all(is_int(r) for r in v), "a list of integers"),
}


def label(field: str) -> str:
    """The config.json key of a field, with the field's name when it differs: `hidden_size (dim)`."""
    key = HF_KEY.get(field, field)
    return key if key == field else f"{key} ({field})"


@dataclass(frozen=True)
class ModelConfig:
    name: str
    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    head_dim: int
    rope_head_dim: int
    q_lora_rank: int
    o_groups: int
    o_lora_rank: int
    window_size: int
    compress_ratios: tuple[int, ...]  # n_layers + n_mtp_layers entries; 0 = SWA-only
    index_n_heads: int
    index_head_dim: int
    index_topk: int
    n_routed_experts: int
    n_activated_experts: int
    moe_inter_dim: int
    n_hash_layers: int
    route_scale: float
    n_shared_experts: int = 1
    n_mtp_layers: int = 1
    compress_rope_theta: float = 160000.0
    rope_theta: float = 10000.0
    rope_factor: float = 16.0
    original_seq_len: int = 65536
    beta_fast: int = 32
    beta_slow: int = 1
    swiglu_limit: float = 10.0
    hc_mult: int = 4
    hc_sinkhorn_iters: int = 20
    hc_eps: float = 1e-6
    norm_eps: float = 1e-6
    max_position_embeddings: int = 1048576
    bos_token_id: int = 0
    eos_token_id: int = 1
    expert_dtype: str = "fp4"
    score_func: str = "sqrtsoftplus"

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            ok, want = TYPES[f.type]
            if not ok(value):
                raise ConfigError(f"{label(f.name)} must be {want}, not {shown(value)}")
            if f.type == "float":
                object.__setattr__(self, f.name, float(value))
        object.__setattr__(self, "compress_ratios", tuple(self.compress_ratios))
        self.validate()

    # ---- structure -------------------------------------------------------------------------
    def ratio(self, layer: int) -> int:
        """Compression ratio of main layer `layer` (0..n_layers-1) or MTP block n_layers+k."""
        return self.compress_ratios[layer]

    def kind(self, layer: int) -> str:
        return {0: "swa", 4: "csa", 128: "hca"}[self.ratio(layer)]

    def is_hash(self, layer: int) -> bool:
        """Hash routing (tid2eid) for the first n_hash_layers main layers; MTP uses the bias."""
        return layer < self.n_hash_layers

    @property
    def hc_mix(self) -> int:
        """mHC mixes per sublayer: pre (hc) + post (hc) + comb (hc·hc)."""
        return (2 + self.hc_mult) * self.hc_mult

    @property
    def softmax_scale(self) -> float:
        return self.head_dim ** -0.5

    def validate(self) -> None:
        """Values and structure (the types are checked on construction)."""
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type == "int" and value < (0 if f.name in MAY_BE_ZERO else 1):
                raise ConfigError(f"{label(f.name)} must be {'>= 0' if f.name in MAY_BE_ZERO else '>= 1'}, "
                                  f"not {value}")
            if f.type == "float" and not (math.isfinite(value) and value > 0):
                raise ConfigError(f"{label(f.name)} must be a positive finite number, not {value}")
        for key in ("bos_token_id", "eos_token_id"):
            if getattr(self, key) >= self.vocab_size:
                raise ConfigError(f"{key}={getattr(self, key)} is not below vocab_size={self.vocab_size}")
        if self.score_func != "sqrtsoftplus":
            raise ConfigError(f"scoring_func={self.score_func!r} is not supported (sqrtsoftplus only)")
        if len(self.compress_ratios) != self.n_layers + self.n_mtp_layers:
            raise ConfigError(
                f"compress_ratios has {len(self.compress_ratios)} entries; expected "
                f"n_layers + n_mtp_layers = {self.n_layers + self.n_mtp_layers}"
            )
        bad = sorted({r for r in self.compress_ratios if r not in (0, 4, 128)})
        if bad:
            raise ConfigError(f"compress_ratios holds unsupported ratios {bad} (0, 4, 128 only)")
        if self.n_heads % self.o_groups:
            raise ConfigError(f"n_heads={self.n_heads} is not a multiple of o_groups={self.o_groups}")
        if not 0 < self.rope_head_dim <= min(self.head_dim, self.index_head_dim):
            raise ConfigError("rope_head_dim must fit in head_dim and index_head_dim")
        if self.expert_dtype not in EXPERT_DTYPES:
            raise ConfigError(f"expert_dtype={self.expert_dtype!r}; expected one of {EXPERT_DTYPES}")
        for key, mult in (("dim", 32), ("moe_inter_dim", 32)):
            if getattr(self, key) % mult:
                raise ConfigError(f"{key}={getattr(self, key)} must be a multiple of {mult} (FP4 blocks)")
        if self.n_shared_experts != 1:
            raise ConfigError("n_shared_experts must be 1 (as asserted by the reference)")
        if self.n_activated_experts > self.n_routed_experts:
            raise ConfigError("num_experts_per_tok exceeds n_routed_experts")

    # ---- HF config.json ----------------------------------------------------------------------
    def to_hf(self) -> dict:
        d = dict(HF_CONSTANTS)
        rope_scaling = {"type": ROPE_SCALING_TYPE}
        for f, key, _ in HF_KEYS:
            value = getattr(self, f)
            value = list(value) if isinstance(value, tuple) else value
            if key.startswith("rope_scaling."):
                rope_scaling[key.split(".", 1)[1]] = value
            else:
                d[key] = value
        d["rope_scaling"] = rope_scaling
        return d

    @classmethod
    def from_hf(cls, d: Mapping[str, Any], name: str | None = None) -> "ModelConfig":
        """From the keys of a config.json; a ConfigError names a missing or wrong key."""
        if not isinstance(d, Mapping):
            raise ConfigError(f"config.json must hold a JSON object, not {type(d).__name__}")
        kw = {}
        for f, key, default in HF_KEYS:
            *parents, leaf = key.split(".")
            obj = d
            for p in parents:  # an absent or null parent object: every key in it takes its default
                obj = obj.get(p)
                if obj is None:
                    obj = {}
                elif not isinstance(obj, Mapping):
                    raise ConfigError(f"{p} must be a JSON object or null, not {shown(obj)}")
            if leaf in obj:
                kw[f] = obj[leaf]
            elif default is REQUIRED:
                raise ConfigError(f"missing the key {key!r}")
            else:
                kw[f] = default
        if name:
            kw["name"] = name
        return cls(**kw)

    def with_(self, **changes: Any) -> "ModelConfig":
        return replace(self, **changes)

    def truncated(self, n_layers: int) -> "ModelConfig":
        """The first `n_layers` main layers (their compression ratios and hash routing as in the full
        model) and every MTP block: Flash at 4 layers holds SWA-only, CSA and HCA attention, hash- and
        score-routed MoE and the MTP head at the production widths."""
        if not 1 <= n_layers <= self.n_layers:
            raise ConfigError(f"--layers {n_layers}: {self.name} has 1..{self.n_layers} layers")
        ratios = self.compress_ratios[:n_layers] + self.compress_ratios[self.n_layers:]
        return self.with_(n_layers=n_layers, compress_ratios=ratios, n_hash_layers=min(self.n_hash_layers, n_layers))


FLASH = ModelConfig(
    name="flash",
    vocab_size=129280,
    dim=4096,
    n_layers=43,
    n_heads=64,
    head_dim=512,
    rope_head_dim=64,
    q_lora_rank=1024,
    o_groups=8,
    o_lora_rank=1024,
    window_size=128,
    compress_ratios=(0, 0) + (4, 128) * 20 + (4,) + (0,),
    index_n_heads=64,
    index_head_dim=128,
    index_topk=512,
    n_routed_experts=256,
    n_activated_experts=6,
    moe_inter_dim=2048,
    n_hash_layers=3,
    route_scale=1.5,
)

PRO = ModelConfig(
    name="pro",
    vocab_size=129280,
    dim=7168,
    n_layers=61,
    n_heads=128,
    head_dim=512,
    rope_head_dim=64,
    q_lora_rank=1536,
    o_groups=16,
    o_lora_rank=1024,
    window_size=128,
    compress_ratios=(128, 128) + (4, 128) * 29 + (4,) + (0,),
    index_n_heads=64,
    index_head_dim=128,
    index_topk=1024,
    n_routed_experts=384,
    n_activated_experts=6,
    moe_inter_dim=3072,
    n_hash_layers=3,
    route_scale=2.5,
)

# Layers: 0 SWA (hash), 1 CSA (hash), 2 HCA (bias), 3 CSA (bias); MTP block SWA (bias).
TINY = ModelConfig(
    name="tiny",
    vocab_size=512,
    dim=64,
    n_layers=4,
    n_heads=4,
    head_dim=128,
    rope_head_dim=64,
    q_lora_rank=64,
    o_groups=2,
    o_lora_rank=32,
    window_size=128,
    compress_ratios=(0, 4, 128, 4, 0),
    index_n_heads=16,  # enough heads that an all-ReLU-zero (tied) indexer score is improbable
    index_head_dim=128,
    index_topk=8,
    n_routed_experts=8,
    n_activated_experts=2,
    moe_inter_dim=32,
    n_hash_layers=2,
    route_scale=1.5,
    max_position_embeddings=4096,
)

CONFIGS: dict[str, ModelConfig] = {c.name: c for c in (TINY, FLASH, PRO)}


def get_config(name: str) -> ModelConfig:
    try:
        return CONFIGS[name]
    except KeyError:
        raise ConfigError(f"unknown config {name!r}; choose one of {', '.join(CONFIGS)}") from None
