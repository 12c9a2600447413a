"""The logits kernel's compile-time configuration and the indexer's fixed sizes (kept apart from the
kernel, kernels/indexer/logits_sm90.py, which also re-exports them)."""

from __future__ import annotations

from dataclasses import dataclass

HEADS = 64  # indexer heads (Flash and Pro)
HEAD_DIM = 128  # indexer head dim: one wgmma K block
SMEM_BYTES = 227 * 1024  # opt-in shared memory per CTA on sm_90
MAX_STAGES = 8


@dataclass(frozen=True)
class LogitsConfig:
    """Compile-time configuration (kernels/indexer/config.py picks one per problem)."""

    bq: int = 2  # query tokens per block: wgmma N = 64 * bq (1, 2 or 4)
    n_wg: int = 2  # consumer warpgroups, 64 keys each: key tile bk = 64 * n_wg (1 or 2)
    stages: int = 0  # KV ring depth; 0 = as many as fit (at most MAX_STAGES)
    q_stages: int = 2  # Q ring depth (the next block's queries load during this block)
    # ping-pong: 64-key stages owned alternately by the two consumer warpgroups, which take turns
    # (named barriers) to issue their wgmmas, so one's epilogue runs under the other's wgmmas
    pingpong: bool = False

    def __post_init__(self) -> None:
        if self.bq not in (1, 2, 4):
            raise ValueError(f"bq must be 1, 2 or 4, got {self.bq}")
        if self.n_wg not in (1, 2):
            raise ValueError(f"n_wg must be 1 or 2, got {self.n_wg}")
        if self.q_stages < 1:
            raise ValueError("q_stages must be >= 1")
        if self.pingpong and self.n_wg != 2:
            raise ValueError("pingpong takes two consumer warpgroups (n_wg = 2)")
        if self.stages and self.kv_stage_bytes * self.stages + self.fixed_bytes > SMEM_BYTES:
            raise ValueError(f"{self.stages} KV stages of {self.kv_stage_bytes} B do not fit shared memory")
        if self.n_stages < 2:
            raise ValueError(f"bq {self.bq} x n_wg {self.n_wg} leaves room for {self.n_stages} KV stage(s)")

    @property
    def bk(self) -> int:
        """Keys per tile (per KV stage): 64 per consumer warpgroup, or 64 in ping-pong."""
        return 64 if self.pingpong else 64 * self.n_wg

    @property
    def mma_wg(self) -> int:
        """Warpgroups sharing one tile (the MMA's atom layout along M)."""
        return 1 if self.pingpong else self.n_wg

    @property
    def n(self) -> int:
        """wgmma N: the block's (token, head) rows of q."""
        return HEADS * self.bq

    @property
    def threads(self) -> int:
        return 128 * (1 + self.n_wg)

    @property
    def q_stage_bytes(self) -> int:
        """TMA bytes per Q stage: the queries and the weights of bq tokens."""
        return self.n * HEAD_DIM + self.bq * HEADS * 4

    @property
    def kv_stage_bytes(self) -> int:
        """TMA bytes per KV stage: bk keys and their fp32 scales."""
        return self.bk * HEAD_DIM + self.bk * 4

    @property
    def fixed_bytes(self) -> int:
        return self.q_stages * self.q_stage_bytes + 2048  # + barriers and alignment

    @property
    def n_stages(self) -> int:
        if self.stages:
            return self.stages
        cap = 2 * MAX_STAGES if self.pingpong else MAX_STAGES  # half-size stages
        return min(cap, (SMEM_BYTES - self.fixed_bytes) // self.kv_stage_bytes)

    @property
    def reg_split(self) -> tuple[int, int]:
        """setmaxnreg (producer warpgroup, consumers)."""
        return (40, 232) if self.n_wg == 2 else (40, 256)
