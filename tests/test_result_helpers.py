"""One spelling of each idea: an EvalResult's status is a Status, "scored" is one predicate, and
the task-metadata and reasoning strippers exist once (used by prompts, parsing and curation)."""

from __future__ import annotations

import ast
import json
from dataclasses import replace

import pytest

from kernelrl.data.curate.tokens import normalized_lines
from kernelrl.env.parse import FormatError, extract_solution, strip_reasoning
from kernelrl.env.pools.verdicts import is_harness_error
from kernelrl.env.result import EvalResult, Status, is_scored
from kernelrl.env.store import is_cacheable
from kernelrl.env.task import strip_metadata
from kernelrl.prompts import answer_of
from kernelrl.rewards import is_scored as rewards_is_scored
from kernelrl.rl.rejection import RejectionConfig, rejection_reason


def result(status: Status) -> EvalResult:
    return EvalResult("t", "triton", status)


def test_status_is_always_a_status() -> None:
    with pytest.raises(TypeError, match="must be a Status"):
        EvalResult("t", "triton", "correct")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        replace(result(Status.CORRECT), status="incorrect")
    for status in Status:  # read back from JSON: a Status again, the same one
        back = EvalResult.from_dict(json.loads(result(status).to_json()))
        assert back.status is status
    with pytest.raises(ValueError):
        EvalResult.from_dict({**result(Status.CORRECT).to_dict(), "status": "great"})


@pytest.mark.parametrize("status", list(Status))
def test_one_scored_predicate(status: Status) -> None:
    r = result(status)
    expected = status is not Status.HARNESS_ERROR
    assert is_scored(r) is r.scored is rewards_is_scored(r) is expected
    assert is_harness_error(r) is not expected  # the pools' retry
    assert is_cacheable(r) is expected  # the results store
    if not expected:
        assert rejection_reason(r, RejectionConfig()) is None  # rejection
    assert is_scored(None) is False


TASK = '''"""A task."""
import torch


# kernelrl metadata, read by the loader with ast.literal_eval.
# "sizes" overrides module globals.
KERNELRL = {
    "category": "elementwise",
    "sizes": {"cpu": {"N": 8}},
}


N = 1024
DOC = """two blank lines inside a string


stay"""


class Model(torch.nn.Module):
    def forward(self, x):
        return x


def get_inputs():
    return [torch.randn(N)]
'''


def test_strip_metadata_drops_the_literal_and_its_comment_only() -> None:
    stripped = strip_metadata(TASK)
    assert "KERNELRL" not in stripped and "kernelrl metadata" not in stripped
    assert '"sizes" overrides' not in stripped
    # everything else verbatim: the string constant and the two blank lines between defs
    assert 'DOC = """two blank lines inside a string\n\n\nstay"""' in stripped
    assert "        return x\n\n\ndef get_inputs" in stripped
    assert "import torch\n\n\nN = 1024" in stripped  # the gap closes up to what it was
    tree, original = ast.parse(stripped), ast.parse(TASK)
    assert ast.dump(tree) == ast.dump(
        ast.Module([n for n in original.body if not _metadata(n)], type_ignores=[])
    )
    assert strip_metadata(stripped) == stripped  # idempotent
    assert strip_metadata("def broken(:\nKERNELRL = {}\n") == "def broken(:\nKERNELRL = {}\n"
    assert strip_metadata("KERNELRL = {}\n\nx = 1\n") == "x = 1\n"  # at the top


def _metadata(node: ast.stmt) -> bool:
    return isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "KERNELRL"


def test_curation_tokens_ignore_the_metadata() -> None:
    bare = TASK.replace(TASK[TASK.index("# kernelrl") : TASK.index("N = 1024")], "")
    assert normalized_lines(TASK) == normalized_lines(bare)


ANSWER = "```python\nclass ModelNew: pass\n```"


@pytest.mark.parametrize(
    ("completion", "answer"),
    [
        (f"<think>draft ```python\nclass ModelNew: x\n```</think>\n{ANSWER}", ANSWER),
        (f"plan</think>\n{ANSWER}", ANSWER),  # the template opened the reasoning
        (f"<THINK>a</THINK>b<think>c</think>\n{ANSWER}", f"b\n{ANSWER}"),
        (f"{ANSWER}\n<think>second thoughts, never closed", ANSWER),
        (ANSWER, ANSWER),
    ],
)
def test_strip_reasoning_one_behaviour(completion: str, answer: str) -> None:
    assert strip_reasoning(completion).strip() == answer
    assert answer_of(completion) == answer  # what goes back into the conversation


def test_a_completion_that_never_left_its_reasoning_has_no_answer() -> None:
    completion = f"<think>I will write {ANSWER} soon"
    with pytest.raises(FormatError, match="ends inside <think>"):
        strip_reasoning(completion)
    with pytest.raises(FormatError, match="ends inside <think>"):
        extract_solution(completion)
    assert answer_of(completion) == ""  # the draft is not put back into the conversation
