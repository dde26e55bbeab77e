"""The op vocabulary is an allow-list: glue is named, everything else in torch is compute."""

from __future__ import annotations

import pytest

from kernelrl.env.integrity.vocabulary import (
    GLUE_ATEN_OPS,
    GLUE_TORCH_OPS,
    is_glue_aten,
    is_glue_method,
    is_glue_torch,
    is_passive_layer,
    is_torch_value,
    is_trivial_gpu_kernel,
    torch_op_name,
)


@pytest.mark.parametrize(
    "name",
    [
        "torch.nansum",
        "torch.var_mean",
        "torch.some_op_added_next_year",
        "torch._foreach_add",
        "torch.ops.aten._softmax.default",
        "torch.ops.aten.nansum",
        "torch.ops.mylib.relu",
        "torch._C._nn.gelu",
        "torch.special.expit",
        "torch.linalg.vector_norm",
        "torch.fft.rfft",
        "torch.nn.functional.softmax",
        "torch.nn.functional.some_new_activation",
        "torch.Tensor.addcmul",
        "torch.cuda.comm.reduce_add",
        "torch.nn.Linear",
    ],
)
def test_unknown_new_and_private_torch_ops_are_compute(name: str) -> None:
    assert not is_glue_torch(name)


@pytest.mark.parametrize("op", sorted(GLUE_TORCH_OPS))
def test_every_glue_op_is_allowed_as_a_torch_function(op: str) -> None:
    assert is_glue_torch(f"torch.{op}") and is_glue_torch(f"torch.Tensor.{op}")


def test_pad_is_glue_only_in_functional() -> None:
    assert is_glue_torch("torch.nn.functional.pad")
    assert not is_glue_torch("torch.nn.functional.softmax")
    assert not is_glue_method("pad") and is_glue_method("view") and not is_glue_method("relu")


def test_aten_vocabulary() -> None:
    assert is_glue_aten("aten::view.dtype") and is_glue_aten("view") and is_glue_aten("aten::copy_")
    assert not is_glue_aten("aten::nansum") and not is_glue_aten("aten::_softmax")
    assert is_glue_torch("torch.ops.aten.view.default")
    assert not is_glue_torch("torch.ops.aten.mm.default")
    assert all(name.startswith("aten::") for name in GLUE_ATEN_OPS)


def test_values_namespaces_and_layers() -> None:
    assert is_torch_value("torch.float16") and is_torch_value("torch.nn.functional")
    assert is_torch_value("torch.cuda") and is_torch_value("torch.empty")
    assert not is_torch_value("torch.nansum") and not is_torch_value("torch._C")
    assert is_passive_layer("torch.nn.Dropout") and not is_passive_layer("torch.nn.Conv2d")


def test_op_names_and_trivial_kernels() -> None:
    assert torch_op_name("torch.ops.aten.mm.default") == "mm"
    assert torch_op_name("torch.nn.functional.softmax") == "softmax"
    assert torch_op_name("torch.Tensor.add_") == "add"
    assert torch_op_name("numpy.sum") is None
    assert is_trivial_gpu_kernel("void at::native::direct_copy_kernel_cuda")
    assert not is_trivial_gpu_kernel("void at::native::reduce_kernel<SumFunctor>")
