"""Remote MCP tools inside the rollout (SPEC §18: MCP-4..MCP-9, MCP-12).

The rollout lists each ``mcp`` server's tools once (the first turn naming it; a continuation
finds the ``mcp_list_tools`` item in its context), offers them to its backend as plain function
tools (every backend renders functions in its own format), and, when the model calls one, calls
the server itself, inside the coroutine, and samples again: no client round trip.

The context holds an MCP call the way every backend already reads a tool round trip: the
model's call as a ``function_call`` (``call_id`` = the ``mcp_call`` or ``mcp_approval_request``
id) and the server's answer as its ``function_call_output``, joined after the step's own
output, like the outputs of parallel calls. The response shows the ``mcp_*`` items. So a
``tokens`` route's trajectory holds the sampled call and the rendered output exactly (MCP-15).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol, cast

import msgspec

from engine.conversation.context import Context
from engine.conversation.pipeline import INCREMENTAL, Pipeline
from engine.hosted.mcp import McpFault, McpSessions
from engine.hosted.policy import McpLimits
from engine.models.base import Backend
from engine.rollout.turn import Turn
from protocol import events as ev
from protocol.items import (
    FunctionCall,
    FunctionCallOutput,
    InputItem,
    McpApprovalRequest,
    McpCall,
    McpListedTool,
    McpListTools,
    OpaqueItem,
    OutputItem,
)
from protocol.stream import new_id
from protocol.tools import FunctionTool, McpServerTool, Toolset, toolset_of

DENIED = -32004  # the JSON-RPC-style code of a call the client denied (MCP-9)


class Host(Protocol):
    """What the hosted tools use of their rollout (``coroutine.Rollout``)."""

    ctx: Context
    pipeline: Pipeline
    backend: Backend

    async def open_turn(self, turn: Turn) -> None: ...


class _Pending:
    """The MCP call the model is writing (between its ``CallStart`` and ``CallEnd``)."""

    __slots__ = ("approval", "item_id", "name", "pieces", "server")

    def __init__(self, server: McpServerTool, name: str, approval: bool) -> None:
        self.server = server
        self.name = name
        self.approval = approval
        self.item_id = new_id("mcpr" if approval else "mcp")
        self.pieces: list[str] = []


class HostedTools:
    """One rollout's remote MCP tools: its sessions, what each server listed, the open call."""

    def __init__(self, limits: McpLimits, max_calls: int) -> None:
        self._limits = limits
        self._max_calls = max_calls
        self._calls = ("", 0)  # calls run in the current response (MCP-14)
        self._sessions: McpSessions | None = None
        self._offered: tuple[tuple[bytes, ...], int, Toolset] | None = None
        self._routes: dict[str, tuple[McpServerTool, McpListedTool]] = {}
        self._pending: _Pending | None = None
        self.outputs: list[InputItem] = []  # this step's call outputs, joined after its output
        self.ran = 0  # calls run in this step
        self._answers: dict[str, tuple[bool, str | None]] = {}  # approvals not acted on yet

    @property
    def sessions(self) -> McpSessions:
        if self._sessions is None:
            self._sessions = McpSessions(self._limits)
        return self._sessions

    async def aclose(self) -> None:
        """The rollout ended: its sessions close (MCP-12)."""
        if self._sessions is not None:
            await self._sessions.aclose()

    async def before_sampling(self, host: Host, turn: Turn, tools: Toolset) -> None:
        """List the servers not listed yet (MCP-4), then run or deny the calls the input
        answered approval requests for (MCP-9). The response opens first. The step's count
        of calls run starts here: a step that suspended on the client's calls (MCP-7) left its
        own, which ``again`` never read."""
        self.ran = 0
        if not tools.mcp:
            return
        await host.open_turn(turn)
        await self.list_missing(host, turn, tools)
        await self.answer_approvals(host, turn, tools)

    def again(self, ctx: Context, response_id: str, reason: str) -> bool:
        """The step ran MCP calls and asked the client for nothing: the model reads their
        outputs in the same response, up to ``mcp_max_calls`` calls per response (MCP-14)."""
        ran, self.ran = self.ran, 0
        if not ran or reason in ("length", "steered") or ctx.pending_calls():
            return False
        response, count = self._calls
        count = (count if response == response_id else 0) + ran
        self._calls = (response_id, count)
        return count < self._max_calls

    # ------------------------------------------------------------------ listing (MCP-4, MCP-5)
    async def list_missing(self, host: Host, turn: Turn, tools: Toolset) -> None:
        """List the servers the context has no ``mcp_list_tools`` item for; each listing is an
        output item of ``turn`` and joins the context."""
        listed = listed_servers(host.ctx.items)
        for server in tools.mcp:
            if server.server_label in listed:
                continue
            item = McpListTools(id=new_id("mcpl"), server_label=server.server_label, tools=[])
            await turn.sink.send(turn.stream.open_hosted(item))
            await turn.sink.send(turn.stream.hosted_event(ev.McpListToolsInProgress))
            try:
                found = await self.sessions.list_tools(server)
            except McpFault as fault:
                item = msgspec.structs.replace(item, error=fault.message)
                await turn.sink.send(turn.stream.hosted_event(ev.McpListToolsFailed))
            else:
                item = msgspec.structs.replace(item, tools=[t for t in found if allowed(server, t)])
                await turn.sink.send(turn.stream.hosted_event(ev.McpListToolsCompleted))
            await turn.sink.send(turn.stream.close_hosted(item))
            join(host, [OpaqueItem(msgspec.to_builtins(item))], "mcp")
            listed[server.server_label] = item.tools

    def offered(self, tools: Toolset, ctx: Context) -> Toolset:
        """The toolset the backend sees (MCP-6): the request's tools without its ``mcp`` tools,
        plus each listed, allowed MCP tool as a function (a name already taken is skipped)."""
        if not tools.mcp:
            return tools
        listed = listed_servers(ctx.items)
        key = (tools.key, sum(len(v) for v in listed.values()))
        if self._offered is not None and self._offered[:2] == key:
            return self._offered[2]
        raw: list[msgspec.Raw] = []
        specs: list[Any] = []
        for one_raw, spec in zip(tools.raw, tools.specs, strict=True):
            if not isinstance(spec, McpServerTool):
                raw.append(one_raw)
                specs.append(spec)
        taken = {tool.name for tool in tools.callables}
        self._routes = {}
        for server in tools.mcp:
            for tool in listed.get(server.server_label, ()):
                if tool.name in taken or not allowed(server, tool):
                    continue
                taken.add(tool.name)
                self._routes[tool.name] = (server, tool)
                function = _as_function(tool, server)
                raw.append(msgspec.Raw(msgspec.json.encode(function)))
                specs.append(function)
        offered = toolset_of(raw, specs)
        self._offered = (*key, offered)
        return offered

    # ------------------------------------------------------------------ calls (MCP-7, MCP-9)
    def claims(self, name: str, namespace: str | None) -> bool:
        return namespace is None and name in self._routes

    @property
    def writing(self) -> bool:
        return self._pending is not None

    async def start(self, turn: Turn, name: str) -> None:
        server, _tool = self._routes[name]
        pending = self._pending = _Pending(server, name, needs_approval(server, name))
        if pending.approval:
            return  # the request is one complete item at the call's end (MCP-9)
        item = McpCall(
            id=pending.item_id,
            server_label=server.server_label,
            name=name,
            arguments="",
            status="in_progress",
        )
        await turn.sink.send(turn.stream.open_hosted(item))
        await turn.sink.send(turn.stream.hosted_event(ev.McpCallInProgress))

    async def arguments(self, turn: Turn, text: str) -> None:
        pending = self._pending
        assert pending is not None
        pending.pieces.append(text)
        if not pending.approval:
            event = turn.stream.hosted_event(ev.McpCallArgumentsDelta, delta=text)
            await turn.sink.send(event)

    async def end(self, turn: Turn) -> FunctionCall | None:
        """The call is written: run it, or (approval required) ask, and return the call the
        rollout waits on like a client's function call (MCP-9)."""
        pending, self._pending = self._pending, None
        assert pending is not None
        arguments = "".join(pending.pieces)
        label = pending.server.server_label
        if pending.approval:
            request = McpApprovalRequest(
                id=pending.item_id, server_label=label, name=pending.name, arguments=arguments
            )
            for event in turn.stream.add_hosted(request):
                await turn.sink.send(event)
            return FunctionCall(call_id=request.id, name=request.name, arguments=arguments)
        await turn.sink.send(turn.stream.hosted_event(ev.McpCallArgumentsDone, arguments=arguments))
        call = McpCall(
            id=pending.item_id, server_label=label, name=pending.name, arguments=arguments
        )
        await self._run(turn, pending.server, call)
        return None

    async def _run(self, turn: Turn, server: McpServerTool, call: McpCall) -> None:
        """Call the server; the item ends completed or failed, the rollout goes on (MCP-8)."""
        self.ran += 1
        try:
            output = await self.sessions.call(server, call.name, call.arguments)
        except McpFault as fault:
            done = msgspec.structs.replace(call, error=fault.error, status="failed")
            await turn.sink.send(turn.stream.hosted_event(ev.McpCallFailed))
            text = f"Error: {fault.message}"
        else:
            done = msgspec.structs.replace(call, output=output, status="completed")
            await turn.sink.send(turn.stream.hosted_event(ev.McpCallCompleted))
            text = output
        await turn.sink.send(turn.stream.close_hosted(done))
        self.outputs.append(
            FunctionCallOutput(call_id=call.approval_request_id or call.id, output=text)
        )

    async def answer_approvals(self, host: Host, turn: Turn, tools: Toolset) -> None:
        """The input's ``mcp_approval_response`` items: an approved call runs now, a denied one
        is reported; either way its output joins the context before the model samples (MCP-9).
        The call's server is the one whose listed tool it names (as offered, MCP-6)."""
        answers = self._answers
        if not answers:
            return
        self.offered(tools, host.ctx)
        for call in [c for c in host.ctx.pending_calls() if c.call_id in answers]:
            approve, reason = answers[call.call_id]
            route = self._routes.get(call.name)
            item = McpCall(
                id=new_id("mcp"),
                server_label=route[0].server_label if route is not None else "",
                name=call.name,
                arguments=call.arguments if isinstance(call, FunctionCall) else "",
                approval_request_id=call.call_id,
                status="in_progress",
            )
            await turn.sink.send(turn.stream.open_hosted(item))
            if approve and route is not None:
                await turn.sink.send(turn.stream.hosted_event(ev.McpCallInProgress))
                await self._run(turn, route[0], item)
            else:
                await self._deny(turn, item, approve, reason)
        self._answers = {}
        join(host, self.take_outputs(), "mcp")
        self.ran = 0  # they ran before the step: the model reads them in it

    async def _deny(self, turn: Turn, item: McpCall, approved: bool, reason: str | None) -> None:
        if approved:  # approved, but the request no longer names an offered tool
            message = "The tool is no longer offered."
        else:
            message = f"The call was denied: {reason}" if reason else "The call was denied."
        error = {"type": "mcp_protocol_error", "code": DENIED, "message": message}
        done = msgspec.structs.replace(item, error=error, status="failed")
        await turn.sink.send(turn.stream.hosted_event(ev.McpCallFailed))
        await turn.sink.send(turn.stream.close_hosted(done))
        call_id = item.approval_request_id or item.id
        self.outputs.append(FunctionCallOutput(call_id=call_id, output=message))

    def accept(
        self, items: list[InputItem], texts: list[list[str]] | None
    ) -> tuple[list[InputItem], list[list[str]] | None]:
        """A client's items as they join the context (MCP-16); the approval answers among them
        are acted on before the model next samples, whatever the path (MCP-9)."""
        self._answers.update(approval_answers(items))
        return replayed(items, texts)

    def take_outputs(self) -> list[InputItem]:
        outputs, self.outputs = self.outputs, []
        return outputs


# --------------------------------------------------------------------------- the context form


def call_form(item: OutputItem) -> InputItem:
    """The model's own output item as the context holds it: an MCP call or approval request as
    its function call (its output joins after the step, MCP-15); other items as they are.
    Exact types (none is subclassed): a missed ``isinstance`` of a union costs ~0.6 us."""
    if type(item) is McpCall or type(item) is McpApprovalRequest:
        return FunctionCall(call_id=item.id, name=item.name, arguments=item.arguments)
    if type(item) is McpListTools:
        return OpaqueItem(msgspec.to_builtins(item))
    return cast(InputItem, item)  # not an MCP item: one the input carries as well


def as_input(item: OutputItem) -> InputItem:
    """An output item as a client would send it back: MCP items as the opaque items input
    carries (ITEM-7), others as they are (a conversation's items, CONV-5)."""
    if isinstance(item, McpCall | McpApprovalRequest | McpListTools):
        return OpaqueItem(msgspec.to_builtins(item))
    return item


def context_form(item: OutputItem | InputItem) -> list[InputItem]:
    """An MCP item a client replays as the context holds it (see the module docstring): a
    finished call as its function call and output, or only its output when it ran on an
    approval (the request stands for the call) (MCP-16); other items as they are."""
    if isinstance(item, McpCall | McpApprovalRequest):
        data: dict[str, Any] = msgspec.to_builtins(item)
    elif isinstance(item, McpListTools):
        return [OpaqueItem(msgspec.to_builtins(item))]
    elif isinstance(item, OpaqueItem) and item.type in ("mcp_call", "mcp_approval_request"):
        data = item.data
    else:
        return [item]
    call = FunctionCall(
        call_id=str(data["id"]), name=str(data["name"]), arguments=str(data["arguments"])
    )
    if data["type"] == "mcp_approval_request" or data.get("status") == "in_progress":
        return [call]
    answer = data.get("output")
    if answer is None:
        error = data.get("error")
        answer = f"Error: {error.get('message', 'failed') if isinstance(error, dict) else error}"
    approved = data.get("approval_request_id")
    if isinstance(approved, str):
        return [FunctionCallOutput(call_id=approved, output=str(answer))]
    return [call, FunctionCallOutput(call_id=call.call_id, output=str(answer))]


def replayed(
    items: list[InputItem], texts: list[list[str]] | None
) -> tuple[list[InputItem], list[list[str]] | None]:
    """A client's items with its replayed MCP items in their context form (MCP-16); their
    texts are recomputed when anything changed."""
    if OpaqueItem not in map(type, items):  # the usual input: compared in C
        return items, texts
    if not any(type(i) is OpaqueItem and i.type in _REPLAYED for i in items):
        return items, texts
    return [form for item in items for form in context_form(item)], None


_REPLAYED = frozenset({"mcp_call", "mcp_approval_request"})


def join(host: Host, items: list[InputItem], param: str) -> None:
    """Items the engine adds (listings, MCP outputs) join the context through the one
    pipeline, like a client's input (validated, scanned, rendered)."""
    if items:
        supports = host.backend.supports
        host.pipeline.apply(host.ctx, items, path=INCREMENTAL, supports=supports, param=param)


def listed_servers(items: Iterable[InputItem]) -> dict[str, list[McpListedTool]]:
    """Each server label's listed tools, from the context's ``mcp_list_tools`` items (MCP-4)."""
    found: dict[str, list[McpListedTool]] = {}
    for item in items:
        if isinstance(item, OpaqueItem) and item.type == "mcp_list_tools":
            label = str(item.data.get("server_label", ""))
            tools = item.data.get("tools")
            try:
                found[label] = msgspec.convert(tools or [], list[McpListedTool])
            except msgspec.ValidationError:
                found[label] = []
    return found


def approval_answers(items: Iterable[InputItem]) -> dict[str, tuple[bool, str | None]]:
    """``mcp_approval_response`` items: request id -> (approve, reason)."""
    answers: dict[str, tuple[bool, str | None]] = {}
    for item in items:
        if type(item) is OpaqueItem and item.type == "mcp_approval_response":
            reason = item.data.get("reason")
            answers[str(item.data["approval_request_id"])] = (
                item.data.get("approve") is True,
                str(reason) if reason is not None else None,
            )
    return answers


def allowed(server: McpServerTool, tool: McpListedTool) -> bool:
    """``allowed_tools``: a list of names, or a filter (``tool_names``, ``read_only``)."""
    rule = server.allowed_tools
    if rule is None:
        return True
    if isinstance(rule, list):
        return tool.name in rule
    return _matches(rule, tool)


def needs_approval(server: McpServerTool, name: str) -> bool:
    """``require_approval``: ``always`` (also the default, as OpenAI's), ``never``, or a filter:
    tools named under ``never`` run at once, every other tool asks (MCP-9)."""
    rule = server.require_approval
    if rule is None or rule == "always":
        return True
    if rule == "never":
        return False
    if isinstance(rule, dict):
        never = rule.get("never")
        always = rule.get("always")
        if isinstance(always, dict) and name in (always.get("tool_names") or ()):
            return True
        return not (isinstance(never, dict) and name in (never.get("tool_names") or ()))
    return True


def _matches(rule: dict[str, Any], tool: McpListedTool) -> bool:
    names = rule.get("tool_names")
    if names is not None and tool.name not in names:
        return False
    if rule.get("read_only") is True:
        hints = tool.annotations if isinstance(tool.annotations, dict) else {}
        return hints.get("readOnlyHint") is True
    return True


def _as_function(tool: McpListedTool, server: McpServerTool) -> FunctionTool:
    schema = tool.input_schema if isinstance(tool.input_schema, dict) else {"type": "object"}
    return FunctionTool(name=tool.name, parameters=schema, description=tool.description)
