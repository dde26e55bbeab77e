"""A curation recipe: one flat YAML parsed into the run's config and each step's own part."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from kernelrl.data.curate import pipeline
from kernelrl.data.curate.config import CURATE_RECIPE, compose_recipe, curate_config
from kernelrl.data.curate.resume import fingerprint
from kernelrl.env.timing import PROCEDURE
from kernelrl.launch.recipe import RecipeError, parse_recipe, recipe_parser

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "recipes" / "curate"
SMOKE = RECIPES / "smoke_cpu.yaml"


def parse(*words: str):
    return compose_recipe(parse_recipe(list(words), CURATE_RECIPE, "kernelrl curate"))


@pytest.mark.parametrize("recipe", sorted(RECIPES.glob("*.yaml")), ids=lambda p: p.name)
def test_every_recipe_key_reaches_the_part_that_uses_it(recipe: Path) -> None:
    keys = yaml.safe_load(recipe.read_text())
    config = parse("--config", str(recipe))
    flat = config.to_dict()
    assert {key: flat[key] for key in keys} == keys
    owners = [
        part
        for part in (config, *config.parts())
        for key in keys
        if key in type(part).__dataclass_fields__
    ]
    assert len(owners) == len(keys)  # each key belongs to exactly one dataclass


def test_the_parts_hang_on_the_run_config() -> None:
    config = parse("--config", str(SMOKE), "--dedup_threshold", "0.5", "--sft_rank_by", "fastest")
    assert config.validate.validate_workers == 2 and config.validate.max_ref_runtime_ms == 1000
    assert config.dedup.dedup_threshold == 0.5 and config.dedup.dedup_ngram == 5
    assert config.decontaminate.decontam_ngram == 8
    assert config.difficulty.pass_rate_model is None and config.difficulty.pass_rate_k == 4
    assert config.sft.sft_rank_by == "fastest" and config.sft.sft_cap_per_task == 1
    assert config.revision.revision_history == "full"
    assert config.env_device == "cpu" and config.seed == 0


def test_recipe_json_reruns_the_same_recipe() -> None:
    """``to_dict`` (written as ``recipe.json``) holds the recipe keys only, every one of them."""
    config = parse("--config", str(SMOKE))
    flat = config.to_dict()
    assert "validate" not in flat and "timing" not in flat and "gpu_index" not in flat
    assert curate_config(**flat).to_dict() == flat
    keys = {action.dest for action in recipe_parser(CURATE_RECIPE, "x")._actions}
    assert set(flat) == {key for key in keys if key != "help" and not key.startswith("no_")}


def test_a_key_no_part_knows_is_refused() -> None:
    with pytest.raises(ValueError, match="dedup_treshold"):
        curate_config(dedup_treshold=0.5)
    with pytest.raises(RecipeError, match="did you mean dedup_threshold"):
        parse("--config", str(SMOKE), "--dedup_treshold", "0.5")


def _key_before_fresh_inputs(config) -> str:
    """The validate key as computed before timed calls got fresh input contents
    (``TimingConfig.fresh_inputs``), later placements a short warm-up of their own
    (``placement_warmup_ms``), L2 was flushed by reading (``l2_flush``, then the boolean
    ``flush_l2``), a long kernel's repetitions could stop early (``enough_timed_ms``), a placement
    took 10 timed calls instead of 30 (``min_reps``), the key named the procedure's version and
    a timing could add input sets (``most_placements``, ``placements_rel_err``) and move the
    local memory (``move_local_memory``): the journals below were written then."""
    settings = pipeline.validate_settings(config)
    timing = settings["config"]["timing"]
    assert timing.pop("procedure") == PROCEDURE
    assert timing["min_reps"] == 10
    timing["min_reps"] = 30
    assert timing.pop("fresh_inputs") is True
    assert timing.pop("placement_warmup_ms") == 2.0
    assert timing.pop("l2_flush") == "read"
    assert timing.pop("enough_timed_ms") == 50.0
    assert timing.pop("most_placements") == 16
    assert timing.pop("placements_rel_err") == 0.005
    assert timing.pop("move_local_memory") is True
    timing["flush_l2"] = True
    return fingerprint("validate", settings)


def test_a_journal_written_before_the_steps_had_their_own_configs_still_resumes() -> None:
    """The validate journal's key for the bundled recipes (and with flags), as curation computed
    it when the step's keys were fields of one flat ``CurateConfig``: nothing else a verdict
    depends on has drifted since. A change of what a verdict depends on (``TimingConfig``: fresh
    timed inputs, the later placements' warm-up, the L2 flush, the timed calls a placement, the
    procedure's version, the input sets added while their mean is not known, the local memory
    moved between them; a new setting,
    even at the value that times as before) changes it on purpose, so those journals are not
    resumed now."""
    expected = {
        (SMOKE,): "6a7373e1cdbb4327",
        (SMOKE, "--seed", "3", "--validate_timeout_s", "7", "--validate_workers", "9"): (
            "c4334c1f9fb6f8ca"
        ),
        (RECIPES / "kernelbench_gpu.yaml", "--env_device", "cpu"): "a6405ab9eb30eb65",
    }
    for (recipe, *flags), key in expected.items():
        config = parse("--config", str(recipe), *flags)
        assert _key_before_fresh_inputs(config) == key
        assert fingerprint("validate", pipeline.validate_settings(config)) != key


def test_the_h100_journal_in_benchmarks_would_resume(monkeypatch) -> None:
    """The validate journal of levels 1-3 on an H100 (``benchmarks/results``), written by
    ``kernelbench_gpu.yaml --validate_workers 8`` before fresh timed inputs, has the key this
    code computes for that command with the timing procedure of then (on this machine ``cuda``
    is taken as given: no GPU to resolve it)."""
    journal = ROOT / "benchmarks" / "results" / "h100_curate_validate"
    lines = (journal / "validate_journal_final_250.jsonl").read_text().splitlines()
    written = {json.loads(line)["config"] for line in lines}
    monkeypatch.setattr(pipeline, "resolve_device", lambda device: device)
    config = parse("--config", str(RECIPES / "kernelbench_gpu.yaml"), "--validate_workers", "8")
    assert written == {_key_before_fresh_inputs(config)}
