"""Pure decoding logic: calls, schedules, verification (no I/O, no model classes)."""

from packedss.decoding.anyorder import decode_anyorder
from packedss.decoding.calls import Call, CallModel, Role
from packedss.decoding.driver import (
    ANYORDER_SCHEDULES,
    LTR_SCHEDULES,
    ORDERS,
    AnyOrderSettings,
    DecodeSettings,
    LTRSettings,
)
from packedss.decoding.schedules import decode_ltr
from packedss.decoding.trace import Decoded, StopCheck
from packedss.decoding.verify import GREEDY, VERIFY_RULES, Sampling, question_seed

__all__ = [
    "ANYORDER_SCHEDULES",
    "AnyOrderSettings",
    "Call",
    "CallModel",
    "Decoded",
    "DecodeSettings",
    "GREEDY",
    "LTRSettings",
    "LTR_SCHEDULES",
    "ORDERS",
    "Role",
    "Sampling",
    "StopCheck",
    "VERIFY_RULES",
    "decode_anyorder",
    "decode_ltr",
    "question_seed",
]
