"""FP32 oracles of every op of the DSV4 inference pipeline (DSV4_SPEC.md §2–§9).

Each op has an FP32 oracle and a `*_lowprec` twin composing the same math in the kernel's dtype
(the low-precision reference of the tolerance rule). docs/oracles.md maps spec formulas to
functions and tests. `fmha` (attention core) and `model` (full-model composition) are owned
by their kernel/runner families.
"""
