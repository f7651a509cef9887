"""`dynamiq.lossless_stats`: per-tensor report of lossless mode's coding,
checked against a NumPy oracle of the exponent entropy and the order-0 bounds."""

import numpy as np
import pytest
import torch

import dynamiq

# (dtype, integer view, exponent shift, exponent mask, sign+mantissa bits, total bits)
FORMATS = [
    (torch.float32, torch.int32, 23, 0xFF, 24, 32),
    (torch.bfloat16, torch.int16, 7, 0xFF, 8, 16),
    (torch.float16, torch.int16, 10, 0x1F, 11, 16),
]


def exponent_entropy(t, view, shift, mask):
    bits = t.contiguous().view(view).numpy().astype(np.int64) & ((1 << (8 * t.element_size())) - 1)
    e = (bits >> shift) & mask
    p = np.bincount(e.ravel(), minlength=mask + 1) / e.size
    p = p[p > 0]
    return float(-(p * np.log2(p)).sum())


@pytest.mark.parametrize("dtype,view,shift,mask,keep,total", FORMATS)
def test_entropy_matches_oracle_and_ratio_within_order0_bounds(dtype, view, shift, mask, keep, total):
    g = torch.Generator().manual_seed(0)
    # gradient-like: Gaussian with a log-normal scale per 256 values (exponents spread)
    x = torch.randn(1 << 20, generator=g) * torch.exp(torch.randn(4096, generator=g)).repeat_interleave(256)
    x = (x * 1e-3).to(dtype)
    block_bytes = (1 << 20) * x.element_size() // 8  # 8 equal blocks
    s = dynamiq.lossless_stats(x, block_bytes=block_bytes)
    assert s["numel"] == x.numel() and s["raw_bytes"] == x.numel() * x.element_size()
    assert s["exponent_entropy"] == pytest.approx(exponent_entropy(x, view, shift, mask), rel=1e-9)
    hb = s["block_exponent_entropy"]
    assert hb <= s["exponent_entropy"] + 1e-9  # a block never has more entropy than the mix
    # A prefix code per block cannot beat the block's order-0 entropy; Huffman is within 1 bit
    # of it (plus tables and headers, well under 0.1 bit per value at this block size).
    assert s["exponent_bits"] >= hb - 1e-9
    assert s["exponent_bits"] <= hb + 1.0
    assert (keep + hb) / total <= s["ratio"] <= (keep + hb + 1.1) / total
    assert s["coded_bytes"] == pytest.approx(s["ratio"] * s["raw_bytes"])
    assert sum(s["blocks_by_format"].values()) == s["blocks"] == 8


def test_constant_exponent_and_incompressible_blocks():
    ones = torch.ones(1 << 16, dtype=torch.bfloat16)
    s = dynamiq.lossless_stats(ones, block_bytes=1 << 15)
    assert s["exponent_entropy"] == 0.0 and s["blocks_by_format"]["const"] == s["blocks"]
    assert s["ratio"] < 0.51  # sign/mantissa (8 of 16 bits) plus headers
    g = torch.Generator().manual_seed(1)
    noise = torch.randint(-2**31, 2**31 - 1, (1 << 16,), generator=g, dtype=torch.int64).to(torch.int32).view(torch.float32)
    s = dynamiq.lossless_stats(noise, block_bytes=1 << 16)
    assert s["blocks_by_format"]["plain"] == s["blocks"]  # random bit patterns: sent raw
    assert 1.0 <= s["ratio"] <= 1.0 + 16 * s["blocks"] / s["raw_bytes"] + 1e-12  # raw + 16-byte headers


def test_bad_input_raises():
    with pytest.raises(dynamiq.DynamiqError, match="dtype"):
        dynamiq.lossless_stats(torch.zeros(10, dtype=torch.int64))
    with pytest.raises(dynamiq.DynamiqError, match="contiguous"):
        dynamiq.lossless_stats(torch.zeros(10, 10).t())
