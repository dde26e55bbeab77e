# Legitimate: requires_grad written through a local layer in __init__.
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def linear_kernel(x_ptr, w_ptr, bias_ptr, y_ptr, M, N, K,
                  stride_xm, stride_xk, stride_wn, stride_wk, stride_ym, stride_yn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  GROUP_M: tl.constexpr):
    # y[m, n] = sum_k x[m, k] * w[n, k] + bias[n]; W is read as its transpose through strides.
    # Tiles are visited in bands of GROUP_M tile-rows so neighbouring programs share tiles in L2.
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    band = pid // (GROUP_M * tiles_n)
    first_m = band * GROUP_M
    band_rows = tl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % (GROUP_M * tiles_n)) % band_rows
    pid_n = (pid % (GROUP_M * tiles_n)) // band_rows
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    x_rows = x_ptr + rows.to(tl.int64)[:, None] * stride_xm
    w_cols = w_ptr + cols.to(tl.int64)[None, :] * stride_wn
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + ks
        x = tl.load(x_rows + k[None, :] * stride_xk, mask=(rows[:, None] < M) & (k[None, :] < K), other=0.0)
        w = tl.load(w_cols + k[:, None] * stride_wk, mask=(k[:, None] < K) & (cols[None, :] < N), other=0.0)
        acc = tl.dot(x, w, acc, input_precision="ieee")
    bias = tl.load(bias_ptr + cols, mask=cols < N, other=0.0)
    acc += bias[None, :]
    y_ptrs = y_ptr + rows.to(tl.int64)[:, None] * stride_ym + cols[None, :] * stride_yn
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=(rows[:, None] < M) & (cols[None, :] < N))


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    in_features = x.shape[-1]
    x2 = x.reshape(-1, in_features)
    M, K = x2.shape
    N = weight.shape[0]
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    block_m, block_n, block_k = 128, 128, 32
    grid = (triton.cdiv(M, block_m) * triton.cdiv(N, block_n),)
    linear_kernel[grid](
        x2, weight, bias, y, M, N, K,
        x2.stride(0), x2.stride(1), weight.stride(0), weight.stride(1), y.stride(0), y.stride(1),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=8, num_warps=8,
    )
    return y.view(*x.shape[:-1], N)


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        lin = nn.Linear(in_features, out_features)
        lin.weight.requires_grad = False
        lin.bias.requires_grad = False
        self.linear = lin

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.linear.weight, self.linear.bias)
