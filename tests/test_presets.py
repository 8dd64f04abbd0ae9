"""Every shipped preset loads into its components' typed configs; bad keys are errors."""

from pathlib import Path

import pytest

from components.preset import PresetError, load_preset, validate_preset

ROOT = Path(__file__).resolve().parents[1]
PRESETS = sorted((ROOT / "configs").glob("*.yaml"))


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.name)
def test_shipped_presets_load(path):
    preset = load_preset(path)
    validate_preset(preset)
    assert len(preset.config_hash()) == 12


def test_unknown_key_names_file_and_key(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("sft:\n  learning_rat: 0.1\n")
    with pytest.raises(PresetError, match=r"bad.yaml:sft: unknown key\(s\) learning_rat"):
        validate_preset(load_preset(bad))


def test_unknown_section_and_invalid_value(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("trainer: {}\n")
    with pytest.raises(PresetError, match="unknown section"):
        load_preset(bad)
    bad.write_text("grpo:\n  group_size: 1\n")
    with pytest.raises(PresetError, match="bad.yaml:grpo"):
        validate_preset(load_preset(bad))


def test_config_hash_changes_with_content(tmp_path):
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("sft: {max_steps: 10}\n")
    b.write_text("sft: {max_steps: 11}\n")
    assert load_preset(a).config_hash() != load_preset(b).config_hash()


def test_expert_must_act_through_the_environments_tool_set(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("pipeline: {expert_policy: oracle-fixes}\nenv: {tool_set: free_form}\n")
    with pytest.raises(PresetError, match="expert_policy 'oracle-fixes' acts through the "
                       "fix_search tools but env.tool_set is 'free_form'"):  # fmt: skip
        validate_preset(load_preset(bad))
    bad.write_text("pipeline: {expert_policy: oracle-fixes}\nenv: {tool_set: fix_search}\n")
    validate_preset(load_preset(bad))


def test_a_scripted_policy_is_evaluated_in_its_own_tool_set():
    from components.env.config import EnvConfig
    from components.env.tool_sets import TOOL_SETS
    from components.scripted.registry import POLICY_TOOL_SETS, SCRIPTED_POLICIES, env_for_policy

    assert env_for_policy("oracle", EnvConfig(tool_set="fix_search")).tool_set == "free_form"
    assert env_for_policy("prior-fixes", EnvConfig()).tool_set == "fix_search"
    assert env_for_policy("noop", EnvConfig(tool_set="fix_search")).tool_set == "fix_search"
    assert set(POLICY_TOOL_SETS) == set(SCRIPTED_POLICIES)  # every policy is placed
    assert set(POLICY_TOOL_SETS.values()) <= {None, *TOOL_SETS}
