"""Peer implementations the fmha family is measured against, each behind its own import."""

from __future__ import annotations

import torch

from dsv4bench.core.case import Case
from dsv4bench.core.registry import Impl, Unsupported, import_reason
from kernels.common import Prepared


class FlashMLA(Impl):
    """deepseek-ai/FlashMLA flash_mla_sparse_fwd: the DSV4 sparse prefill kernel (CUDA C++); for
    `op: decode_fp8` cases its FP8 sparse decode, `flash_mla_with_kvcache(is_fp8_kvcache=True)`."""

    family, name, backend = "fmha", "flashmla", "flashmla"
    archs = ("any",)

    def __init__(self):
        self._decode_meta = Prepared()  # (scheduler metadata, whether some request has no key) per inputs

    def available(self) -> str | None:
        return import_reason("flash_mla")

    def supports(self, case: Case, arch: str | None = None) -> str | None:
        if case.get("op", "attention") == "decode_fp8":
            if case["hd"] != 512 or case["h_q"] not in (64, 128):
                return "flash_mla_with_kvcache FP8 sparse: d 512, h_q 64/128"
            return None
        ok = (case["mask"] == "sparse" and case["hd"] == 512 and case["h_q"] in (64, 128)
              and case["kv_shared"] and case["b"] == 1 and case["h_kv"] == 1)
        if not ok:
            return "flash_mla_sparse_fwd: sparse, d 512, h_q 64/128, one latent kv head only"
        if case["topk"] % 128:  # its index list is walked in pairs of 64-key blocks (asserted in phase1.cuh)
            return "flash_mla_sparse_fwd: index list width (top-k + window) must be a multiple of 128"
        return None

    def run(self, case: Case, inputs: dict, out: dict, compiled) -> dict:
        import flash_mla

        if case.get("op", "attention") == "decode_fp8":
            return self._decode(case, inputs)
        o, _max_logits, lse = flash_mla.flash_mla_sparse_fwd(
            inputs["q"][0], inputs["k"][0], inputs["idx"][0][:, None, :], case["hd"] ** -0.5, 512,
            inputs.get("sink"),
        )
        return {"out": o[None], "lse": lse[None]}  # natural log, sink-free: the oracle's convention

    def _decode(self, case: Case, x: dict) -> dict:
        """As FlashMLA's tests/test_flash_mla_sparse_decoding.py calls it: the window cache as k_cache,
        the compressed cache as extra_k_cache, their lengths as topk_length / extra_topk_length. Its
        scheduler metadata (get_mla_metadata, filled by the first call) is made once per inputs, as its
        benchmark does, so the timed call is the split-KV kernel and its combine. A request with no
        valid key gets lse +inf there, -inf in the oracle: rewritten only when the inputs have one."""
        import flash_mla

        def make():
            from oracles.fmha_cache import valid_slots

            empty = ~(valid_slots(x["idx0"], x["len0"], x["cache0"].shape[0] * x["cache0"].shape[1]).any(1)
                      | valid_slots(x["idx1"], x["len1"], x["cache1"].shape[0] * x["cache1"].shape[1]).any(1))
            return flash_mla.get_mla_metadata()[0], bool(empty.any())

        meta, has_empty = self._decode_meta.get((x["idx0"], x["idx1"], x["len0"], x["len1"]), make)
        o, lse = flash_mla.flash_mla_with_kvcache(
            x["q"][:, None], x["cache0"], None, None, 512, meta, None, case["hd"] ** -0.5, False, True,
            x["idx0"][:, None, :], x.get("sink"), x["cache1"], x["idx1"][:, None, :], x["len0"], x["len1"],
        )
        lse = lse.reshape(o.shape[0], o.shape[2])  # (b, h) of s_q = 1
        if has_empty:
            lse = torch.where(lse == float("inf"), torch.full_like(lse, float("-inf")), lse)
        return {"out": o[:, 0], "lse": lse}


def _dense_ok(case: Case) -> str | None:
    if case["mask"] == "sparse":
        return "dense attention only"
    if case["hd"] > 256:
        return "head_dim > 256 is not supported"
    return None


class FA4(Impl):
    """FlashAttention-4 (flash_attn.cute.flash_attn_func), dense, hd <= 256 on SM90."""

    family, name, backend = "fmha", "fa4", "fa4"
    archs = ("any",)

    def available(self) -> str | None:
        return import_reason("flash_attn.cute")

    def supports(self, case: Case, arch: str | None = None) -> str | None:
        if case["sink"] and case["lse"]:
            return "learnable-sink LSE convention not pinned down for FA4"
        return _dense_ok(case)

    def run(self, case: Case, inputs: dict, out: dict, compiled) -> dict:
        from flash_attn.cute import flash_attn_func

        mask, w = case["mask"], case["window"]
        window = (None, None)
        if "window" in mask:
            window = (w - 1, 0 if "causal" in mask else w - 1)
        k = inputs["k"]
        o, lse = flash_attn_func(
            inputs["q"], k, inputs.get("v", k), softmax_scale=case["hd"] ** -0.5, causal="causal" in mask,
            window_size=window, learnable_sink=inputs.get("sink"), return_lse=bool(case["lse"]),
        )
        res = {"out": o}
        if case["lse"]:
            res["lse"] = lse.transpose(1, 2)
        return res


class CudnnSDPA(Impl):
    """torch scaled_dot_product_attention pinned to the cuDNN backend; dense, hd <= 256."""

    family, name, backend = "fmha", "cudnn", "cudnn"
    archs = ("any",)

    def available(self) -> str | None:
        if not torch.cuda.is_available():
            return "needs CUDA"
        return None if torch.backends.cudnn.is_available() else "cuDNN not available"

    def supports(self, case: Case, arch: str | None = None) -> str | None:
        if case["mask"] not in ("none", "causal") or case["sink"] or case["lse"]:
            return "cuDNN SDPA here: no window, no sink, no LSE output"
        if case["mask"] == "causal" and case["s_q"] != case["s_kv"]:
            return "SDPA is_causal is top-left aligned; only s_q == s_kv matches"
        if case["h_q"] != case["h_kv"]:
            return "MHA only"
        return _dense_ok(case)

    def run(self, case: Case, inputs: dict, out: dict, compiled) -> dict:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        k = inputs["k"]
        q, k, v = (t.transpose(1, 2) for t in (inputs["q"], k, inputs.get("v", k)))
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            try:
                o = torch.nn.functional.scaled_dot_product_attention(
                    q, k, v, is_causal=case["mask"] == "causal", scale=case["hd"] ** -0.5)
            except RuntimeError as e:  # torch's cuDNN dispatch declined the shapes (e.g. s_q = s_kv = 1)
                if "No available kernel" in str(e):
                    raise Unsupported(f"cuDNN SDPA: {e}") from e
                raise
        return {"out": o.transpose(1, 2)}
