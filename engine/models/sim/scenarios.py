"""Scripted scenarios for the simulator, selectable by model name (SPEC: SIM-4).

``sim-coding-agent``: a coding agent fixing a small project. It makes 26 tool calls (list,
read, search, edit, run tests) before answering, the kind of loop the engine exists for. The
step is derived from the conversation itself (how many tool outputs it holds), so the scenario is
deterministic and stateless: any mode that carries the same history gets the same next call.
The matching client-side tools and sandbox live in ``clients.coding``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

MODULES = [f"src/calc/module_{i:02d}.py" for i in range(8)]
TESTS = ["tests/test_core.py", "tests/test_ops.py"]


@dataclass(frozen=True, slots=True)
class ScriptedCall:
    name: str
    arguments: dict[str, object]

    def arguments_json(self) -> str:
        return json.dumps(self.arguments, separators=(",", ":"))


def _edit(path: str, index: int) -> ScriptedCall:
    return ScriptedCall(
        "edit_file",
        {
            "path": path,
            "old": f"return a - b  # BUG-{index:02d}",
            "new": f"return a + b  # fixed-{index:02d}",
        },
    )


CODING_AGENT_STEPS: list[ScriptedCall] = [
    ScriptedCall("list_dir", {"path": "."}),
    ScriptedCall("read_file", {"path": "README.md"}),
    ScriptedCall("run_tests", {"target": "tests"}),
    ScriptedCall("list_dir", {"path": "src/calc"}),
    *(ScriptedCall("read_file", {"path": p}) for p in MODULES),
    ScriptedCall("search", {"pattern": "BUG-"}),
    *(ScriptedCall("read_file", {"path": p}) for p in TESTS),
    *(_edit(MODULES[i], i) for i in range(0, 8, 2)),
    ScriptedCall("run_tests", {"target": "tests"}),
    *(_edit(MODULES[i], i) for i in range(1, 8, 2)),
    ScriptedCall("search", {"pattern": "BUG-"}),
    ScriptedCall("run_tests", {"target": "tests"}),
]

CODING_AGENT_FINAL = (
    "All tests pass now. I fixed eight `op_*` functions in src/calc that subtracted instead of "
    "adding (marked BUG-00 … BUG-07), re-ran the suite after each batch of edits, and searched "
    "the tree to confirm no BUG markers remain."
)

CODING_AGENT_TOOLS = ("list_dir", "read_file", "search", "edit_file", "run_tests")

SCENARIOS = {"coding-agent": (CODING_AGENT_STEPS, CODING_AGENT_FINAL)}
