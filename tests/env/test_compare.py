"""The information check of ``env/compare.py``: answers that say nothing are ``incorrect``
however small their elementwise error, while what real kernels compute (reassociated fp32,
bf16, TF32, fp16 accumulation) stays ``correct``."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from kernelrl.env import compare_kernels, information
from kernelrl.env.compare import Comparison, OutputMatcher, describe_outputs
from kernelrl.env.task import Task, load_task, task_from_source

DEFAULT_TASK = task_from_source(
    "class Model: ...\ndef get_inputs(): ...\ndef get_init_inputs(): ...\n", "plain"
)
LOOSE_TASK = Task("loose", DEFAULT_TASK.source, atol=5e-2, rtol=1e-2)  # TF32 allowed
INFORMATION = Path(__file__).parents[1] / "solutions" / "information"


def judge(
    expected: torch.Tensor | list[torch.Tensor],
    output: torch.Tensor | list[torch.Tensor],
    task: Task = DEFAULT_TASK,
    chunk: int | None = None,
    rerun: Callable[[], list[torch.Tensor]] | None = None,
) -> Comparison:
    """Compared the way the evaluator does: described, then streamed in chunks."""
    expected = expected if isinstance(expected, list) else [expected]
    output = output if isinstance(output, list) else [output]
    matcher = OutputMatcher(task, expected, 0, rerun=rerun)
    matcher.check_description(describe_outputs(output))
    for k, out in enumerate(output):
        flat = out.contiguous().reshape(-1)
        step = chunk or max(flat.numel(), 1)
        for start in range(0, flat.numel(), step):
            matcher.add_chunk(k, flat[start : start + step])
    return matcher.finish()


def elementwise_only(result: Comparison) -> bool:
    """What the check said before the information check: no problem but its own."""
    return len(result.problems) == result.uninformative


@pytest.fixture(scope="module")
def wide() -> tuple[torch.Tensor, torch.Tensor]:
    """64 x 32768 softmax of values in [0, 1): every output lies below fp32's atol 1e-4."""
    x = torch.rand(64, 32768, generator=torch.Generator().manual_seed(0))
    return x, torch.softmax(x, dim=1)


@pytest.mark.parametrize("answer", ["zeros", "one_over_n", "row_mean", "column_mean"])
def test_answers_that_say_nothing_are_incorrect(
    wide: tuple[torch.Tensor, torch.Tensor], answer: str
) -> None:
    _, ref = wide
    output = {
        "zeros": lambda: torch.zeros_like(ref),
        "one_over_n": lambda: torch.full_like(ref, 1 / ref.shape[1]),
        "row_mean": lambda: ref.mean(1, keepdim=True).expand_as(ref),
        "column_mean": lambda: ref.mean(0, keepdim=True).expand_as(ref),
    }[answer]()
    assert float(ref.max()) < 1e-4
    result = judge(ref, output, chunk=100_003)
    assert elementwise_only(result)  # the tolerance alone calls it correct
    assert not result.correct and result.uninformative == 1
    assert result.information_ratio is not None and result.information_ratio > 0.5
    message = result.problems[0]
    assert "carries no information beyond" in message and "Compute every value" in message
    assert f"{result.rms_err:.3g} RMS" in message


def test_the_message_names_the_simplest_answer_that_scores_as_well(
    wide: tuple[torch.Tensor, torch.Tensor],
) -> None:
    _, ref = wide
    result = judge(ref, torch.zeros_like(ref))
    # zeros score worse than a constant here, the constant as well as any mean along an axis
    assert "beyond a constant (the mean of all values)" in result.problems[0]


def test_what_softmax_kernels_compute_is_correct(wide: tuple[torch.Tensor, torch.Tensor]) -> None:
    x, ref = wide
    shifted = torch.exp(x - x.max(1, keepdim=True).values)
    # sums reassociated: blocks of 1024 columns summed, then the block sums in reverse order
    blocks = shifted.view(64, 32, 1024).sum(2).flip(1).cumsum(1)[:, -1:]
    online = shifted / blocks
    for output in (ref.clone(), online):
        result = judge(ref, output, chunk=77_777)
        assert result.correct, result.problems
        assert result.information_ratio is not None and result.information_ratio < 1e-3


def test_bf16_computed_answers_on_a_bf16_task_are_correct() -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(128, 4096, generator=g).bfloat16()
    ref = torch.softmax(x, dim=1)  # eager: fp32 inside, rounded once
    exp = torch.exp(x - x.max(1, keepdim=True).values)  # rounded to bf16 here
    stepwise = (exp / exp.float().sum(1, keepdim=True).bfloat16()).bfloat16()
    a = torch.randn(256, 512, generator=g).bfloat16()
    b = torch.randn(512, 256, generator=g).bfloat16()
    fp32_then_cast = (a.float() @ b.float()).bfloat16()
    for expected, output in ((ref, stepwise), (a @ b, fp32_then_cast)):
        result = judge(expected, output)
        assert result.correct, result.problems
        assert result.information_ratio is not None and result.information_ratio < 0.05
    zeros = judge(ref, torch.zeros_like(ref))
    assert zeros.uninformative == 1


def _tf32(t: torch.Tensor) -> torch.Tensor:
    """fp32 values rounded to TF32's 10-bit mantissa."""
    return ((t.view(torch.int32) + 4096) & -8192).view(torch.float32)


def test_tf32_and_fp16_accumulation_on_matmul_outputs_are_correct() -> None:
    g = torch.Generator().manual_seed(2)
    a, b = torch.randn(256, 256, generator=g), torch.randn(256, 256, generator=g)
    ref = a @ b
    tf32 = _tf32(a) @ _tf32(b)
    relative = float((tf32 - ref).square().mean().sqrt() / ref.square().mean().sqrt())
    assert 1e-4 < relative < 1e-2  # TF32's error: ~1e-3 of the output's scale
    result = judge(ref, tf32, task=LOOSE_TASK)
    assert result.correct, result.problems
    assert result.information_ratio is not None and result.information_ratio < 0.01
    # fp16 products accumulated in fp16 by blocks of 32 (outside fp16's default tolerance
    # here, inside a task's that allows it)
    a16, b16 = a.half(), b.half()
    acc = torch.zeros(256, 256, dtype=torch.float16)
    for k in range(0, 256, 32):
        acc = acc + (a16[:, k : k + 32].float() @ b16[k : k + 32].float()).half()
    result = judge(a16 @ b16, acc, task=LOOSE_TASK)
    assert result.correct, result.problems
    assert result.information_ratio is not None and result.information_ratio < 0.01


def test_an_output_constant_along_rows_is_its_own_answer() -> None:
    """A broadcast output: the row mean IS the answer and sets no bound; a sum computed in
    another order still passes, zeros and one constant do not."""
    x = torch.randn(512, 1000, generator=torch.Generator().manual_seed(3))
    ref = x.sum(1, keepdim=True).expand(512, 1000)
    reassociated = x.view(512, 8, 125).sum(2).flip(1).sum(1, keepdim=True).expand(512, 1000)
    result = judge(ref, reassociated, chunk=30_001)
    assert result.correct, result.problems
    assert "row mean" not in result.degenerate_answer
    for degenerate in (torch.zeros_like(ref), torch.full_like(ref, float(ref.mean()))):
        assert judge(ref, degenerate).uninformative == 1
    # nothing to tell from a degenerate answer at all: an all-zero reference
    zero = torch.zeros(64, 64)
    nothing = judge(zero, zero.clone())
    assert nothing.correct and nothing.information_ratio is None


def test_an_approximate_log_sum_exp_under_a_loose_rtol_is_incorrect() -> None:
    """Row log-sum-exp taken over every other column (corrected by log 2): off by ~0.02 on
    values near 5.7, inside rtol=2e-2, and as far off as answering one constant."""
    x = torch.rand(512, 176, generator=torch.Generator().manual_seed(4))
    ref = torch.logsumexp(x, dim=1)
    half = torch.logsumexp(x[:, ::2], dim=1) + math.log(2)
    task = Task("lse", DEFAULT_TASK.source, atol=1e-2, rtol=2e-2)
    result = judge(ref, half, task=task)
    assert elementwise_only(result) and not result.correct
    assert result.information_ratio is not None and result.information_ratio > 0.5
    assert judge(ref, ref + 1e-6 * torch.randn(512), task=task).correct


def test_streaming_in_chunks_gives_the_verdict_of_one_chunk(
    wide: tuple[torch.Tensor, torch.Tensor],
) -> None:
    """Hundreds of chunks, their rows combined many at a time (``COMBINE_EVERY``): the same
    problems, the first mismatch and the value found there included, as in one chunk."""
    x, ref = wide
    off = ref.clone()
    off.view(-1)[[1_500_000, 900_001, 2_000_000]] += torch.tensor([1.0, 2.5, 1.0])
    answers = [ref.clone(), torch.zeros_like(ref), ref * (1 + 0.05 * torch.randn_like(ref)), off]
    for output in answers:
        whole, chunked = judge(ref, output), judge(ref, output, chunk=4097)
        assert whole.correct == chunked.correct and whole.problems == chunked.problems
        assert whole.information_ratio == pytest.approx(chunked.information_ratio, rel=1e-9)
    assert "3/2097152 values outside" in chunked.problems[0]
    assert f"first at index [27, 15265]: got {float(off[27, 15265]):.6g}" in chunked.problems[0]


def test_nonfinite_reference_values_are_left_out() -> None:
    g = torch.Generator().manual_seed(5)
    x = torch.randn(64, 300, generator=g).masked_fill(torch.rand(64, 300, generator=g) < 0.3, -1e4)
    logits = torch.where(x < -1e3, float("-inf"), x)
    ref = torch.log_softmax(logits, dim=1)  # -inf where masked
    assert judge(ref, ref.clone()).correct
    zeros_but_masks = torch.where(torch.isfinite(ref), 0.0, ref)
    assert judge(ref, zeros_but_masks).uninformative == 1


def test_integer_outputs_and_other_problems_keep_their_checks() -> None:
    index = torch.randint(0, 9, (50,))
    result = judge(index, index.clone())
    assert result.correct and result.information_ratio is None
    ref = torch.randn(40, 50)
    wrong = ref.clone()
    wrong[3, 4] += 1.0
    result = judge(ref, wrong)
    assert not result.correct and result.uninformative == 0  # elementwise, not information
    assert "values outside" in result.problems[0]


def test_reference_statistics_stay_in_bounded_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each float64 piece of the reference holds at most STATS_CHUNK values, and tiling gives
    the errors computed directly, non-finite values left out."""
    monkeypatch.setattr(information, "STATS_CHUNK", 64)
    seen: list[int] = []
    steps = compare_kernels.float64_slices

    def recorded(view: torch.Tensor, step_elements: int):
        for part in steps(view, step_elements):
            seen.append(part.numel())
            yield part

    monkeypatch.setattr(compare_kernels, "float64_slices", recorded)
    ref = torch.randn(3, 50, 7, 11, generator=torch.Generator().manual_seed(6))
    ref[1, 2, 3, 4] = float("nan")
    got = information.degenerate_errors(ref).tolist()
    assert max(seen) <= 64 and len(seen) > 100
    names = [name for name, _ in information.degenerate_answers(tuple(ref.shape))]
    assert names[:3] == ["zeros", "a constant (the mean of all values)", names[2]]
    assert "row mean" in names[2]
    finite = torch.isfinite(ref)
    values = torch.where(finite, ref.double(), 0.0)

    def spread(dims: tuple[int, ...]) -> float:
        mean = values.sum(dims, keepdim=True) / finite.sum(dims, keepdim=True)
        return float(torch.where(finite, values - mean, 0.0).square().sum())

    direct = [float(finite.sum()), float(values.square().sum()), float(values.square().sum())]
    direct += [spread((0, 1, 2, 3)), spread((3,)), spread((0,)), spread((1,)), spread((2,))]
    assert got == pytest.approx(direct, rel=1e-12)


class ZeroMean(torch.nn.Module):
    """The mean of standardised rows: 0 exactly, rounding noise in fp32."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ((x - x.mean(1, keepdim=True)) / x.std(1, keepdim=True)).mean(1)


def test_a_reference_that_is_rounding_noise_is_not_judged_on_information() -> None:
    """The reference moves under one-ulp changes of its inputs as far as zeros (the exact
    answer) are from it: with that rerun, zeros and the float64 answer are correct; the
    rerun does not rescue zeros on a softmax, whose reference is not noise."""
    x = torch.randn(256, 4096, generator=torch.Generator().manual_seed(7))
    model = ZeroMean()
    ref = model(x)
    assert 0 < float(ref.abs().max()) < 1e-5

    def rerun() -> list[torch.Tensor]:
        nudged = x.clone()
        information.nudge_inputs([nudged], 1)
        return [model(nudged)]

    zeros = torch.zeros_like(ref)
    assert judge(ref, zeros).uninformative == 1  # no rerun: the reference taken as exact
    for answer in (zeros, model(x.double()).float()):
        result = judge(ref, answer, rerun=rerun)
        assert result.correct, result.problems
        assert result.reference_noise is not None and result.reference_noise > 1e-9
    wide = torch.rand(8, 32768, generator=torch.Generator().manual_seed(8))
    softmax = torch.softmax(wide, dim=1)

    def softmax_rerun() -> list[torch.Tensor]:
        nudged = wide.clone()
        information.nudge_inputs([nudged], 1)
        return [torch.softmax(nudged, dim=1)]

    result = judge(softmax, torch.zeros_like(softmax), rerun=softmax_rerun)
    assert result.uninformative == 1 and result.reference_noise < 1e-9


def test_nudged_inputs_move_by_one_ulp() -> None:
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        x = torch.randn(1000, generator=torch.Generator().manual_seed(9)).to(dtype)
        x[:3] = torch.tensor([0.0, float("inf"), float("nan")])
        nudged = x.clone()
        information.nudge_inputs([nudged, torch.arange(4)], 2)
        up = torch.nextafter(x, torch.full_like(x, math.inf))
        down = torch.nextafter(x, torch.full_like(x, -math.inf))
        assert ((nudged == up) | (nudged == down))[3:].all()
        assert nudged[:2].tolist() == x[:2].tolist() and nudged[2].isnan()


# ------------------------------------------------------------------ end to end, on CPU
SOLUTIONS = sorted(p for p in INFORMATION.glob("*__*.py"))


def _task_of(path: Path) -> str:
    """The task file a solution names in its first line (``# task: <file>``)."""
    return path.read_text().splitlines()[0].removeprefix("# task: ").strip()


@pytest.fixture(scope="module")
def evaluated() -> dict[str, object]:
    from kernelrl.env.evaluator import EvalConfig
    from kernelrl.env.pools.local import LocalPool

    tasks = [load_task(INFORMATION / _task_of(p)) for p in SOLUTIONS]
    config = EvalConfig(device="cpu", timeout_s=120, host_memory_bytes=2 * 2**30)
    with LocalPool(config, workers=1) as pool:
        results = pool.evaluate(tasks, [p.read_text() for p in SOLUTIONS])
    return {p.name: r for p, r in zip(SOLUTIONS, results, strict=True)}


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.stem)
def test_triton_kernels_end_to_end(path: Path, evaluated: dict[str, object]) -> None:
    """The evaluator on CPU: on a wide softmax, a zero-fill kernel and a 1/N kernel are
    incorrect with the information message, a real softmax kernel is correct; where the
    reference is rounding noise around 0 (the mean of standardised rows), zeros are correct."""
    result = evaluated[path.name]
    expected = path.name.split("__")[0]
    assert result.status == expected, result.feedback
    if expected == "incorrect":
        assert "carries no information beyond" in result.feedback
        assert "values outside" not in result.feedback  # the tolerance alone let it through


@pytest.mark.gpu
def test_published_size_softmax_on_the_gpu() -> None:
    """KernelBench's 23_Softmax at its published size (4096 x 393216, 6 GiB per tensor): zeros
    and 1/N incorrect, a softmax with blocked sums correct, the statistics on the GPU."""
    device = torch.device("cuda")
    x = torch.rand(
        4096, 393216, device=device, generator=torch.Generator(device=device).manual_seed(0)
    )
    ref = torch.softmax(x, dim=1)
    chunk = 2**24  # the evaluator's 64 MiB of fp32
    zeros = judge(ref, torch.zeros(1, device=device).expand_as(ref), chunk=chunk)
    assert elementwise_only(zeros) and zeros.uninformative == 1
    uniform = judge(ref, torch.full((1,), 1 / 393216, device=device).expand_as(ref), chunk=chunk)
    assert elementwise_only(uniform) and uniform.uninformative == 1
    shifted = torch.exp(x - x.max(1, keepdim=True).values)
    del x
    blocked = shifted.view(4096, 96, 4096).sum(2).sum(1, keepdim=True)
    result = judge(ref, shifted.div_(blocked), chunk=chunk)
    assert result.correct, result.problems
