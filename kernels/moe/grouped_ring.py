"""The grouped GEMMs' TMA ring (v2 / v4 / v5 / v3 alike): shared-memory storage, the stage layouts and boxes of the
FP4 weight tile, its shift words and column scales and x's row scales, their TMA atoms and the TMA warp's partitions.
kernels/moe/grouped_sm90.py's kernels build their ring from these."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Uint8
from cutlass.cute.nvgpu import cpasync

from kernels.gemm.tiling import KBLOCK, SMEM_BYTES
from kernels.moe.grouped_config import MAX_GROUPS, WIDEN_TABLE_WORDS, GroupedConfig

TMA_SMEM_ALIGN = 128  # bytes: a TMA destination's alignment in shared memory (else a misaligned-address fault)


def ring_storage(c: GroupedConfig, fp8, sA_layout, ring: tuple, sB_layout=None):
    """The kernels' shared memory (v2 / v4 and v5 alike): the stages' barriers, the widening table, the epilogue's
    amax exchange, the work list, the ring (ring_layouts), the x tiles (sA) and, v2, the two widened tiles (sB).
    A ValueError if it does not fit."""
    sQ_layout, sSh_layout, sSW_layout, sSA_layout = ring
    st, align, mem = cute.struct, cute.struct.Align, cute.struct.MemRange
    fields = {"bars": mem[cutlass.Int64, c.n_stages * 2],
              "tab": align[mem[Int32, WIDEN_TABLE_WORDS], 16],
              "red": align[mem[Float32, c.reduce_words], 16],
              "gtiles": align[mem[Int32, MAX_GROUPS], 16],  # masked: tiles per group
              "gfirst": align[mem[Int32, MAX_GROUPS], 16],  # and the first tile of each
              **({"flag": align[mem[Int32, 4], 16]} if c.split_k > 1 else {}),  # split_k: the last slice's flag
              # v19: the B buffers' full and empty barriers
              **({"wbars": mem[cutlass.Int64, 2 * c.widen_buffers]} if c.widen_wg else {}),
              "sSA": align[mem[Float32, cute.cosize(sSA_layout)], 128],
              "sSW": align[mem[Float32, cute.cosize(sSW_layout)], 128],
              "sSh": align[mem[Int32, cute.cosize(sSh_layout)], 128],
              "sQ": align[mem[Uint8, cute.cosize(sQ_layout)], 1024],
              "sA": align[mem[fp8, cute.cosize(sA_layout)], 1024]}
    if sB_layout is not None:
        fields["sB"] = align[mem[fp8, cute.cosize(sB_layout)], 1024]
    Storage = st(type("Storage", (), {"__annotations__": fields}))
    if Storage.size_in_bytes() > SMEM_BYTES:
        raise ValueError(f"{c}: {Storage.size_in_bytes()} B of shared memory, more than {SMEM_BYTES}")
    return Storage


def ring_layouts(c: GroupedConfig) -> tuple:
    """Shared-memory layouts of a stage's FP4 weight tile (bn x 64 bytes), its shift words and column scales (bn
    each) and x's row scales (bm; a stage's box starts on a 128-byte boundary: bm 16 takes 64 B of 128)."""
    S = c.n_stages
    sa_stage = max(c.bm, TMA_SMEM_ALIGN // 4)
    codes = cute.make_layout((c.bn, KBLOCK // 2, S), stride=(KBLOCK // 2, 1, c.bn * KBLOCK // 2))
    if c.rs_codes:  # TMA's 64B swizzle: row n's 16-byte chunk q at q ^ ((n >> 1) & 3) (GroupedSplit's RS widening)
        codes = cute.make_composed_layout(cute.make_swizzle(2, 4, 3), 0, codes)
    return (codes,
            cute.make_layout((c.bn, 1, S), stride=(1, c.bn, c.bn)), cute.make_layout((c.bn, 1, S), stride=(1, c.bn, c.bn)),
            cute.make_layout((c.bm, 1, S), stride=(1, sa_stage, sa_stage)))


def ring_boxes(c: GroupedConfig) -> tuple:
    """TMA boxes of a stage's weight tile (bn x 64 bytes), shift words, column scales (bn each), x's row scales (bm)."""
    return (c.bn, KBLOCK // 2), (c.bn, 1), (c.bn, 1), (c.bm, 1)


def ring_atoms(c: GroupedConfig, tensors: tuple, layouts: tuple) -> list:
    """The TMA atoms (and their global views) of the weight tile, shifts, column scales and x's row scales."""
    return [cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), t, cute.slice_(lay, (None, None, 0)), box)
            for t, lay, box in zip(tensors, layouts, ring_boxes(c))]


def tma_pieces(atom, g_t, smem, box) -> tuple:
    """(atom, its global tiles, its stage buffers) for the TMA warp: g_t tiled by `box`, both partitioned."""
    g = cute.local_tile(g_t, box, (None, None, None))
    s_part, g_part = cpasync.tma_partition(atom, 0, cute.make_layout(1), cute.group_modes(smem, 0, 2),
                                           cute.group_modes(g, 0, 2))
    return atom, g_part, s_part


def ring_extent(c: GroupedConfig, gSh_t) -> tuple:
    """(n tiles, K blocks) of a weight: its side data (N, KB, E) in (bn, 1) tiles (the last n tile may be part)."""
    g = cute.local_tile(gSh_t, (c.bn, 1), (None, None, None))
    return cute.size(g, mode=[2]), cute.size(g, mode=[3])


def ring_partitions(c: GroupedConfig, atoms: tuple, smem: tuple) -> list:
    """tma_pieces of the weight tile (bn x 64: (bn, 64, N/bn, KB, E), or one tile of the load-time layout), the shifts
    and column scales ((bn, 1, N/bn, KB, E)) and x's row scales ((bm, 1, Mg/bm, KB, G))."""
    return [tma_pieces(atom, g_t, s, box) for (atom, g_t), s, box in zip(atoms, smem, ring_boxes(c))]
