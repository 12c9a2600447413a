"""Synchronisation of the SM90 attention kernel: the named barriers (`bar.sync` / `bar.arrive`
ids) and the layout of the mbarrier array in shared memory.

mbarriers, `Storage.bars` (S = Config.stages), index: role
  * block/gather lists, per stage s: s K full, S + s K empty, 2S + s V full, 3S + s V empty
    (V is K: V full/empty unused, K empty is freed after PV);
  * key split, per stage s and half h of d: 2s + h full, 4 + 2s + h empty (S = 2);
  * 4S: Q full, 4S + 1: Q empty (persistent: the previous item's last QK is done).
"""

from __future__ import annotations

from enum import IntEnum


class NamedBarrier(IntEnum):
    """Named barrier ids (0 is __syncthreads)."""

    XCHG_S1 = 1  # d split: warpgroup 1 published its partial S
    XCHG_S0 = 2  # d split: warpgroup 0 published its partial S
    EPILOGUE = 3  # every consumer: all QK reads of sQ done / O staged in sQ
    PRODUCER = 4  # producer warpgroup: the tile's indices are in smem (gather)
    MAX0 = 5  # key split: WG0 published max(old, own tile's)
    MAX1 = 6  # key split: WG1 published the final max
    P0 = 7  # key split: WG0's bf16 P is in smem
    P1 = 8  # key split: WG1's bf16 P is in smem
    SUMS = 9  # key split: both row-sum halves are in smem
    TURN0 = 10  # ping-pong (d <= 256): TURN0 + w opens warpgroup w's turn to issue its GEMMs (10, 11)
    ROWS0 = 12  # fused FP8 decode: ROWS0 + s, the 64 producer threads of stage s copied the pair's tokens (12, 13)
    EPI_WG0 = 14  # v11 epi-tma (prefill_v11.py): EPI_WG0 + w, warpgroup w's O is in smem for its TMA store (14, 15)
