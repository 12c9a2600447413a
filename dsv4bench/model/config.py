"""Model configurations (DSV4_SPEC.md §1): Flash, Pro and a tiny one with the real structure.

`ModelConfig` mirrors the reference `ModelArgs`; `to_hf()` / `from_hf()` convert to and from the
HF `config.json` keys of §1.1, so a checkpoint directory carries its own configuration.

`tiny` keeps every code path of the real models at toy widths: a SWA-only layer, CSA (m=4) and
HCA (m=128) layers, hash-routed (layers < n_hash_layers) and bias-routed MoE layers, and the
SWA-only MTP block. The window (128) and the compression ratios are the real ones, so a
300-token generation crosses the CSA and HCA block boundaries several times.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping

# Expert weight formats: the official MXFP4 (e2m1 packed in I8, ue8m0 scale per 32 along K) and
# NVIDIA's requantised NVFP4 (e2m1 packed in U8, e4m3 scale per 16 along K, fp32 global scale).
EXPERT_DTYPES = ("fp4", "nvfp4")


class ConfigError(ValueError):
    """A configuration that cannot be used; the message names the offending key."""


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
        object.__setattr__(self, "compress_ratios", tuple(int(r) for r in self.compress_ratios))
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
        return {
            "architectures": ["DeepseekV4ForCausalLM"],
            "model_type": "deepseek_v4",
            "dsv4bench_name": self.name,
            "vocab_size": self.vocab_size,
            "hidden_size": self.dim,
            "num_hidden_layers": self.n_layers,
            "num_attention_heads": self.n_heads,
            "num_key_value_heads": 1,
            "head_dim": self.head_dim,
            "qk_rope_head_dim": self.rope_head_dim,
            "q_lora_rank": self.q_lora_rank,
            "o_groups": self.o_groups,
            "o_lora_rank": self.o_lora_rank,
            "sliding_window": self.window_size,
            "compress_ratios": list(self.compress_ratios),
            "compress_rope_theta": self.compress_rope_theta,
            "rope_theta": self.rope_theta,
            "rope_scaling": {
                "type": "yarn",
                "factor": self.rope_factor,
                "original_max_position_embeddings": self.original_seq_len,
                "beta_fast": self.beta_fast,
                "beta_slow": self.beta_slow,
            },
            "max_position_embeddings": self.max_position_embeddings,
            "index_n_heads": self.index_n_heads,
            "index_head_dim": self.index_head_dim,
            "index_topk": self.index_topk,
            "n_routed_experts": self.n_routed_experts,
            "num_experts_per_tok": self.n_activated_experts,
            "n_shared_experts": self.n_shared_experts,
            "moe_intermediate_size": self.moe_inter_dim,
            "num_hash_layers": self.n_hash_layers,
            "scoring_func": self.score_func,
            "routed_scaling_factor": self.route_scale,
            "norm_topk_prob": True,
            "topk_method": "noaux_tc",
            "swiglu_limit": self.swiglu_limit,
            "hc_mult": self.hc_mult,
            "hc_sinkhorn_iters": self.hc_sinkhorn_iters,
            "hc_eps": self.hc_eps,
            "rms_norm_eps": self.norm_eps,
            "num_nextn_predict_layers": self.n_mtp_layers,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id,
            "tie_word_embeddings": False,
            "expert_dtype": self.expert_dtype,
            "quantization_config": {
                "quant_method": "fp8",
                "fmt": "e4m3",
                "scale_fmt": "ue8m0",
                "weight_block_size": [128, 128],
                "activation_scheme": "dynamic",
            },
            "torch_dtype": "bfloat16",
        }

    @classmethod
    def from_hf(cls, d: Mapping[str, Any], name: str | None = None) -> "ModelConfig":
        def get(key: str) -> Any:
            if key not in d:
                raise ConfigError(f"config.json is missing the key {key!r}")
            return d[key]

        rs = d.get("rope_scaling") or {}
        kw = dict(
            name=name or d.get("dsv4bench_name", "checkpoint"),
            vocab_size=get("vocab_size"),
            dim=get("hidden_size"),
            n_layers=get("num_hidden_layers"),
            n_heads=get("num_attention_heads"),
            head_dim=get("head_dim"),
            rope_head_dim=get("qk_rope_head_dim"),
            q_lora_rank=get("q_lora_rank"),
            o_groups=get("o_groups"),
            o_lora_rank=get("o_lora_rank"),
            window_size=get("sliding_window"),
            compress_ratios=get("compress_ratios"),
            index_n_heads=get("index_n_heads"),
            index_head_dim=get("index_head_dim"),
            index_topk=get("index_topk"),
            n_routed_experts=get("n_routed_experts"),
            n_activated_experts=get("num_experts_per_tok"),
            moe_inter_dim=get("moe_intermediate_size"),
            n_hash_layers=get("num_hash_layers"),
            route_scale=get("routed_scaling_factor"),
            n_shared_experts=d.get("n_shared_experts", 1),
            n_mtp_layers=d.get("num_nextn_predict_layers", 1),
            compress_rope_theta=d.get("compress_rope_theta", 160000.0),
            rope_theta=d.get("rope_theta", 10000.0),
            rope_factor=rs.get("factor", 1.0) if rs else 1.0,
            original_seq_len=rs.get("original_max_position_embeddings", 0) if rs else 0,
            beta_fast=rs.get("beta_fast", 32),
            beta_slow=rs.get("beta_slow", 1),
            swiglu_limit=d.get("swiglu_limit", 10.0),
            hc_mult=d.get("hc_mult", 4),
            hc_sinkhorn_iters=d.get("hc_sinkhorn_iters", 20),
            hc_eps=d.get("hc_eps", 1e-6),
            norm_eps=d.get("rms_norm_eps", 1e-6),
            max_position_embeddings=d.get("max_position_embeddings", 1048576),
            bos_token_id=d.get("bos_token_id", 0),
            eos_token_id=d.get("eos_token_id", 1),
            expert_dtype=d.get("expert_dtype", "fp4"),
            score_func=d.get("scoring_func", "sqrtsoftplus"),
        )
        if kw["score_func"] != "sqrtsoftplus":
            raise ConfigError(f"scoring_func={kw['score_func']!r} is not supported (sqrtsoftplus only)")
        return cls(**kw)

    def with_(self, **changes: Any) -> "ModelConfig":
        return replace(self, **changes)


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
