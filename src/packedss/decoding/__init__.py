"""Pure decoding logic: calls, schedules, verification (no I/O, no model classes)."""

from packedss.decoding.anyorder import ANYORDER_DECODERS, ANYORDER_SCHEDULES, decode_anyorder
from packedss.decoding.blockdiff import SDAR_DECODERS
from packedss.decoding.calls import Call, CallModel, Role
from packedss.decoding.driver import ORDERS, AnyOrderSettings, Decoder, DecodeSettings, LTRSettings, drive, schedule_named
from packedss.decoding.schedules import LTR_DECODERS, LTR_SCHEDULES, decode_ltr
from packedss.decoding.trace import Decoded, StopCheck
from packedss.decoding.verify import GREEDY, VERIFY_RULES, Sampling, question_seed

__all__ = [
    "ANYORDER_DECODERS",
    "ANYORDER_SCHEDULES",
    "AnyOrderSettings",
    "Call",
    "CallModel",
    "Decoded",
    "Decoder",
    "DecodeSettings",
    "GREEDY",
    "LTRSettings",
    "LTR_DECODERS",
    "LTR_SCHEDULES",
    "ORDERS",
    "Role",
    "SDAR_DECODERS",
    "Sampling",
    "StopCheck",
    "VERIFY_RULES",
    "decode_anyorder",
    "decode_ltr",
    "drive",
    "question_seed",
    "schedule_named",
]
