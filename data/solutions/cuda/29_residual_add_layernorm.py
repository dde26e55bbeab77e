import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_src = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAException.h>
#include <cuda_runtime.h>

// Sum of one value per thread over the block; every thread gets the result.
// `shared` holds at least 33 floats. Ends with a barrier so `shared` can be reused at once.
__device__ float block_sum(float v, float* shared) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    if (warp == 0) {
        const int n_warps = blockDim.x >> 5;
        v = lane < n_warps ? shared[lane] : 0.0f;
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0) shared[32] = v;
    }
    __syncthreads();
    const float total = shared[32];
    __syncthreads();
    return total;
}

// One block per row: out = layer_norm(x + residual) * weight + bias, biased variance computed
// in a second pass around the mean; x + residual is recomputed in each pass (no temporary).
__global__ void add_layernorm_kernel(const float* __restrict__ x, const float* __restrict__ r,
                                     const float* __restrict__ w, const float* __restrict__ b,
                                     float* __restrict__ out, int n_cols, float eps) {
    __shared__ float shared[33];
    const int64_t offset = (int64_t)blockIdx.x * n_cols;
    const float* xr = x + offset;
    const float* rr = r + offset;
    float* orow = out + offset;

    float acc = 0.0f;
    for (int c = threadIdx.x; c < n_cols; c += blockDim.x) acc += xr[c] + rr[c];
    const float mean = block_sum(acc, shared) / n_cols;

    acc = 0.0f;
    for (int c = threadIdx.x; c < n_cols; c += blockDim.x) {
        const float d = xr[c] + rr[c] - mean;
        acc += d * d;
    }
    const float rstd = rsqrtf(block_sum(acc, shared) / n_cols + eps);

    for (int c = threadIdx.x; c < n_cols; c += blockDim.x) {
        orow[c] = (xr[c] + rr[c] - mean) * rstd * w[c] + b[c];
    }
}

torch::Tensor add_layernorm_cuda(torch::Tensor x, torch::Tensor residual, torch::Tensor weight,
                                 torch::Tensor bias, double eps) {
    TORCH_CHECK(x.is_cuda() && residual.is_cuda() && weight.is_cuda() && bias.is_cuda(),
                "all tensors must be CUDA tensors");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32 && residual.scalar_type() == torch::kFloat32,
                "x and residual must be float32");
    TORCH_CHECK(x.sizes() == residual.sizes(), "x and residual must have the same shape");
    auto xc = x.contiguous();
    auto rc = residual.contiguous();
    auto wc = weight.contiguous();
    auto bc = bias.contiguous();
    auto out = torch::empty_like(xc);
    const int64_t n_cols = xc.size(-1);
    TORCH_CHECK(wc.numel() == n_cols && bc.numel() == n_cols, "weight/bias size mismatch");
    if (xc.numel() == 0) return out;
    const int64_t n_rows = xc.numel() / n_cols;
    const int threads = n_cols >= 2048 ? 512 : 256;
    cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
    add_layernorm_kernel<<<(unsigned int)n_rows, threads, 0, stream>>>(
        xc.data_ptr<float>(), rc.data_ptr<float>(), wc.data_ptr<float>(), bc.data_ptr<float>(),
        out.data_ptr<float>(), (int)n_cols, (float)eps);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

cpp_src = (
    "torch::Tensor add_layernorm_cuda(torch::Tensor x, torch::Tensor residual, torch::Tensor weight, "
    "torch::Tensor bias, double eps);"
)

module = load_inline(
    name="kernelrl_add_layernorm_cuda",
    cpp_sources=cpp_src,
    cuda_sources=cuda_src,
    functions=["add_layernorm_cuda"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return module.add_layernorm_cuda(x, residual, self.norm.weight, self.norm.bias, self.norm.eps)
