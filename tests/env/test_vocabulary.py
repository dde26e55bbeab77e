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


@pytest.mark.parametrize("op", ["repeat", "index_select", "tile", "flip", "gather"])
def test_ops_that_move_data_are_compute_in_a_solution(op: str) -> None:
    """They make a reference a data-movement task; a solution calling them has torch move."""
    from kernelrl.env.integrity.vocabulary import MOVEMENT_OPS

    assert op in MOVEMENT_OPS
    assert not is_glue_torch(f"torch.{op}") and not is_glue_method(op)
    assert not is_glue_aten(f"aten::{op}")


@pytest.mark.parametrize(
    ("name", "changes"),
    [
        ("torch.set_default_dtype", "torch.set_default_dtype"),
        ("torch.set_default_device", "torch.set_default_device"),
        ("torch.use_deterministic_algorithms", "torch.use_deterministic_algorithms"),
        ("torch.set_flush_denormal", "torch.set_flush_denormal"),
        ("torch.set_float32_matmul_precision", "torch.set_float32_matmul_precision"),
        ("torch.cuda.set_device", "torch.cuda.set_device"),
        ("torch.backends.cuda.matmul.allow_tf32", "torch.backends.cuda.matmul.allow_tf32"),
        ("torch.backends.cudnn", "torch.backends.cudnn"),
        ("torch.set_printoptions", None),
        ("torch.set_grad_enabled", None),
        ("torch.Tensor.set_", None),
        ("torch.nn.Module.set_submodule", None),
        ("torch.empty", None),
        ("triton.set_allocator", None),
    ],
)
def test_global_state_is_a_class_of_names(name: str, changes: str | None) -> None:
    """Setters of torch's modules and torch.backends' flags, read on the real objects: a
    tensor's or a module class's ``set_*`` is no global setter, nor are print options."""
    from kernelrl.env.integrity.global_state import global_state_change

    assert global_state_change(name) == changes


def test_print_options_are_glue() -> None:
    assert is_glue_torch("torch.set_printoptions")


def test_a_tensor_made_from_a_list_is_glue_in_the_profilers_events() -> None:
    """``torch.tensor([...])`` records ``aten::detach_`` under the CPU profiler (which watches
    every timed call on CPU), below where the dispatch-mode audit looks: it is no compute."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        torch.tensor([1.0, 2.0])
    names = {
        e.name() for e in prof.profiler.kineto_results.events() if e.name().startswith("aten::")
    }
    assert names and all(is_glue_aten(name) for name in names), names
