import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def group_norm_kernel(x_ptr, w_ptr, b_ptr, out_ptr, channels, channels_per_group, plane_size, eps,
                      BLOCK: tl.constexpr):
    # One program per (sample, group); the group's channels are contiguous in NCHW memory.
    pid = tl.program_id(0)
    num_groups = channels // channels_per_group
    g = pid % num_groups
    group_size = channels_per_group * plane_size
    base = pid.to(tl.int64) * group_size
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, group_size, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + base + offs, mask=offs < group_size, other=0.0).to(tl.float32)
    mean = tl.sum(acc, axis=0) / group_size
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, group_size, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < group_size
        x = tl.load(x_ptr + base + offs, mask=mask, other=0.0).to(tl.float32)
        d = tl.where(mask, x - mean, 0.0)
        acc += d * d
    rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / group_size + eps)
    for start in range(0, group_size, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < group_size
        c = g * channels_per_group + offs // plane_size
        x = tl.load(x_ptr + base + offs, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + c, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + c, mask=mask, other=0.0).to(tl.float32)
        y = (x - mean) * rstd * w + b
        tl.store(out_ptr + base + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def group_norm(x: torch.Tensor, num_groups: int, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.contiguous()
    batch, channels = x.shape[0], x.shape[1]
    plane_size = x.numel() // (batch * channels)
    out = torch.empty_like(x)
    group_size = (channels // num_groups) * plane_size
    block = min(triton.next_power_of_2(group_size), 4096)
    group_norm_kernel[(batch * num_groups,)](
        x, weight, bias, out, channels, channels // num_groups, plane_size, eps, BLOCK=block, num_warps=8
    )
    return out


class ModelNew(nn.Module):
    def __init__(self, num_groups: int, num_channels: int):
        super().__init__()
        self.norm = nn.GroupNorm(num_groups, num_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return group_norm(x, self.norm.num_groups, self.norm.weight, self.norm.bias, self.norm.eps)
