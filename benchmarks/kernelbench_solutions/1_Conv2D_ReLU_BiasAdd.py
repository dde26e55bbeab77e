# kernelbench: level2/1_Conv2D_ReLU_BiasAdd.py
# Fused relu(conv2d(x, W) + conv_bias) + bias in one kernel (stride 1, no padding, as the task's
# nn.Conv2d). Implicit GEMM per batch item: out[oc, p] = sum_r W[oc, r] * X[r, p] with
# r = (ic, kh, kw), p = (oh, ow) flattened and X gathered on the fly; tl.dot in "ieee" precision
# for fp32 accuracy; the epilogue adds the conv bias, applies ReLU and adds the extra bias.
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def conv2d_relu_bias_kernel(
    x_ptr,
    w_ptr,
    conv_bias_ptr,
    bias_ptr,
    out_ptr,
    C_in,
    H,
    W,
    C_out,
    OH,
    OW,
    KH,
    KW,
    BLOCK_OC: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    pid_p = tl.program_id(0)
    pid_oc = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    P = OH * OW
    oc = pid_oc * BLOCK_OC + tl.arange(0, BLOCK_OC)
    p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
    oc_mask = oc < C_out
    p_mask = p < P
    oh = p // OW
    ow = p % OW
    KK = KH * KW
    R = C_in * KK
    x_base = x_ptr + b * C_in * H * W
    acc = tl.zeros([BLOCK_OC, BLOCK_P], dtype=tl.float32)
    for r0 in range(0, R, BLOCK_R):
        r = r0 + tl.arange(0, BLOCK_R)
        r_mask = r < R
        ic = r // KK
        kh = (r % KK) // KW
        kw = r % KW
        w = tl.load(
            w_ptr + oc.to(tl.int64)[:, None] * R + r[None, :],
            mask=oc_mask[:, None] & r_mask[None, :],
            other=0.0,
        )
        ih = oh[None, :] + kh[:, None]
        iw = ow[None, :] + kw[:, None]
        x_offs = (ic.to(tl.int64)[:, None] * H + ih) * W + iw
        xv = tl.load(x_base + x_offs, mask=r_mask[:, None] & p_mask[None, :], other=0.0)
        acc = tl.dot(w, xv, acc, input_precision="ieee")
    conv_bias = tl.load(conv_bias_ptr + oc, mask=oc_mask, other=0.0).to(tl.float32)
    bias = tl.load(bias_ptr + oc, mask=oc_mask, other=0.0).to(tl.float32)
    y = tl.maximum(acc + conv_bias[:, None], 0.0) + bias[:, None]
    out_ptrs = out_ptr + (b * C_out + oc.to(tl.int64))[:, None] * P + p[None, :]
    tl.store(out_ptrs, y.to(out_ptr.dtype.element_ty), mask=oc_mask[:, None] & p_mask[None, :])


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, bias_shape):
        super().__init__()
        # Same parameters, created in the same order as the reference (same initial values);
        # the conv module only holds the weight and bias, it is never called.
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.bias = nn.Parameter(torch.randn(bias_shape))

    def forward(self, x):
        x = x.contiguous()
        w = self.conv.weight.contiguous()
        batch, c_in, h, wd = x.shape
        c_out, _, kh, kw = w.shape
        oh, ow = h - kh + 1, wd - kw + 1
        out = torch.empty((batch, c_out, oh, ow), dtype=x.dtype, device=x.device)
        block_oc, block_p, block_r = 64, 128, 32
        grid = (triton.cdiv(oh * ow, block_p), triton.cdiv(c_out, block_oc), batch)
        conv2d_relu_bias_kernel[grid](
            x,
            w,
            self.conv.bias,
            self.bias.contiguous(),
            out,
            c_in,
            h,
            wd,
            c_out,
            oh,
            ow,
            kh,
            kw,
            BLOCK_OC=block_oc,
            BLOCK_P=block_p,
            BLOCK_R=block_r,
            num_warps=4,
            num_stages=3,
        )
        return out
