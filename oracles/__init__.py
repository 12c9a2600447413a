"""FP32 oracles of every op of the DSV4 inference pipeline (docs/model-math.md §2–§9).

Each op has an FP32 oracle and a `*_lowprec` twin composing the same math in the kernel's dtype
(the low-precision reference of the tolerance rule). docs/oracles.md maps spec formulas to
functions and tests. `fmha` (attention core) and `model` (full-model composition) are owned
by their kernel/runner families.
"""

# A family may live outside this tree: every `oracles/` directory on sys.path joins this package
# (kernels/<f>/, oracles/<f>.py, sweeps/<f>.py; docs/adding-a-family.md).
__path__ = __import__("pkgutil").extend_path(__path__, __name__)
