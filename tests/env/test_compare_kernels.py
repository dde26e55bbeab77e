"""The fused comparison kernels against the PyTorch ops they replace, on values chosen to reach
every branch (mismatches, NaN and infinity on either side, exact infinities, integers, half
precisions): on a CPU under Triton's interpreter (a fresh interpreter, since Triton reads
TRITON_INTERPRET at import), and compiled on a GPU."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
import torch

from kernelrl.env import compare_kernels, information

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
in_interpreter = pytest.mark.skipif(not INTERPRETED, reason="run by test_kernels_under_interpreter")


def _values(
    n: int, dtype: torch.dtype, seed: int, device: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """A reference and an answer that is close, off, NaN or infinite at scattered places."""
    g = torch.Generator().manual_seed(seed)
    ref = torch.randn(n, generator=g, dtype=torch.float64) * 3
    out = ref + torch.randn(n, generator=g, dtype=torch.float64) * 1e-6
    picks = torch.randperm(n, generator=g)
    out[picks[0::11]] += 0.5  # outside the tolerance
    if dtype.is_floating_point:
        out[picks[1::13]] = math.nan
        out[picks[2::17]] = math.inf
        ref[picks[3::19]] = math.nan
        ref[picks[4::23]] = -math.inf
        out[picks[4::46]] = -math.inf  # an infinity matched exactly
        ref[picks[5::29]] = math.inf  # with a finite answer: relative error inf / inf
    else:
        ref, out = ref * 20, out * 20
    ref, out = ref.to(dtype), out.to(dtype)
    return ref.to(device), out.to(device)


def _same(a: torch.Tensor, b: torch.Tensor, loose: tuple[int, ...] = ()) -> None:
    """Equal up to summation order; NaN where NaN. ``loose``: entries computed by a division,
    which Triton does not round correctly in float64 (the reported maximum relative error)."""
    a, b = a.cpu(), b.cpu()
    assert torch.equal(torch.isnan(a), torch.isnan(b)), (a, b)
    for i in range(a.numel()):
        rtol = 1e-7 if i in loose else 1e-12
        torch.testing.assert_close(a[i], b[i], rtol=rtol, atol=0.0, equal_nan=True)


MAX_REL = (compare_kernels.MAX_REL,)  # the maximum relative error, computed by a division
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.uint8]


def _pieces(out: torch.Tensor, ref: torch.Tensor, atol: float, rtol: float) -> torch.Tensor:
    """The kernel's rows of ``out`` cut in three chunks at their offsets, latest first."""
    cuts = [0, out.numel() // 3, out.numel() // 2, out.numel()]
    rows = [
        compare_kernels.triton_chunk_partials(out[a:b], ref[a:b], a, atol, rtol)
        for a, b in zip(cuts, cuts[1:], strict=False)
        if b > a
    ]
    return torch.cat(rows[::-1])


def check_chunk_partials(device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel's rows, combined, are the PyTorch path's one row: whole, and in chunks at
    their offsets combined in any order (the first mismatch and its value included)."""
    monkeypatch.setattr(compare_kernels, "_CHUNK_PROGRAMS", 3)  # every program loops
    combine = compare_kernels.combine
    for seed, dtype in enumerate(DTYPES):
        for n in (1, 700, 5000):
            ref, out = _values(n, dtype, seed, device)
            for atol, rtol in ((1e-4, 1e-4), (1e-2, 0.0)):
                expected = compare_kernels.torch_chunk_partials(out, ref, 0, atol, rtol)[0]
                whole = compare_kernels.triton_chunk_partials(out, ref, 0, atol, rtol)
                _same(combine(whole), expected, MAX_REL)
                _same(combine(_pieces(out, ref, atol, rtol)), expected, MAX_REL)
                assert n == 1 or expected[compare_kernels.FIRST] < n  # a mismatch to find
    ref, out = _values(5000, torch.float32, 9, device)
    bool_ref, bool_out = ref > 0, out > 0.1
    _same(
        combine(compare_kernels.triton_chunk_partials(bool_out, bool_ref, 7, 0.0, 0.0)),
        compare_kernels.torch_chunk_partials(bool_out, bool_ref, 7, 0.0, 0.0)[0],
        MAX_REL,
    )


def _by_kernel(view: torch.Tensor, mean: torch.Tensor | None = None, *, step_elements: int):
    return compare_kernels.triton_group_sums(view, mean)


def check_degenerate_errors(device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every degenerate answer's error, tiled (a small STATS_CHUNK) and not, on contiguous
    and strided references, with non-finite values left out."""
    g = torch.Generator().manual_seed(3)
    base = torch.randn(3, 20, 5, 6, generator=g, dtype=torch.float64)
    base[1, 2, 3, 4] = math.nan
    base[2, 0, 0, 0] = math.inf
    references = [base.float(), base.to(torch.bfloat16), base.transpose(1, 3), base[:, :, 0, :]]
    for chunk, tried in ((64, references[:1]), (2**23, references)):
        monkeypatch.setattr(information, "STATS_CHUNK", chunk)
        for ref in tried:
            ref = ref.to(device)
            monkeypatch.setattr(information, "group_sums", _by_kernel)
            fused = information.degenerate_errors(ref)
            monkeypatch.setattr(information, "group_sums", compare_kernels.torch_group_sums)
            _same(fused, information.degenerate_errors(ref))


@in_interpreter
def test_chunk_partials_match_pytorch(monkeypatch: pytest.MonkeyPatch) -> None:
    check_chunk_partials("cpu", monkeypatch)


@in_interpreter
def test_degenerate_errors_match_pytorch(monkeypatch: pytest.MonkeyPatch) -> None:
    check_degenerate_errors("cpu", monkeypatch)


@pytest.mark.skipif(INTERPRETED, reason="this is the interpreter's run")
def test_kernels_under_interpreter() -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "2 passed" in run.stdout, run.stdout[-2000:]


@pytest.mark.gpu
@pytest.mark.skipif(INTERPRETED or not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_compiled_kernels_match_pytorch(monkeypatch: pytest.MonkeyPatch) -> None:
    check_chunk_partials("cuda", monkeypatch)
    check_degenerate_errors("cuda", monkeypatch)
    assert compare_kernels.fused(torch.zeros(1, device="cuda"))
