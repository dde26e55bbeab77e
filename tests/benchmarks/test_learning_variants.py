"""The learning benchmark's RL variants (``--rl-set`` with ``--rl-tag``): their stages sit beside
the others under their own names, their overrides reach the trainer, and the report labels them."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import learning  # noqa: E402


def _bench(tmp_path: Path, *extra: str) -> learning.Benchmark:
    args = learning.build_parser().parse_args(["--out", str(tmp_path), *extra])
    return learning.Benchmark(args)


def test_a_tagged_variant_has_its_own_stages_and_passes_its_overrides(tmp_path: Path) -> None:
    bench = _bench(
        tmp_path,
        "--curriculum",
        "pass-rate",
        "--rl-set",
        "learning_rate=5e-5",
        "temperature=1.0",
        "--rl-tag",
        "hot",
    )
    assert bench.stage_name("eval_rl") == "eval_rl_passrate_hot"
    assert bench.rl_dir == tmp_path / "rl_model_passrate_hot"
    assert (
        bench.rl_label() == "after TRLOO, pass-rate curriculum, learning_rate=5e-5 temperature=1.0"
    )
    ran: dict[str, list[str]] = {}
    bench.curriculum = lambda model: tmp_path / "train.parquet"
    bench.run = lambda name, argv: ran.setdefault(name, argv)
    bench.rl("sft-model")
    argv = ran["rl_passrate_hot"]
    assert argv[argv.index("--learning_rate") + 1] == "5e-5"
    assert argv[argv.index("--temperature") + 1] == "1.0"
    assert argv[argv.index("--output_dir") + 1] == str(tmp_path / "rl_model_passrate_hot")


def test_the_report_labels_every_recorded_rl_run(tmp_path: Path) -> None:
    bench = _bench(tmp_path)
    bench.stages = {
        "eval_rl": {},
        "eval_rl_passrate_hot": {"label": "after TRLOO, pass-rate curriculum, temperature=1.0"},
        "eval_sft": {},
    }
    evals = bench.report_evals()
    assert evals["eval_rl"] == "after TRLOO"
    assert evals["eval_rl_passrate_hot"] == "after TRLOO, pass-rate curriculum, temperature=1.0"
    assert list(evals)[: len(learning.EVALS)] == list(learning.EVALS)


def test_the_train_check_samples_sft_and_rl_anew_on_rls_own_train_tasks(tmp_path: Path) -> None:
    import datasets

    rows = [{"id": f"task_{i}", "source": f"# task {i}\n"} for i in range(3)]
    (tmp_path / "curriculum").mkdir()
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "curriculum" / "data.parquet"))
    bench = _bench(tmp_path, "--curriculum", "pass-rate", "--rl-tag", "hot")
    bench.stages = {"select_sft": {"chosen": "sft-model"}}
    ran: dict[str, list[str]] = {}
    bench.run = lambda name, argv: ran.setdefault(name, argv)
    bench.train_check("rl-model")
    assert sorted(p.name for p in (tmp_path / "tasks" / "rl_train").iterdir()) == [
        "task_0.py",
        "task_1.py",
        "task_2.py",
    ]
    models = {name: argv[argv.index("--model_name_or_path") + 1] for name, argv in ran.items()}
    assert models == {"train_sft": "sft-model", "train_check_passrate_hot": "rl-model"}
    assert bench.train_check_table() == ""  # nothing sampled yet: no table
