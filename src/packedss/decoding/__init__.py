"""Pure decoding logic: calls, schedules, verification (no I/O, no model classes)."""

from packedss.decoding.calls import Call, CallModel, Role
from packedss.decoding.schedules import LTR_SCHEDULES, DecodeSettings, decode
from packedss.decoding.trace import Decoded, StopCheck
from packedss.decoding.verify import VERIFY_RULES, Sampling

__all__ = [
    "Call",
    "CallModel",
    "Decoded",
    "DecodeSettings",
    "LTR_SCHEDULES",
    "Role",
    "Sampling",
    "StopCheck",
    "VERIFY_RULES",
    "decode",
]
