# kernelbench: level1/67_conv_standard_1D.py
# 1D convolution (stride, padding, dilation; groups=1) as an implicit GEMM: for one batch item,
# out[oc, l] = sum_r W[oc, r] * X[r, l] with r = (ic, k) and X[r, l] = x[ic, l*stride + k*dil - pad]
# gathered on the fly (zero outside the input). tl.dot in "ieee" precision for fp32 accuracy.
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def conv1d_kernel(
    x_ptr,
    w_ptr,
    bias_ptr,
    out_ptr,
    C_in,
    L_in,
    C_out,
    L_out,
    KS,
    stride,
    padding,
    dilation,
    HAS_BIAS: tl.constexpr,
    BLOCK_OC: tl.constexpr,
    BLOCK_L: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    pid_l = tl.program_id(0)
    pid_oc = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    oc = pid_oc * BLOCK_OC + tl.arange(0, BLOCK_OC)
    lo = pid_l * BLOCK_L + tl.arange(0, BLOCK_L)
    oc_mask = oc < C_out
    lo_mask = lo < L_out
    R = C_in * KS
    x_base = x_ptr + b * C_in * L_in
    acc = tl.zeros([BLOCK_OC, BLOCK_L], dtype=tl.float32)
    for r0 in range(0, R, BLOCK_R):
        r = r0 + tl.arange(0, BLOCK_R)
        r_mask = r < R
        ic = r // KS
        kk = r % KS
        w = tl.load(
            w_ptr + oc.to(tl.int64)[:, None] * R + r[None, :],
            mask=oc_mask[:, None] & r_mask[None, :],
            other=0.0,
        )
        pos = lo[None, :] * stride + kk[:, None] * dilation - padding
        x_mask = r_mask[:, None] & lo_mask[None, :] & (pos >= 0) & (pos < L_in)
        xv = tl.load(x_base + ic.to(tl.int64)[:, None] * L_in + pos, mask=x_mask, other=0.0)
        acc = tl.dot(w, xv, acc, input_precision="ieee")
    if HAS_BIAS:
        acc += tl.load(bias_ptr + oc, mask=oc_mask, other=0.0).to(tl.float32)[:, None]
    out_ptrs = out_ptr + (b * C_out + oc.to(tl.int64))[:, None] * L_out + lo[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=oc_mask[:, None] & lo_mask[None, :])


class ModelNew(nn.Module):
    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        stride: int = 1,
        padding: int = 0,
        dilation: int = 1,
        groups: int = 1,
        bias: bool = False,
    ):
        super().__init__()
        if groups != 1:
            raise ValueError("this kernel implements groups=1 only")
        # Holds the weight (and bias) with the reference's shapes and initialisation; the
        # module itself is never called.
        self.conv1d = nn.Conv1d(
            in_channels,
            out_channels,
            kernel_size,
            stride=stride,
            padding=padding,
            dilation=dilation,
            groups=groups,
            bias=bias,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        w = self.conv1d.weight.contiguous()
        bias = self.conv1d.bias
        batch, c_in, l_in = x.shape
        c_out, _, ks = w.shape
        stride = self.conv1d.stride[0]
        padding = self.conv1d.padding[0]
        dilation = self.conv1d.dilation[0]
        l_out = (l_in + 2 * padding - dilation * (ks - 1) - 1) // stride + 1
        out = torch.empty((batch, c_out, l_out), dtype=x.dtype, device=x.device)
        block_oc, block_l, block_r = 64, 128, 32
        grid = (triton.cdiv(l_out, block_l), triton.cdiv(c_out, block_oc), batch)
        conv1d_kernel[grid](
            x,
            w,
            bias if bias is not None else w,
            out,
            c_in,
            l_in,
            c_out,
            l_out,
            ks,
            stride,
            padding,
            dilation,
            HAS_BIAS=bias is not None,
            BLOCK_OC=block_oc,
            BLOCK_L=block_l,
            BLOCK_R=block_r,
            num_warps=4,
            num_stages=3,
        )
        return out
