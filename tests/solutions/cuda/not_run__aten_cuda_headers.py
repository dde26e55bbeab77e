# task: 01_relu
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CUDA_SOURCE = r"""
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

__global__ void relu_kernel(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] > 0.f ? x[i] : 0.f;
}

torch::Tensor relu(torch::Tensor x) {
    const c10::cuda::CUDAGuard guard(x.device());
    auto y = torch::empty_like(x);
    int n = x.numel();
    relu_kernel<<<(n + 255) / 256, 256, 0, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
"""

module = load_inline(
    name="relu_aten_cuda",
    cpp_sources="torch::Tensor relu(torch::Tensor x);",
    cuda_sources=CUDA_SOURCE,
    functions=["relu"],
)


class ModelNew(nn.Module):
    def forward(self, x):
        return module.relu(x.contiguous())
