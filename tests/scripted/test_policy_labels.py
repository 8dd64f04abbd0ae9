"""A scripted policy's results carry its registry name: tables and records say which ran."""

from components.env.batch_eval import format_table, summarize
from components.env.config import EnvConfig
from components.env.episode import run_episode
from components.sandbox.config import SandboxConfig
from components.scripted.registry import make_policy


def test_oracle_fixes_is_labelled_oracle_fixes(suite_tasks):
    result = run_episode(
        suite_tasks[0],
        make_policy("oracle-fixes"),
        EnvConfig(tool_set="fix_search"),
        SandboxConfig(),
    )
    assert result.policy == "oracle-fixes"
    assert result.record["metadata"]["policy"] == "oracle-fixes"
    assert result.record["source"] == "oracle"  # still an expert transcript, not a rollout
    row = format_table([summarize([result])]).splitlines()[2]
    assert row.split()[0] == "oracle-fixes"
