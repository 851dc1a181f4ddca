"""Storage formats: bytes per element of KV-cache and weight formats (group metadata included)."""

from __future__ import annotations

from fractions import Fraction

# KV formats: bytes per stored element. GGML q8_0: 32 values -> 32 B codes + 2 B scale (34/64 of
# BF16); q4_0: 32 values -> 16 B + 2 B (18/64 of BF16). Reference section 7.
KV_FORMATS: dict[str, Fraction] = {
    "bf16": Fraction(2),
    "fp16": Fraction(2),
    "fp32": Fraction(4),
    "fp8": Fraction(1),
    "q8_0": Fraction(34, 32),
    "q4_0": Fraction(18, 32),
}

# Weight formats: bytes per matrix element. int4 is group-quantised (4-bit codes plus one
# 16-bit scale per group of 128); nvfp4 (NVIDIA's FP4, E2M1) stores one FP8 (E4M3) scale per block of 16
# values (4.5 bits/value; the per-tensor FP32 scale is not counted); mxfp4 (the OCP microscaling FP4 of
# gpt-oss's experts) one 8-bit power-of-two scale per 32 (4.25 bits/value); GGML Q2_K stores 256 values in 84 B
# (2.625 bits/value).
WEIGHT_FORMATS: dict[str, Fraction] = {
    "fp32": Fraction(4),
    "bf16": Fraction(2),
    "fp16": Fraction(2),
    "fp8": Fraction(1),
    "int4": Fraction(1, 2) + Fraction(2, 128),
    "nvfp4": Fraction(1, 2) + Fraction(1, 16),  # NVIDIA FP4: 4-bit values plus one FP8 scale per 16
    "mxfp4": Fraction(1, 2) + Fraction(1, 32),  # OCP MX FP4: 4-bit values plus one E8M0 scale per 32 (gpt-oss)
    "q2_k": Fraction(84, 256),
}


def kv_bytes_per_element(fmt: str) -> Fraction:
    """Bytes per KV cache element in format `fmt` (bf16, fp8, q8_0, ...), exact as a Fraction."""
    try:
        return KV_FORMATS[fmt]
    except KeyError:
        raise ValueError(f"unknown KV format {fmt!r}; known: {', '.join(KV_FORMATS)}") from None


def weight_bytes_per_element(fmt: str) -> Fraction:
    """Bytes per weight in format `fmt` (bf16, fp8, int4, ...), exact as a Fraction."""
    try:
        return WEIGHT_FORMATS[fmt]
    except KeyError:
        raise ValueError(f"unknown weight format {fmt!r}; known: {', '.join(WEIGHT_FORMATS)}") from None
