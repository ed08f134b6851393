"""The arithmetic every job runs with: reductions in the precision of their operands.

cuBLAS may otherwise accumulate bf16/fp16 matrix products in reduced precision and run float32
ones in TF32; which kernel it picks depends on the rows of the call, so the same logits of two
call shapes would differ by more than their dtype's rounding and a float32 run would no longer
equal AR exactly (docs/records.md, near_ties). On CPU these switches change nothing; float32
matrix products there are IEEE already (`torch.get_float32_matmul_precision() == "highest"`)."""

from __future__ import annotations

import torch


def exact_reductions() -> None:
    """Switch off reduced-precision reductions and TF32 for the process."""
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    torch.set_float32_matmul_precision("highest")
    torch.backends.cudnn.allow_tf32 = False

