"""The gemm kernel's compile-time tile configuration (GemmConfig) and its shared-memory budget:
what kernels/gemm/config.py (the tile rule) chooses among and kernels/gemm/gemm_sm90.py builds."""

from __future__ import annotations

from dataclasses import dataclass

KBLOCK = 128  # the quantisation block along K: one promotion per 128 columns
SMEM_BYTES = 227 * 1024  # opt-in shared memory per CTA on sm_90
EPI_N = 32  # epilogue slice width (columns) per TMA store
MAX_STAGES = 16  # 64-row x tiles and taller
MAX_STAGES_SMALL_X = 32  # 16 / 32-row x tiles (decode): the ring is the weight bytes in flight
ABLATIONS = ("", "no-promote", "const-scale", "half-a", "no-b", "no-aux", "half-k")
SCALE_BOX = 4  # K blocks of scales per TMA box: 4 fp32 = the 16-byte minimum inner box of a TMA load
SW_SLOT = 32  # fp32 per stage for the sw box: TMA writes to 128-byte aligned shared memory
STREAM_ABLATIONS = ("no-b", "no-aux")  # knock-outs of the producer's copies only
CHAINED_ABLATIONS = (*STREAM_ABLATIONS, "half-k")  # knock-outs that leave the consumers' chained loop as it is
MAX_CLUSTER = 8  # the portable cluster size: a split-K cluster's slices
STAMP_SLOTS = 16  # int32 a CTA for GemmConfig.stamps


@dataclass(frozen=True)
class GemmConfig:
    """Compile-time tile configuration (kernels/gemm/config.py picks one per problem)."""

    # CTA rows: 64 (one consumer warpgroup), 128 or 256 (two; 256 in two waves); 16 or 32 (decode,
    # M <= bm: one M tile): an x tile of bm rows a stage, read by the m64 wgmma, whose rows past bm
    # run on whatever shared memory follows (the next stages) and are never stored
    bm: int = 128
    # CTA columns: 32, 64 or 128 (divides the 128-wide weight-scale block), or 192 (spans two
    # weight-scale blocks: one wave only, its two accumulators need 2 x 96 registers a thread)
    bn: int = 128
    stages: int = 0  # smem ring depth; 0 = as many as fit (at most MAX_STAGES)
    group_m: int = 8  # rasterisation: M-tiles per group
    split_k: int = 1  # K slices per tile (decode: fill the SMs when M/N give too few tiles)
    epi_stages: int = 2
    # the consumers' and the producer's K-block loops unrolled by this factor: 4 ran the 85 shapes
    # of M 1-4096 3-5% faster than 1 (v7, docs/perf/gemm.md); 8 was level with 4
    unroll: int = 4
    # one wave (bm <= 128): K blocks in chains of this many (0: off), inside which block
    # kb + 1's wgmmas are issued before block kb is promoted (two temporary accumulators), so the
    # tensor core's latency and the promotion overlap instead of adding up per K block
    chain: int = 0
    # per-warpgroup epilogue: each consumer warpgroup stores its own 64 rows (own smem buffers, a
    # 128-thread barrier, its own TMA store) instead of the two meeting at a CTA barrier per slice
    epi_per_wg: bool = False
    # 2: CTA pairs on adjacent N tiles of one M tile (a 1 x 2 cluster); rank r loads wave r of the
    # shared x tile and multicasts it to both, halving the x bytes each SM pulls from L2 (bm 256)
    cluster_n: int = 1
    # split-K slices of one tile launched as one cluster (split_k CTAs, 2-8): each slice but the first
    # sends its fp32 partial into the first's shared memory (st.async over DSMEM, counted on an
    # mbarrier there), which adds them and stores the tile; no global workspace, no counter round
    # trips. One round only: the tiles x slices CTAs must all fit the grid (run_gemm checks)
    cluster_k: bool = False
    # launched with programmatic dependent launch (the quant+gemm op's GEMM after its quant kernel): the
    # first ring-full of weight loads goes out before griddepcontrol.wait, the activation's after
    pdl: bool = False
    # rows of x's TMA box on a 16 / 32-row decode tile (0: the tile's bm): 1, 2, 4 or 8 where M fits them, so
    # no row of the box lies past M (TMA fills such rows with zeros); the stage's rows past the box keep
    # whatever they held (their output rows are never stored). The sa box takes max(4, x_box) rows (16 bytes)
    x_box: int = 0
    # instrument: a clock stamp at each phase of a CTA's first unit (entry, first load, first stage landed, mainloop,
    # merge, epilogue, exit) into the split-K workspace, STAMP_SLOTS int32 a CTA (benchmarks/gemm_phases.py reads them)
    stamps: bool = False
    # knock-outs that find what binds the kernel (kernels/gemm/variants.py; wrong answers, timed only):
    # "no-promote" wgmmas accumulate straight into acc (no scales, no promotion: a plain FP8 GEMM),
    # "const-scale" promotes with scale 1 (the scale boxes still load, unread); "half-a" skips the
    # last wave's x tile load (bm 256: the L2 -> SM bytes a 2-CTA multicast of x would save), "no-b"
    # skips the W tile load (what a multicast of W would save, and more); "no-aux" loads the W tile alone a stage (no
    # x tile, no scale boxes: what a decode stage's three small copies beside its W box cost); "half-k" issues 2 of a
    # K block's 4 wgmmas (what the tensor core's share of a block costs: swap-AB would cut it 2-4x a weight byte)
    ablate: str = ""

    def __post_init__(self) -> None:
        if self.ablate not in ABLATIONS:
            raise ValueError(f"ablate must be one of {ABLATIONS}, got {self.ablate!r}")
        if self.bm not in (16, 32, 64, 128, 256):
            raise ValueError(f"bm must be 16, 32, 64, 128 or 256, got {self.bm}")
        if self.bn not in (32, 64, 128, 192):
            raise ValueError(f"bn must be 32, 64, 128 or 192, got {self.bn}")
        if self.bn == 192 and self.bm == 256:
            raise ValueError("bn 192 takes one wave (bm 64 or 128): two 64 x 192 accumulators fill the registers")
        if self.bm < 64 and (self.cluster_n > 1 or self.ablate == "half-a"):
            raise ValueError(f"bm {self.bm} (a small x tile) runs single CTAs, one wave")
        if self.split_k < 1:
            raise ValueError("split_k must be >= 1")
        if self.split_k > 1 and self.waves > 1:
            raise ValueError("split-K takes one wave per tile (bm <= 128)")
        if self.ablate == "half-a" and self.waves < 2:
            raise ValueError("the half-a knock-out drops the second wave's x tile: bm 256 only")
        if self.cluster_n not in (1, 2):
            raise ValueError(f"cluster_n must be 1 or 2, got {self.cluster_n}")
        if self.cluster_n == 2 and (self.waves != 2 or self.split_k > 1 or self.ablate == "half-a"):
            raise ValueError("a CTA pair multicasts one x wave each: bm 256, no split-K")
        if self.cluster_k and not (2 <= self.split_k <= MAX_CLUSTER and self.cluster_n == 1 and self.waves == 1):
            raise ValueError(f"a split-K cluster takes 2-{MAX_CLUSTER} slices of a one-wave tile and no CTA pair, "
                             f"got split_k {self.split_k}, bm {self.bm}, cluster_n {self.cluster_n}")
        if self.unroll not in (1, 2, 4, 8):
            raise ValueError(f"unroll must be 1, 2, 4 or 8, got {self.unroll}")
        if self.chain not in (0, 2, 4, 8, 16, 32):
            raise ValueError(f"chain must be 0 (off), 2, 4, 8, 16 or 32, got {self.chain}")
        if self.chain and not self.chainable:
            raise ValueError("K-block chains run one wave (bm <= 128), bn <= 128, no knock-out but "
                             "no-b / no-aux / half-k")
        if self.stamps and self.split_k > 1 and not self.cluster_k:
            raise ValueError("phase stamps take the split-K workspace: a split-K cluster or no split")
        if self.x_box and not (self.bm < 64 and self.x_box in (1, 2, 4, 8) and self.x_box < self.bm):
            raise ValueError(f"x_box takes 1, 2, 4 or 8 rows of a 16 / 32-row x tile, got {self.x_box} of bm {self.bm}")
        if self.group_m < 1:
            raise ValueError("group_m must be >= 1")
        if self.stages and self.stage_smem_bytes * self.stages + self.fixed_bytes > SMEM_BYTES:
            raise ValueError(f"{self.stages} stages of {self.stage_smem_bytes} B do not fit shared memory")
        if self.n_stages < 2:
            raise ValueError(f"bm {self.bm} x bn {self.bn} leaves room for {self.n_stages} smem stage(s)")

    @property
    def chainable(self) -> bool:
        """May `chain` be set: one wave (each consumer warpgroup one accumulator, bm <= 128), no knock-out but the
        stream's and half-k (they leave the consumers' loop as it is), not bn 192 (three 96-register fragments
        would spill)."""
        return self.waves == 1 and self.ablate in ("", *CHAINED_ABLATIONS) and self.bn != 192

    @property
    def n_mma_wg(self) -> int:
        return 1 if self.bm <= 64 else 2

    @property
    def wave_m(self) -> int:
        """Rows one round of the consumer warpgroups covers (64 each)."""
        return 64 * self.n_mma_wg

    @property
    def waves(self) -> int:
        return max(1, self.bm // self.wave_m)

    @property
    def x_rows(self) -> int:
        """Rows of x one wave's stage buffer holds: wave_m, or bm for the 16 / 32-row decode tiles."""
        return min(self.bm, self.wave_m)

    @property
    def x_load_rows(self) -> int:
        """Rows of x one TMA box brings (x_box, else x_rows)."""
        return self.x_box or self.x_rows

    @property
    def sa_rows(self) -> int:
        """Rows of sa one TMA box brings: bm, or max(4, x_box) (a box's inner extent is >= 16 bytes)."""
        return max(4, self.x_box) if self.x_box else self.bm

    @property
    def epi_groups(self) -> int:
        """Warpgroups storing independently in the epilogue (1: the whole wave together)."""
        return self.n_mma_wg if self.epi_per_wg else 1

    @property
    def epi_rows(self) -> int:
        return self.wave_m // self.epi_groups

    @property
    def sw_blocks(self) -> int:
        """Weight-scale blocks (128 columns) one tile's columns can touch: 2 for bn 192."""
        return 1 if KBLOCK % self.bn == 0 else 2

    @property
    def threads(self) -> int:
        return 128 * (1 + self.n_mma_wg)

    @property
    def stage_bytes(self) -> int:
        """Bytes TMA brings per stage (the full barrier's transaction count): the x and W tiles and
        the scale boxes, a column of bm sa values and (1 x 4) of sw, fp32."""
        if self.ablate == "no-aux":
            return self.bn * KBLOCK
        skipped = {"half-a": self.wave_m, "no-b": self.bn}.get(self.ablate, 0) * KBLOCK
        return (self._stage_tma_bytes - skipped - (self.x_rows - self.x_load_rows) * KBLOCK
                - (self.bm - self.sa_rows) * 4)

    @property
    def _stage_tma_bytes(self) -> int:
        return (self.bm + self.bn) * KBLOCK + (self.bm + self.sw_blocks * SCALE_BOX) * 4

    @property
    def stage_smem_bytes(self) -> int:
        """Shared memory per stage (the knock-outs keep every buffer): each sw box sits in a 128-byte slot."""
        return self._stage_tma_bytes - self.sw_blocks * (SCALE_BOX - SW_SLOT) * 4 + (self.sa_slot - self.bm) * 4

    @property
    def sa_slot(self) -> int:
        """fp32 per stage for the sa box (bm values): TMA writes to 128-byte aligned shared memory, so
        a 16-row tile's 64-byte box takes a 32-value slot (a 64-byte stride faulted: misaligned address)."""
        return max(self.bm, SW_SLOT)

    @property
    def fixed_bytes(self) -> int:
        # + barriers and alignment, + the rows past the last stage's small x tile its wgmma reads,
        # + a split-K cluster's partials
        return (self.wave_m * EPI_N * 2 * self.epi_stages + 2048 + (self.wave_m - self.x_rows) * KBLOCK
                + self.partial_floats * 4)

    @property
    def partial_floats(self) -> int:
        """fp32 a split-K cluster's first CTA receives: a bm x bn partial from each other slice (the
        threads holding the tile's rows send their accumulator fragments)."""
        return (self.split_k - 1) * self.bm * self.bn if self.cluster_k else 0

    @property
    def n_stages(self) -> int:
        if self.stages:
            return self.stages
        cap = MAX_STAGES_SMALL_X if self.bm < 64 else MAX_STAGES
        return min(cap, (SMEM_BYTES - self.fixed_bytes) // self.stage_smem_bytes)

    @property
    def reg_split(self) -> tuple[int, int]:
        """setmaxnreg (producer, consumer)."""
        return (40, 232) if self.n_mma_wg == 2 else (40, 256)


def straddles_groups(bn: int, n: int, groups: int) -> bool:
    """A grouped GEMM's bn-column tiles would cross a weight group's boundary (group width n / groups)."""
    return groups > 1 and (n // groups) % bn != 0
