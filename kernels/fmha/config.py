"""What changes the compiled code of the SM90 attention kernel: `Config`, and the tile and shared
memory arithmetic derived from it (docs/perf/fmha.md, "Design and version history")."""

from __future__ import annotations

import math
from dataclasses import dataclass

LOG2E = math.log2(math.e)
LN2 = math.log(2.0)
SMEM_BUDGET = 227 * 1024  # dynamic smem per CTA on the H100 (the kernel's Storage, 1 KiB-aligned regions)
MAX_INIT = -1.0e30  # key split: a finite initial row max, so a fully masked tile needs no special case


@dataclass(frozen=True)
class Config:
    """Everything that changes the compiled code."""

    d: int  # q/k head dim
    dv: int  # v / output head dim
    hpg: int  # query heads per kv head
    kv_shared: bool  # V is K (MQA latent): one smem tile for both GEMMs
    per_token_idx: bool  # indices per query token (sparse); else a contiguous key range per query block
    causal: bool = False  # positional causal mask (block lists only); the window is a runtime value

    def __post_init__(self) -> None:
        if self.d % 64 or not 64 <= self.d <= 512:
            raise ValueError(f"head_dim {self.d} unsupported (multiple of 64 in 64..512)")
        if self.dv % 64 or not 64 <= self.dv <= 512 or (self.dv > 256 and self.dv % 256):
            raise ValueError(f"value dim {self.dv} unsupported (64..256 step 64, or 512)")
        if self.d != self.dv:
            raise ValueError("this kernel needs d == dv (O is staged in the Q buffer)")
        if self.n_dsplit > 1 and self.d % (64 * self.n_dsplit):
            raise ValueError("split QK needs d divisible by 64 per warpgroup")

    @property
    def key_split(self) -> bool:
        """dv = 512 with V = K (the DSV4 latent): the two consumer warpgroups take alternate key
        tiles over the full d instead of halves of d, each owns half of O, and they trade the
        row max and the bf16 P through smem (key_split.py)."""
        return self.kv_shared and self.n_dsplit > 1

    @property
    def persistent(self) -> bool:
        """Causal, d <= 256 (ping-pong): one CTA per SM walks work items (query block x head block
        x batch) in a fixed snake order, longest causal lists first, so the SMs finish together and
        the producer loads the next item's Q and first tiles under the current item's last ones.
        Lists of equal length (no mask, window, sparse) gain nothing from it on the H100 and lose
        the staged epilogue (docs/perf/fmha.md, v7): they keep one CTA per item, as does dv = 512."""
        return self.n_dsplit == 1 and self.causal

    @property
    def tma_kv(self) -> bool:
        """Block lists (dense masks) are contiguous key ranges, -1 padded: a tile's K and V rows
        are one box each from its first key, loaded by TMA; per-token lists are gathered."""
        return not self.per_token_idx

    @property
    def n_dsplit(self) -> int:
        return max(1, self.dv // 256)

    @property
    def dv_wg(self) -> int:
        return self.dv // self.n_dsplit

    @property
    def n_mrow(self) -> int:
        return 1 if self.n_dsplit > 1 else 2

    @property
    def m_cta(self) -> int:
        return 64 * self.n_mrow

    @property
    def n_consumer_wg(self) -> int:
        return self.n_mrow * self.n_dsplit

    @property
    def threads(self) -> int:
        return 128 * (self.n_consumer_wg + 1)

    @property
    def hb(self) -> int:
        """Heads per CTA (rows of one token)."""
        return self.m_cta if self.per_token_idx and self.hpg >= self.m_cta else min(self.hpg, self.m_cta)

    @property
    def tq(self) -> int:
        """Query tokens per CTA; the index list is shared by them."""
        return 1 if self.per_token_idx else self.m_cta // self.hb

    @property
    def n_hblk(self) -> int:
        return -(-self.hpg // self.hb)

    @property
    def reg_split(self) -> tuple[int, int]:
        """setmaxnreg (producer, consumer) of 3 x 128 threads (<= 64K registers): the key split's
        producer keeps a pair's row indices in registers (72); elsewhere the consumers take 232."""
        return (72, 216) if self.key_split else (40, 232)

    @property
    def stages(self) -> int:
        return 2

    def smem_bytes(self, n_block: int) -> int:
        """The kernel's Storage: a small header (barriers, indices, mask flags, exchange), then
        the P, Q, K and V regions, each 1 KiB-aligned."""
        def kib(b: int) -> int:
            return -(-b // 1024) * 1024

        S = self.stages
        header = 8 * (4 * S + 2) + 4 * S * (n_block + 4) + 4 * self.xchg_floats(n_block)
        p_tiles = 2 * S * 64 * n_block if self.key_split else 16
        v_tiles = 16 if self.kv_shared else 2 * S * n_block * self.dv
        return kib(header) + kib(p_tiles) + kib(2 * self.m_cta * self.d) + kib(2 * S * n_block * self.d) + kib(v_tiles)

    def xchg_floats(self, n_block: int) -> int:
        """fp32 smem shared by the two warpgroups of a split: the partial S (d split), or the row
        max (64) plus every thread's two partial row sums (key split)."""
        if self.key_split:
            return 64 + 2 * 128 * 2
        return 64 * n_block if self.n_dsplit > 1 else 1

    @property
    def n_block(self) -> int:
        """Keys per tile: the largest that fits smem and keeps S + O in registers (at dv 256, S and
        P of 80 keys + O: ~190 of the 232 registers; 80 rather than 64 keys per tile takes the
        per-tile overheads over more MMA work)."""
        cap = 80 if self.dv_wg >= 256 else 128
        if self.key_split:  # the 128 producer threads load one index of each of the pair's two tiles
            if self.smem_bytes(64) > SMEM_BUDGET:
                raise ValueError(f"the key-split tiles do not fit shared memory for {self}")
            return 64
        for n in (128, 80, 64, 32):
            if n <= cap and self.smem_bytes(n) <= SMEM_BUDGET:
                return n
        raise ValueError(f"no key tile fits shared memory for {self}")
