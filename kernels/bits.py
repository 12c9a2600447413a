"""IEEE bit casts inside CuTeDSL kernels (fp32 <-> its int32 bits), shared by the families that
round or order floats by their bits (quant, router)."""

from __future__ import annotations

from cutlass import Float32, Int32
from cutlass._mlir.dialects import arith
from cutlass.cutlass_dsl import T, dsl_user_op


@dsl_user_op
def f32_bits(x, *, loc=None, ip=None) -> Int32:
    return Int32(arith.bitcast(T.i32(), Float32(x).ir_value(loc=loc, ip=ip), loc=loc, ip=ip))


@dsl_user_op
def bits_f32(x, *, loc=None, ip=None) -> Float32:
    return Float32(arith.bitcast(T.f32(), Int32(x).ir_value(loc=loc, ip=ip), loc=loc, ip=ip))
