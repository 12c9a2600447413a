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
    n_wg: int = 2  # consumer warpgroups (1-4)
    # warpgroups sharing one key tile (64 keys each: bk = 64 * tile_wgs); 0 = all of them. With fewer,
    # the n_wg / tile_wgs groups take the CTA's tiles in turn, each running free of the others
    tile_wgs: int = 0
    stages: int = 0  # KV ring depth; 0 = as many as fit (at most MAX_STAGES)
    q_stages: int = 2  # Q ring depth (the next block's queries load during this block)
    # ping-pong: 64-key stages owned alternately by the two consumer warpgroups, which take turns
    # (named barriers) to issue their wgmmas, so one's epilogue runs under the other's wgmmas
    pingpong: bool = False
    # two tiles in flight per warpgroup (two accumulators): the next tile's wgmmas run under this
    # tile's epilogue, in chains of `overlap` tiles (0: off; needs 32 * bq more registers: n_wg <= 2)
    overlap: int = 0

    def __post_init__(self) -> None:
        if self.bq not in (1, 2, 4):
            raise ValueError(f"bq must be 1, 2 or 4, got {self.bq}")
        if self.n_wg not in (1, 2, 3, 4):
            raise ValueError(f"n_wg must be 1 to 4, got {self.n_wg}")
        if self.tile_wgs and (self.tile_wgs > self.n_wg or self.n_wg % self.tile_wgs):
            raise ValueError(f"tile_wgs {self.tile_wgs} must divide n_wg {self.n_wg}")
        if self.q_stages < 1:
            raise ValueError("q_stages must be >= 1")
        if self.pingpong and (self.n_wg != 2 or self.tile_wgs not in (0, 1)):
            raise ValueError("pingpong takes two consumer warpgroups (n_wg = 2), one a tile")
        if self.overlap and (self.overlap < 2 or self.pingpong or self.n_wg > 2):
            raise ValueError("overlap chains >= 2 tiles, with at most two consumer warpgroups and no ping-pong")
        # per consumer thread: the accumulator (32 * bq fp32, twice with overlap) and the weights
        # (16 * bq), with 16 registers left for the rest (DeepGEMM's four warpgroups at bq 2: 96 of 112)
        held = 32 * self.bq * (2 if self.overlap else 1) + 16 * self.bq
        if held > self.reg_split[1] - 16:
            raise ValueError(f"bq {self.bq} x n_wg {self.n_wg}{' with overlap' if self.overlap else ''} holds "
                             f"{held} registers a thread, more than {self.reg_split[1] - 16} of its "
                             f"{self.reg_split[1]}")
        if self.stages and self.kv_stage_bytes * self.stages + self.fixed_bytes > SMEM_BYTES:
            raise ValueError(f"{self.stages} KV stages of {self.kv_stage_bytes} B do not fit shared memory")
        need = max(2, self.groups)  # a group steps the ring by `groups` stages a tile (_step)
        if self.n_stages < need:
            raise ValueError(f"bq {self.bq} x n_wg {self.n_wg} leaves room for {self.n_stages} KV stage(s), "
                             f"fewer than {need}")

    @property
    def bk(self) -> int:
        """Keys per tile (per KV stage): 64 per warpgroup sharing it."""
        return 64 * self.mma_wg

    @property
    def mma_wg(self) -> int:
        """Warpgroups sharing one tile (the MMA's atom layout along M)."""
        return 1 if self.pingpong else (self.tile_wgs or self.n_wg)

    @property
    def groups(self) -> int:
        """Groups of warpgroups that take the CTA's key tiles in turn (tile g goes to group g % groups)."""
        return self.n_wg // self.mma_wg

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
        cap = MAX_STAGES * self.groups  # smaller stages, more of them
        return min(cap, (SMEM_BYTES - self.fixed_bytes) // self.kv_stage_bytes)

    @property
    def reg_split(self) -> tuple[int, int]:
        """setmaxnreg (producer warpgroup, consumers): the launch gives every thread R = 64K / threads
        registers (a multiple of 8, at most 256); the producer warpgroup drops to 40 (32 with four
        consumer warpgroups, where R is 96) and the consumers share what it frees."""
        launch = min(256, 65536 // self.threads // 8 * 8)
        producer = 32 if self.n_wg == 4 else 40
        return producer, min(256, (launch + (launch - producer) // self.n_wg) // 8 * 8)
