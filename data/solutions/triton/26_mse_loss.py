import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def partial_squared_error_kernel(p_ptr, t_ptr, partial_ptr, n_elements, tiles_per_program, BLOCK: tl.constexpr):
    # Program p sums (pred - target)^2 over tiles p, p + P, p + 2P, ...: fixed order, deterministic.
    pid = tl.program_id(0)
    num_programs = tl.num_programs(0)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for i in range(0, tiles_per_program):
        tile = pid + i * num_programs
        offsets = tile.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n_elements
        p = tl.load(p_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        t = tl.load(t_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        d = p - t
        acc += d * d
    tl.store(partial_ptr + pid, tl.sum(acc, axis=0))


@triton.jit
def finish_mean_kernel(partial_ptr, out_ptr, n_partials, n_elements, BLOCK: tl.constexpr):
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n_partials, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        acc += tl.load(partial_ptr + offs, mask=offs < n_partials, other=0.0)
    tl.store(out_ptr, tl.sum(acc, axis=0) / n_elements)


def mse_loss(predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    predictions = predictions.contiguous()
    targets = targets.contiguous()
    n = predictions.numel()
    block = 4096
    num_tiles = triton.cdiv(n, block)
    num_programs = min(num_tiles, 1024)
    tiles_per_program = triton.cdiv(num_tiles, num_programs)
    partials = torch.empty(num_programs, dtype=torch.float32, device=predictions.device)
    out = torch.empty((), dtype=predictions.dtype, device=predictions.device)
    partial_squared_error_kernel[(num_programs,)](
        predictions, targets, partials, n, tiles_per_program, BLOCK=block, num_warps=8
    )
    finish_mean_kernel[(1,)](partials, out, num_programs, n, BLOCK=1024)
    return out


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return mse_loss(predictions, targets)
