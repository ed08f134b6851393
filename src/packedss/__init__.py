"""packedss: a benchmark harness for self-speculative decoding with dual-mode (AR + diffusion) language models."""

__version__ = "0.1.0"
