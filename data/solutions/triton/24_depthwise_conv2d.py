import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def depthwise_conv2d_kernel(x_ptr, w_ptr, b_ptr, out_ptr, C, H, W, OH, OW,
                            STRIDE: tl.constexpr, PAD: tl.constexpr, KH: tl.constexpr, KW: tl.constexpr,
                            BLOCK: tl.constexpr):
    # One program per (image plane n*C + c, block of output pixels); each channel has its own filter.
    plane = tl.program_id(0)
    pid = tl.program_id(1)
    c = plane % C
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    out_mask = offs < OH * OW
    oh = offs // OW
    ow = offs % OW
    x_plane = x_ptr + plane.to(tl.int64) * H * W
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for kh in tl.static_range(KH):
        for kw in tl.static_range(KW):
            ih = oh * STRIDE - PAD + kh
            iw = ow * STRIDE - PAD + kw
            ok = out_mask & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
            x = tl.load(x_plane + ih * W + iw, mask=ok, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + c * (KH * KW) + kh * KW + kw).to(tl.float32)
            acc += x * w
    acc += tl.load(b_ptr + c).to(tl.float32)
    tl.store(out_ptr + plane.to(tl.int64) * OH * OW + offs, acc.to(out_ptr.dtype.element_ty), mask=out_mask)


def depthwise_conv2d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, stride: int, padding: int) -> torch.Tensor:
    x = x.contiguous()
    weight = weight.contiguous()
    N, C, H, W = x.shape
    KH, KW = weight.shape[2], weight.shape[3]
    OH = (H + 2 * padding - KH) // stride + 1
    OW = (W + 2 * padding - KW) // stride + 1
    out = torch.empty((N, C, OH, OW), dtype=x.dtype, device=x.device)
    block = min(triton.next_power_of_2(OH * OW), 1024)
    grid = (N * C, triton.cdiv(OH * OW, block))
    depthwise_conv2d_kernel[grid](
        x, weight, bias, out, C, H, W, OH, OW,
        STRIDE=stride, PAD=padding, KH=KH, KW=KW, BLOCK=block, num_warps=4,
    )
    return out


class ModelNew(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, kernel_size=3, padding=1, groups=channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return depthwise_conv2d(x, self.conv.weight, self.conv.bias, self.conv.stride[0], self.conv.padding[0])
