"""dsv4bench: correctness-and-tuning workbench for the CuTeDSL kernels of DeepSeek-V4."""

__version__ = "0.1.0"
