"""The `fix_search` tool set: list and try one-edit candidate fixes. A small model that
cannot copy code out of its context only has to choose, but it reaches only the fixes the
listing holds.

Here: its tools (tools.py: list_fixes, try_fix, with their safety rule), the candidate
fixes (fixes.py) from the module's one-edit neighbourhood (neighbourhood.py, edits.py), its
decoding constraint (constrain.py: try_fix ids among the listed untried ones), its reward
terms (wasted_fix_try, failed_fix_try) and the EnvConfig settings only it reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from components.env.tool_sets.fix_search.constrain import FixIdLogitsProcessor, untried_fix_ids
from components.env.tool_sets.fix_search.tools import (
    FAILED_FIX_TRY,
    LIST_FIXES,
    LIST_FIXES_DEMO,
    TRY_FIX,
    WASTED_FIX_TRY,
    FixSearchState,
    fix_target_rule,
    list_fixes,
    monitored,
    try_fix,
)
from components.env.tool_sets.shared import SHARED_TOOLS
from components.env.tool_sets.types import DecodingConstraint, Tool, ToolSet, tools_of


def _untried_ids(state: FixSearchState) -> list[str] | None:
    return None if state.listing is None else state.listing.untried_ids()


def _fix_id_processor(tokenizer, prompt_width: int, rows: Sequence[Any]):
    return FixIdLogitsProcessor(tokenizer, prompt_width, rows)


TOOL_SET = ToolSet(
    "fix_search",
    tools_of(
        Tool(
            "list_fixes",
            LIST_FIXES,
            monitored(fix_target_rule, list_fixes),
            monitor=fix_target_rule,
            demo=LIST_FIXES_DEMO,
        ),
        Tool("try_fix", TRY_FIX, monitored(None, try_fix)),
        SHARED_TOOLS["run_command"],
        SHARED_TOOLS["finish"],
    ),  # fmt: skip
    summary=(
        "choose among listed one-edit candidate fixes (components/env/tool_sets/fix_search/); "
        "for a small model that cannot copy code out of its context; reaches only listed fixes"
    ),
    rubric=(WASTED_FIX_TRY, FAILED_FIX_TRY),
    settings=("max_fixes", "fix_test_timeout_s"),
    new_state=FixSearchState,
    constraint=DecodingConstraint(
        summary="inside a try_fix id string, only listed untried ids can be drawn",
        live=_untried_ids,
        from_events=untried_fix_ids,
        logits_processor=_fix_id_processor,
    ),
)
