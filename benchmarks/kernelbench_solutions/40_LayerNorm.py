# kernelbench: level1/40_LayerNorm.py
# LayerNorm over the trailing normalized_shape (64*256*256 = 4M elements a row, 16 rows): too
# few rows for one program per row, so three kernels:
#   1. per chunk of CHUNK elements of a row: its mean and centred sum of squares (M2);
#   2. per row: Chan's combination of the chunk statistics -> mean and 1/sqrt(var + eps);
#   3. elementwise (x - mean) * rstd * weight + bias over the whole tensor.
# Centred partial statistics keep the variance accurate in fp32 (no E[x^2] - E[x]^2).
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def chunk_stats_kernel(x_ptr, mean_ptr, m2_ptr, N, n_chunks, CHUNK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    cols = chunk.to(tl.int64) * CHUNK + tl.arange(0, CHUNK)
    mask = cols < N
    x = tl.load(x_ptr + row * N + cols, mask=mask, other=0.0).to(tl.float32)
    count = tl.minimum(N - chunk.to(tl.int64) * CHUNK, CHUNK).to(tl.float32)
    mean = tl.sum(x, axis=0) / count
    d = tl.where(mask, x - mean, 0.0)
    m2 = tl.sum(d * d, axis=0)
    tl.store(mean_ptr + row * n_chunks + chunk, mean)
    tl.store(m2_ptr + row * n_chunks + chunk, m2)


@triton.jit
def row_stats_kernel(
    mean_ptr,
    m2_ptr,
    row_mean_ptr,
    row_rstd_ptr,
    N,
    n_chunks,
    eps,
    CHUNK: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    # Pass 1: the row mean as the count-weighted mean of chunk means.
    wsum = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n_chunks, BLOCK):
        idx = start + tl.arange(0, BLOCK)
        mask = idx < n_chunks
        cm = tl.load(mean_ptr + row * n_chunks + idx, mask=mask, other=0.0)
        cnt = tl.minimum(N - idx.to(tl.int64) * CHUNK, CHUNK).to(tl.float32)
        wsum += tl.where(mask, cm * cnt, 0.0)
    mean = tl.sum(wsum, axis=0) / N
    # Pass 2: total M2 = sum of chunk M2 + count * (chunk mean - row mean)^2.
    m2sum = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n_chunks, BLOCK):
        idx = start + tl.arange(0, BLOCK)
        mask = idx < n_chunks
        cm = tl.load(mean_ptr + row * n_chunks + idx, mask=mask, other=0.0)
        cm2 = tl.load(m2_ptr + row * n_chunks + idx, mask=mask, other=0.0)
        cnt = tl.minimum(N - idx.to(tl.int64) * CHUNK, CHUNK).to(tl.float32)
        dm = cm - mean
        m2sum += tl.where(mask, cm2 + cnt * dm * dm, 0.0)
    var = tl.sum(m2sum, axis=0) / N
    tl.store(row_mean_ptr + row, mean)
    tl.store(row_rstd_ptr + row, 1.0 / tl.sqrt(var + eps))


@triton.jit
def normalize_kernel(
    x_ptr, w_ptr, b_ptr, row_mean_ptr, row_rstd_ptr, out_ptr, N, BLOCK: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < N
    mean = tl.load(row_mean_ptr + row)
    rstd = tl.load(row_rstd_ptr + row)
    x = tl.load(x_ptr + row * N + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = (x - mean) * rstd * w + b
    tl.store(out_ptr + row * N + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


class ModelNew(nn.Module):
    def __init__(self, normalized_shape: tuple):
        super().__init__()
        # Same parameters (and initialisation) as the reference's nn.LayerNorm; only its
        # weight, bias and eps are read, the module itself is never called.
        self.ln = nn.LayerNorm(normalized_shape=normalized_shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        n = self.ln.weight.numel()
        rows = x.numel() // n
        chunk = 4096
        n_chunks = triton.cdiv(n, chunk)
        chunk_mean = torch.empty((rows, n_chunks), dtype=torch.float32, device=x.device)
        chunk_m2 = torch.empty((rows, n_chunks), dtype=torch.float32, device=x.device)
        row_mean = torch.empty((rows,), dtype=torch.float32, device=x.device)
        row_rstd = torch.empty((rows,), dtype=torch.float32, device=x.device)
        out = torch.empty_like(x)
        chunk_stats_kernel[(rows, n_chunks)](
            x, chunk_mean, chunk_m2, n, n_chunks, CHUNK=chunk, num_warps=8
        )
        row_stats_kernel[(rows,)](
            chunk_mean,
            chunk_m2,
            row_mean,
            row_rstd,
            n,
            n_chunks,
            self.ln.eps,
            CHUNK=chunk,
            BLOCK=1024,
            num_warps=4,
        )
        block = 2048
        normalize_kernel[(rows, triton.cdiv(n, block))](
            x,
            self.ln.weight,
            self.ln.bias,
            row_mean,
            row_rstd,
            out,
            n,
            BLOCK=block,
            num_warps=8,
        )
        return out
