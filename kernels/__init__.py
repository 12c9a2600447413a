"""CuTeDSL kernels, one package per family (its kernel modules and family.py)."""

# A family may live outside this tree: every `kernels/` directory on sys.path joins this package
# (kernels/<f>/, oracles/<f>.py, sweeps/<f>.py; docs/adding-a-family.md).
__path__ = __import__("pkgutil").extend_path(__path__, __name__)
