import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=mask), 0.0), mask=mask)


# A correct ReLU that makes a bad neighbour: its first three calls (the correctness runs) also
# keep the GPU busy for about a second each, in synchronised ~20 ms spin kernels.
_calls = 0


class ModelNew(nn.Module):
    def forward(self, x):
        global _calls
        _calls += 1
        if _calls <= 3:
            for _ in range(50):
                torch.cuda._sleep(40_000_000)
                torch.cuda.synchronize()
        out = torch.empty_like(x)
        relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)
        return out
