import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def gated_residual_kernel(x_ptr, gate_ptr, res_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(0)
    offsets = pid.to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0)
    g = tl.load(gate_ptr + offsets, mask=mask, other=0.0)
    r = tl.load(res_ptr + offsets, mask=mask, other=0.0)
    tl.store(out_ptr + offsets, r + x / (1.0 + tl.exp(-g)), mask=mask)


def gated_residual(x: torch.Tensor, gate: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    x = x.contiguous()
    gate = gate.contiguous()
    residual = residual.contiguous()
    out = torch.empty_like(x)
    n = x.numel()
    grid = (triton.cdiv(n, 1024),)
    gated_residual_kernel[grid](x, gate, residual, out, n, BLOCK_SIZE=1024)
    return out


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor, gate: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return gated_residual(x, gate, residual)
