# kernelbench: level1/36_RMSNorm_.py
# RMS normalisation over the feature dimension (dim 1) of a (batch, features, *spatial) tensor:
# x / sqrt(mean(x^2 over features) + eps). Each program owns BLOCK_S spatial positions of one
# batch item; pass 1 sums squares over features, pass 2 writes the scaled values.
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def rms_norm_kernel(x_ptr, out_ptr, C, S, eps, BLOCK_C: tl.constexpr, BLOCK_S: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    sp = tl.program_id(1) * BLOCK_S + tl.arange(0, BLOCK_S)
    sp_mask = sp < S
    base = b * C * S
    acc = tl.zeros([BLOCK_C, BLOCK_S], dtype=tl.float32)
    for c0 in range(0, C, BLOCK_C):
        ch = c0 + tl.arange(0, BLOCK_C)
        offs = base + ch.to(tl.int64)[:, None] * S + sp[None, :]
        mask = (ch[:, None] < C) & sp_mask[None, :]
        x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        acc += x * x
    rms = tl.sqrt(tl.sum(acc, axis=0) / C + eps)
    for c0 in range(0, C, BLOCK_C):
        ch = c0 + tl.arange(0, BLOCK_C)
        offs = base + ch.to(tl.int64)[:, None] * S + sp[None, :]
        mask = (ch[:, None] < C) & sp_mask[None, :]
        x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + offs, (x / rms[None, :]).to(out_ptr.dtype.element_ty), mask=mask)


class ModelNew(nn.Module):
    def __init__(self, num_features: int, eps: float = 1e-5):
        super().__init__()
        self.num_features = num_features
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        batch, channels = x.shape[0], x.shape[1]
        spatial = x.numel() // max(batch * channels, 1)
        out = torch.empty_like(x)
        block_c = min(16, triton.next_power_of_2(channels))
        block_s = min(256, triton.next_power_of_2(spatial))
        grid = (batch, triton.cdiv(spatial, block_s))
        rms_norm_kernel[grid](
            x, out, channels, spatial, self.eps, BLOCK_C=block_c, BLOCK_S=block_s, num_warps=4
        )
        return out
