# backend: cuda
# Legitimate: host constants uploaded to constant memory (host to device), a device-to-device
# copy with its direction named, and a device accessor; nothing of the device is read on the host.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_src = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>

__constant__ float c_slope[1];

__global__ void leaky_kernel(
    const torch::PackedTensorAccessor32<float, 1, torch::RestrictPtrTraits> x,
    float* __restrict__ out, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        const float v = x[i];
        out[i] = v > 0.0f ? v : v * c_slope[0];
    }
}

torch::Tensor leaky(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda(), "x must be a CUDA tensor");
    const float slope = 0.0f;
    cudaMemcpyToSymbol(c_slope, &slope, sizeof(float));
    auto flat = x.contiguous().view({-1});
    auto staged = torch::empty_like(flat);
    cudaStream_t stream = 0;  // the default stream, where the caller's work runs
    cudaMemcpyAsync(staged.data_ptr<float>(), flat.data_ptr<float>(),
                    flat.numel() * sizeof(float), cudaMemcpyDeviceToDevice, stream);
    auto out = torch::empty_like(flat);
    const int n = flat.numel();
    leaky_kernel<<<(n + 255) / 256, 256, 0, stream>>>(
        staged.packed_accessor32<float, 1, torch::RestrictPtrTraits>(), out.data_ptr<float>(), n);
    return out.view_as(x);
}
"""

module = load_inline(
    name="kernelrl_test_leaky_constants",
    cpp_sources="torch::Tensor leaky(torch::Tensor x);",
    cuda_sources=cuda_src,
    functions=["leaky"],
    verbose=False,
)


class ModelNew(nn.Module):
    def forward(self, x):
        return module.leaky(x)
