import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def channel_affine_kernel(x_ptr, scale_ptr, shift_ptr, out_ptr, n_elements, channels, plane_size,
                          BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(0)
    offsets = pid.to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    # NCHW layout: the channel of a flat index is (index // (H * W)) % C.
    c = (offsets // plane_size) % channels
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0)
    s = tl.load(scale_ptr + c, mask=mask, other=0.0)
    b = tl.load(shift_ptr + c, mask=mask, other=0.0)
    tl.store(out_ptr + offsets, x * s + b, mask=mask)


def channel_affine(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    x = x.contiguous()
    scale = scale.contiguous()
    shift = shift.contiguous()
    out = torch.empty_like(x)
    n = x.numel()
    channels = x.shape[1]
    plane_size = x.shape[2] * x.shape[3]
    grid = (triton.cdiv(n, 1024),)
    channel_affine_kernel[grid](x, scale, shift, out, n, channels, plane_size, BLOCK_SIZE=1024)
    return out


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
        return channel_affine(x, scale, shift)
