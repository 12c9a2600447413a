"""dsv4bench.compile.sass.loop_spills on planted SASS: a local-memory access in the innermost loop that issues wgmma
is listed; one in an outer loop, after the loop, or reached only by a wait's out-of-line slow path is not."""

from __future__ import annotations

from dsv4bench.compile.sass import loop_spills

PLANTED = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_0:
        /*0010*/                   LDL R2, [R1] ;
.L_x_1:
        /*0020*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R3], R4 ;
        /*0030*/               @!P0 BRA `(.L_x_9) ;
.L_x_2:
        /*0040*/                   WARPGROUP.ARRIVE ;
        /*0050*/                   {K_LOOP_SPILL}
        /*0060*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*0070*/               @P1 BRA `(.L_x_1) ;
        /*0080*/                   STL [R1+0x4], R2 ;
        /*0090*/               @P2 BRA `(.L_x_0) ;
        /*00a0*/                   EXIT ;
.L_x_9:
        /*00b0*/                   LDL R5, [R1+0x8] ;
        /*00c0*/                   BRA `(.L_x_2) ;
"""


def test_a_spill_in_the_k_loop_is_listed():
    spills = loop_spills(PLANTED.replace("{K_LOOP_SPILL}", "LDL R6, [R1+0xc] ;"))
    assert [s.split()[0] for s in spills] == ["0x0050"]


def test_spills_outside_the_k_loop_are_not():
    assert loop_spills(PLANTED.replace("{K_LOOP_SPILL}", "NOP ;")) == []
    assert loop_spills(PLANTED.replace("{K_LOOP_SPILL}", "NOP ;"), marker="TRYWAIT") == []
