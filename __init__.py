"""kernelrl: reinforcement learning for LLMs that write GPU kernels."""

__version__ = "0.1.0"
