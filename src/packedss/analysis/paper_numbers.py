"""The paper's published numbers, transcribed from `paper/packed-ss-paper.txt` (appendix Tables
2-13) for `--compare-paper`. The stored paper text shows some tables only in part (e.g. Table 6
lists Nemotron 3B MBPP and HumanEval only); exactly the rows it shows are transcribed here, with
the paper's column names. Keys: "Model" and "Task" name the paper's setting where the table's
caption or group header gives it; paired values are (estimate, CI low, CI high).
"""

from __future__ import annotations

N8B, N3B, SETDLM, GSM8K = "Nemotron 8B", "Nemotron 3B", "SetDLM 1.7B", "GSM8K"
L, Q, P, NAT = "Linear-SS", "Quadratic-SS", "Packed-SS", "Native"

# Table 2: execution cost per iteration (formulas; SetDLM maxima take u_t = W and p = 1).
TABLE2 = [
    {"Method": L, "NFE/iteration": 2, "Nemotron": "2B", "SetDLM W=8": 25, "SetDLM W=16": 49, "SetDLM general": "p+3u_t"},
    {"Method": Q, "NFE/iteration": 1, "Nemotron": "B(B+1)", "SetDLM W=8": 81, "SetDLM W=16": 289, "SetDLM general": "p+2u_t+u_t^2"},
    {"Method": P, "NFE/iteration": 1, "Nemotron": "2B", "SetDLM W=8": 25, "SetDLM W=16": 49, "SetDLM general": "p+3u_t"},
]


def _rows(columns: tuple[str, ...], fixed: dict, values: list[tuple]) -> list[dict]:
    return [fixed | dict(zip(columns, row, strict=True)) for row in values]


# Table 3: Nemotron 8B GSM8K block-size probe (ten questions).
TABLE3 = _rows(
    ("Method", "B", "Tokens/s", "Rows/call", "Wall (s)", "Total NFE", "Tokens", "Accuracy (%)"),
    {"Model": N8B, "Task": GSM8K},
    [
        (L, 8, 94.9, 8, 2.824, 98.2, 267.9, 100.0),
        (L, 16, 113.4, 16, 2.448, 84.6, 277.5, 100.0),
        (L, 32, 121.9, 32, 2.237, 77.4, 272.8, 100.0),
        (P, 8, 94.8, 16, 2.798, 89.0, 265.2, 100.0),
        (P, 16, 123.5, 32, 2.315, 73.3, 285.9, 100.0),
        (P, 32, 128.5, 64, 2.333, 75.4, 299.7, 90.0),
    ],
)

# Table 4: Nemotron 8B GSM8K with proposal-only LoRA (n = 1,319).
TABLE4 = _rows(
    ("Method", "Tokens", "Total NFE", "Model (s)", "Non-model (s)", "Wall (s)", "Tokens/s", "Accuracy (%)"),
    {"Model": N8B, "Task": GSM8K},
    [
        (L, 272.2, 55.04, 1.561, 0.137, 1.698, 160.32, 85.90),
        (Q, 273.3, 54.44, 1.781, 0.343, 2.123, 128.72, 86.35),
        (P, 274.2, 48.44, 1.570, 0.179, 1.749, 156.78, 85.82),
    ],
)

# Table 5: Nemotron 8B GSM8K model execution time per iteration (Increase in %).
TABLE5 = _rows(
    ("Method", "Query rows", "Selected", "Evaluated", "Base ms", "LoRA ms", "Increase"),
    {"Model": N8B, "Task": GSM8K},
    [
        (L, "32+32", 32, 32, 54.41, 56.77, 4.3),
        (Q, "72", 64, 72, 28.90, 32.69, 13.1),
        (P, "64", 32, 64, 28.58, 32.37, 13.3),
    ],
)

_ABS = ("Task", "Method", "Tokens/s", "Tokens/NFE", "Time/NFE (ms)", "Accuracy (%)", "Tokens", "Wall (s)", "NFE")

# Table 6: Nemotron absolute measurements at temperature 0.
TABLE6 = _rows(
    _ABS,
    {"Model": N3B},
    [
        ("MBPP", L, 173.46, 3.757, 21.658, 74.87, 65.8, 0.379, 17.50),
        ("MBPP", Q, 164.38, 4.288, 26.089, 74.34, 65.9, 0.401, 15.36),
        ("MBPP", P, 181.10, 4.312, 23.812, 74.60, 67.0, 0.370, 15.53),
        ("HumanEval", L, 237.45, 5.158, 21.722, 79.27, 90.5, 0.381, 17.55),
        ("HumanEval", Q, 211.48, 5.536, 26.177, 79.88, 91.1, 0.431, 16.46),
    ],
)

# Table 7: Nemotron absolute measurements at temperature 1.
TABLE7 = _rows(
    _ABS,
    {"Model": N3B},
    [
        ("MBPP", L, 120.38, 2.508, 20.834, 68.14, 102.7, 0.853, 40.95),
        ("MBPP", Q, 129.01, 3.328, 25.800, 69.69, 108.7, 0.843, 32.67),
        ("MBPP", P, 125.06, 2.933, 23.454, 68.78, 101.8, 0.814, 34.72),
        ("HumanEval", L, 169.58, 3.526, 20.792, 66.89, 96.9, 0.571, 27.49),
        ("HumanEval", Q, 170.63, 4.348, 25.484, 67.29, 95.6, 0.561, 22.00),
    ],
)

_WIN = ("Window", "Method", "Tokens/s", "Tokens/NFE", "Time/NFE (ms)", "Accuracy (%)", "Tokens", "Wall (s)", "NFE")

# Table 8: SetDLM absolute measurements on GSM8K (LTR verification and native decoding).
TABLE8 = _rows(
    _WIN,
    {"Model": SETDLM, "Task": GSM8K},
    [
        ("W=8", L, 94.93, 2.610, 27.496, 68.39, 257.2, 2.709, 98.53),
        ("W=8", Q, 86.25, 3.414, 39.583, 68.39, 257.1, 2.981, 75.31),
        ("W=8", P, 100.60, 2.842, 28.247, 68.39, 257.2, 2.556, 90.49),
        ("W=8", NAT, 77.21, 2.119, 27.442, 59.67, 252.4, 3.269, 119.11),
        ("W=16", L, 98.85, 2.792, 28.243, 66.57, 259.9, 2.629, 93.09),
        ("W=16", Q, 41.60, 4.074, 97.934, 66.57, 260.4, 6.260, 63.92),
    ],
)

# Table 9: SetDLM measurements on GSM8K; the stored text shows the top (LTR) part only.
TABLE9 = _rows(
    _WIN,
    {"Model": SETDLM, "Task": GSM8K, "Order": "LTR verification and native decoding"},
    [
        ("W=8", L, 94.93, 2.610, 27.496, 68.39, 257.2, 2.709, 98.53),
        ("W=8", Q, 86.25, 3.414, 39.583, 68.39, 257.1, 2.981, 75.31),
        ("W=8", P, 100.60, 2.842, 28.247, 68.39, 257.2, 2.556, 90.49),
        ("W=8", NAT, 77.21, 2.119, 27.442, 59.67, 252.4, 3.269, 119.11),
        ("W=16", L, 98.85, 2.792, 28.243, 66.57, 259.9, 2.629, 93.09),
    ],
)

_PAIRED = ("Setting", "Baseline", "Δ wall (s)", "Throughput ratio")

# Table 10: paired SetDLM efficiency comparisons (Packed-SS minus / over baseline).
TABLE10 = _rows(
    _PAIRED,
    {"Model": SETDLM, "Task": GSM8K},
    [
        ("W=8 LTR", L, (-0.1529, -0.1588, -0.1470), (1.060, 1.058, 1.062)),
        ("W=8 LTR", Q, (-0.4248, -0.4377, -0.4124), (1.166, 1.164, 1.169)),
        ("W=8 Confidence", L, (-0.2581, -0.2953, -0.2217), (1.102, 1.098, 1.107)),
        ("W=8 Confidence", Q, (-0.3521, -0.3836, -0.3198), (1.140, 1.136, 1.143)),
        ("W=16 LTR", L, (-0.0382, -0.0432, -0.0330), (1.015, 1.013, 1.017)),
        ("W=16 LTR", Q, (-3.6686, -3.7869, -3.5590), (2.411, 2.399, 2.424)),
    ],
)

# Table 11: paired Nemotron accuracy differences (percentage points); the stored text shows
# the temperature-0 part only.
TABLE11 = _rows(
    ("Setting", "Packed-SS − Linear-SS", "Packed-SS − Quadratic-SS", "Linear-SS − Quadratic-SS"),
    {"Temperature": "Temperature 0"},
    [
        ("3B MBPP", (-0.26, -1.32, 0.79), (0.26, -0.79, 1.32), (0.53, -0.53, 1.59)),
        ("3B HumanEval", (-1.22, -3.66, 1.22), (-1.83, -4.27, 0.00), (-0.61, -1.83, 0.00)),
        ("3B GSM8K", (-0.30, -1.14, 0.53), (-0.15, -0.99, 0.68), (0.15, -0.68, 0.99)),
        ("3B MATH-500", (3.00, 0.80, 5.20), (0.20, -1.60, 2.00), (-2.80, -4.60, -1.00)),
        ("8B MBPP", (-0.26, -1.59, 0.79), (0.00, -0.79, 0.79), (0.26, -0.53, 1.06)),
    ],
)

# Table 12: paired Nemotron efficiency comparisons at temperature 0.
TABLE12 = _rows(
    _PAIRED,
    {},
    [
        ("3B MBPP", L, (-0.0092, -0.0268, 0.0123), (1.044, 1.007, 1.075)),
        ("3B MBPP", Q, (-0.0308, -0.0563, -0.0027), (1.102, 1.079, 1.127)),
        ("3B HumanEval", L, (-0.0207, -0.0341, -0.0100), (1.052, 1.033, 1.072)),
        ("3B HumanEval", Q, (-0.0703, -0.0886, -0.0539), (1.181, 1.149, 1.213)),
        ("3B GSM8K", L, (-0.0434, -0.0605, -0.0243), (1.061, 1.049, 1.071)),
        ("3B GSM8K", Q, (-0.1003, -0.1187, -0.0798), (1.114, 1.103, 1.125)),
    ],
)

# Table 13: paired Nemotron efficiency comparisons at temperature 1.
TABLE13 = _rows(
    _PAIRED,
    {},
    [
        ("3B MBPP", L, (-0.0389, -0.0678, -0.0107), (1.039, 1.026, 1.052)),
        ("3B MBPP", Q, (-0.0287, -0.0832, 0.0248), (0.969, 0.956, 0.984)),
        ("3B HumanEval", L, (-0.0076, -0.0250, 0.0093), (1.021, 1.005, 1.038)),
        ("3B HumanEval", Q, (0.0033, -0.0121, 0.0189), (1.015, 0.997, 1.034)),
        ("3B GSM8K", L, (-0.0227, -0.0832, 0.0387), (1.020, 1.001, 1.037)),
        ("3B GSM8K", Q, (0.0000, -0.0640, 0.0652), (0.996, 0.979, 1.013)),
    ],
)

PAPER_TABLES = {
    2: TABLE2, 3: TABLE3, 4: TABLE4, 5: TABLE5, 6: TABLE6, 7: TABLE7, 8: TABLE8,
    9: TABLE9, 10: TABLE10, 11: TABLE11, 12: TABLE12, 13: TABLE13,
}  # fmt: skip
