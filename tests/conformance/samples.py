"""One request-valid sample of every tool type and every input item type of the openai SDK
(3.51) unions ``Tool`` and ``ResponseInputItem``. Tests check the samples against the SDK, so a
new SDK member without a sample fails loudly instead of going untested. ``AGENT_HEADERS``: a
coding agent's instructions and tools, realistic in size (the MEM-10 footprint tests)."""

from __future__ import annotations

from typing import Any

FUNCTION: dict[str, Any] = {
    "type": "function",
    "name": "get_weather",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}
CUSTOM: dict[str, Any] = {"type": "custom", "name": "apply_patch", "description": "Patch files."}
NAMESPACE: dict[str, Any] = {
    "type": "namespace",
    "name": "docs",
    "description": "Documentation tools.",
    "tools": [
        {"type": "function", "name": "lookup", "parameters": {"type": "object"}},
        {"type": "custom", "name": "grep_docs"},
    ],
}

HOSTED_TOOLS: list[dict[str, Any]] = [
    {"type": "file_search", "vector_store_ids": ["vs_1"], "max_num_results": 3},
    {"type": "computer"},
    {
        "type": "computer_use_preview",
        "display_height": 768,
        "display_width": 1024,
        "environment": "linux",
    },
    {"type": "web_search", "external_web_access": False},
    {"type": "web_search_2025_08_26"},
    # a private address: the engine runs mcp tools itself (MCP-6) and refuses this one without
    # contacting it or resolving a name (MCP-10, MCP-11)
    {"type": "mcp", "server_label": "deepwiki", "server_url": "http://10.0.0.1/mcp"},
    {"type": "code_interpreter", "container": {"type": "auto"}},
    {"type": "programmatic_tool_calling"},
    {"type": "image_generation", "quality": "low"},
    {"type": "local_shell"},
    {"type": "shell"},
    {"type": "tool_search"},
    {"type": "web_search_preview"},
    {"type": "web_search_preview_2025_03_11"},
    {"type": "apply_patch"},
]
ALL_TOOLS: list[dict[str, Any]] = [FUNCTION, CUSTOM, NAMESPACE, *HOSTED_TOOLS]


def echoed(tool: dict[str, Any]) -> dict[str, Any]:
    """A tool as the Response echoes it (TOOL-1): as sent, plus the keys the Open Responses
    document requires of a function tool, null when the client left them out (CONF-3)."""
    if tool.get("type") != "function":
        return tool
    return {"description": None, "parameters": None, "strict": None} | tool


ECHOED_TOOLS: list[dict[str, Any]] = [echoed(t) for t in ALL_TOOLS]

# Every hosted tool a ``tool_choice`` can force (SDK ToolChoiceTypes, -Mcp, -Shell, -ApplyPatch).
HOSTED_CHOICES: list[dict[str, Any]] = [
    {"type": kind}
    for kind in (
        "file_search",
        "web_search_preview",
        "computer",
        "computer_use_preview",
        "computer_use",
        "web_search_preview_2025_03_11",
        "image_generation",
        "code_interpreter",
        "shell",
        "apply_patch",
    )
] + [{"type": "mcp", "server_label": "deepwiki"}]

# In conversation order: calls before their outputs; the last item is a user message.
INPUT_ITEMS: list[dict[str, Any]] = [
    {"role": "user", "content": "Start"},  # EasyInputMessage (no type)
    {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Dev"}]},
    {
        "type": "message",
        "id": "msg_sample",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": "Earlier answer", "annotations": []}],
    },
    {"type": "file_search_call", "id": "fs_1", "queries": ["needle"], "status": "completed"},
    {
        "type": "computer_call",
        "id": "cu_1",
        "call_id": "cc_1",
        "action": {"type": "screenshot"},
        "pending_safety_checks": [],
        "status": "completed",
    },
    {
        "type": "computer_call_output",
        "call_id": "cc_1",
        "output": {"type": "computer_screenshot", "image_url": "data:image/png;base64,AA=="},
    },
    {
        "type": "web_search_call",
        "id": "ws_1",
        "action": {"type": "search", "query": "weather"},
        "status": "completed",
    },
    {"type": "function_call", "call_id": "call_f", "name": "get_weather", "arguments": "{}"},
    {"type": "function_call_output", "call_id": "call_f", "output": "sunny"},
    {"type": "tool_search_call", "arguments": {"query": "calendar"}},
    {"type": "tool_search_output", "tools": [{"type": "function", "name": "calendar"}]},
    {"type": "additional_tools", "role": "developer", "tools": [{"type": "function", "name": "x"}]},
    {"type": "configuration_update"},
    {
        "type": "reasoning",
        "id": "rs_1",
        "summary": [{"type": "summary_text", "text": "Thinking it over"}],
        "encrypted_content": "gAAAAB-opaque-reasoning",
    },
    {"type": "compaction", "encrypted_content": "gAAAAB-opaque-compaction"},
    {"type": "image_generation_call", "id": "ig_1", "status": "completed", "result": None},
    {
        "type": "code_interpreter_call",
        "id": "ci_1",
        "container_id": "cntr_1",
        "status": "completed",
        "code": "print(6 * 7)",
        "outputs": [],
    },
    {
        "type": "local_shell_call",
        "id": "lsh_1",
        "call_id": "lsc_1",
        "action": {"type": "exec", "command": ["ls"], "env": {}},
        "status": "completed",
    },
    {"type": "local_shell_call_output", "id": "lsc_1", "output": "README.md"},
    {"type": "shell_call", "call_id": "sh_1", "action": {"commands": ["ls"]}},
    {
        "type": "shell_call_output",
        "call_id": "sh_1",
        "output": [{"stdout": "a.txt", "stderr": "", "outcome": {"type": "exit", "exit_code": 0}}],
    },
    {
        "type": "apply_patch_call",
        "call_id": "ap_1",
        "operation": {"type": "create_file", "path": "a.txt", "diff": "+a"},
        "status": "completed",
    },
    {"type": "apply_patch_call_output", "call_id": "ap_1", "status": "completed"},
    {
        "type": "mcp_list_tools",
        "id": "ml_1",
        "server_label": "deepwiki",
        "tools": [{"name": "ask", "input_schema": {}}],
    },
    {
        "type": "mcp_approval_request",
        "id": "ma_1",
        "arguments": "{}",
        "name": "ask",
        "server_label": "deepwiki",
    },
    {"type": "mcp_approval_response", "approval_request_id": "ma_1", "approve": True},
    {
        "type": "mcp_call",
        "id": "mc_1",
        "arguments": "{}",
        "name": "ask",
        "server_label": "deepwiki",
    },
    {"type": "custom_tool_call", "call_id": "call_c", "name": "apply_patch", "input": "*** Patch"},
    {"type": "custom_tool_call_output", "call_id": "call_c", "output": "patched"},
    {"type": "compaction_trigger"},
    {"type": "item_reference", "id": "msg_sample"},
    {"type": "program", "id": "pg_1", "call_id": "pgc_1", "code": "x = 1", "fingerprint": "fp"},
    {
        "type": "program_output",
        "id": "po_1",
        "call_id": "pgc_1",
        "result": "1",
        "status": "completed",
    },
    {"type": "message", "role": "user", "content": "Now answer"},
]


# A coding agent's tools, as a client sends them on every create (TOOL-1): function tools with
# JSON schemas of the size agents send (descriptions, nested properties, enums), a custom tool
# with a grammar (Codex's apply_patch) and a remote MCP server with its headers (MCP-1, MCP-3).
_SHELL = {
    "type": "function", "name": "shell", "strict": False,
    "description": "Runs a shell command and returns its output. Always set the `workdir` "
    "param; do not use `cd` unless absolutely necessary. Long outputs are truncated.",
    "parameters": {
        "type": "object", "additionalProperties": False, "required": ["command"],
        "properties": {
            "command": {"type": "array", "items": {"type": "string"},
                        "description": "The command to execute, as argv."},
            "workdir": {"type": "string", "description": "The working directory."},
            "timeout_ms": {"type": "number", "description": "The timeout, in milliseconds."},
            "justification": {"type": "string", "description":
                              "Why the command needs to run outside the sandbox, if it does."},
        },
    },
}  # fmt: skip
_READ_FILE = {
    "type": "function", "name": "read_file", "description": "Reads a file of the workspace.",
    "parameters": {"type": "object", "required": ["path"], "properties": {
        "path": {"type": "string", "description": "Path relative to the workspace root."},
        "offset": {"type": "integer", "description": "The first line, 1-based."},
        "limit": {"type": "integer", "description": "How many lines at most."}}},
}  # fmt: skip
_UPDATE_PLAN = {
    "type": "function", "name": "update_plan", "strict": True,
    "description": "Updates the task plan: a short list of steps, each with its status.",
    "parameters": {"type": "object", "additionalProperties": False,
                   "required": ["explanation", "plan"], "properties": {
        "explanation": {"type": ["string", "null"]},
        "plan": {"type": "array", "items": {
            "type": "object", "additionalProperties": False, "required": ["step", "status"],
            "properties": {"step": {"type": "string"}, "status": {
                "type": "string", "enum": ["pending", "in_progress", "completed"],
                "description": "One of: pending, in_progress, completed"}}}}}},
}  # fmt: skip
_APPLY_PATCH = {
    "type": "custom", "name": "apply_patch",
    "description": "Edits files with a patch in the apply_patch format (no unified diffs).",
    "format": {"type": "grammar", "syntax": "lark", "definition": (
        'start: begin_patch hunk+ end_patch\nbegin_patch: "*** Begin Patch" LF\n'
        'end_patch: "*** End Patch" LF?\nhunk: add_hunk | delete_hunk | update_hunk\n'
        'add_hunk: "*** Add File: " filename LF add_line+\n'
        'delete_hunk: "*** Delete File: " filename LF\n'
        'update_hunk: "*** Update File: " filename LF change_move? change?\n'
        'filename: /(.+)/\nadd_line: "+" /(.*)/ LF -> line\n'
        'change_move: "*** Move to: " filename LF\nchange: (change_context | change_line)+\n'
        'change_context: ("@@" | "@@ " /(.+)/) LF\nchange_line: ("+" | "-" | " ") /(.*)/ LF\n'
        "%import common.LF\n")},
}  # fmt: skip
_MCP = {
    "type": "mcp", "server_label": "docs", "server_url": "https://mcp.example.com/sse",
    "headers": {"X-Team": "rollouts"}, "authorization": "token-not-a-real-one",
    "allowed_tools": ["search", "fetch"], "require_approval": "never",
    "server_description": "The team's documentation.",
}  # fmt: skip
# A coding agent's system prompt (~7 KB), sent as ``instructions`` with its tools.
_PROMPT = "You are a coding agent running in a terminal; keep edits small and tested. " * 90
# (instructions, tools) of each request
AGENT_HEADERS: dict[str, tuple[str, list[dict[str, Any]]]] = {
    "two_functions": ("Be brief.", [_READ_FILE, {**_READ_FILE, "name": "list_dir"}]),
    "agent_kit": (_PROMPT, [_SHELL, _READ_FILE, _UPDATE_PLAN, _APPLY_PATCH, _MCP]),
}
