"""Training of the shipped tiny models: `tiny` (Nemotron layout) with its proposal LoRA,
`tiny-set` (SetDLM layout) and `tiny-sdar` (SDAR layout). scripts/train_tiny.py is the command line.

  corpus   the corpus, the tokenizer, token sequences and the batch sampler
  layouts  training sequences built as decoding calls (one attention rule with decoding)
  loop     the run settings (TrainConfig), the shared optimizer loop, checkpointing
  nemotron tiny and its proposal LoRA
  setdlm   tiny-set
  sdar     tiny-sdar
"""

from packedss.training.loop import TrainConfig
from packedss.training.nemotron import train_nemotron, train_proposal_lora
from packedss.training.sdar import train_sdar
from packedss.training.setdlm import train_setdlm

__all__ = ["TrainConfig", "train_nemotron", "train_proposal_lora", "train_sdar", "train_setdlm"]
