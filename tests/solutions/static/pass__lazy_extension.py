# backend: cuda
# Legitimate: the extension is compiled lazily and kept in a module global; it launches on the
# current stream.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
// cudaStreamCreate would be a side stream; this comment must not count.
__global__ void relu_kernel(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] > 0.f ? x[i] : 0.f;
}
torch::Tensor relu(torch::Tensor x) {
    auto y = torch::empty_like(x);
    auto stream = at::cuda::getCurrentCUDAStream();
    relu_kernel<<<(x.numel() + 255) / 256, 256, 0, stream>>>(x.data_ptr<float>(), y.data_ptr<float>(), x.numel());
    return y;
}
"""
_ext = None


def extension():
    global _ext
    if _ext is None:
        _ext = load_inline(name="lazy_relu_ext", cpp_sources="torch::Tensor relu(torch::Tensor x);", cuda_sources=source, functions=["relu"])
    return _ext


class ModelNew(nn.Module):
    def forward(self, x):
        return extension().relu(x.contiguous())
