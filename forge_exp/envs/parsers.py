"""Tool-call parsers: the decoded text of one assistant turn -> AssistantMessage(content, tool_calls, malformed).

Each returns `malformed` (with the reason) when the turn opens a tool call it does not finish correctly, so a
malformed call is counted, answered with an error, and never silently read as a final answer.

    parse_qwen3    Qwen3 / Hermes style: <tool_call>{"name": ..., "arguments": {...}}</tool_call>, any number
    parse_llama3   Llama 3.x: a JSON object {"name", "parameters"} (3.1 / 3.2 custom tools, ";"-separated for
                   several), <|python_tag|> followed by JSON or by a built-in call `tool.call(k=v)`, or the 3.2
                   pythonic list [f(a=1), g(b="x")]
    parse_tiny     the tiny character model's `[expression]` (forge_exp/envs/formats.py, TinyToolFormat)

Python-syntax calls are read with `ast` and literal arguments only (`ast.literal_eval`): nothing is executed.
"""

from __future__ import annotations

import ast
import json
import re

from forge_exp.envs.types import AssistantMessage, ToolCall

_QWEN_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def _call_from_json(obj: object, args_keys: tuple[str, ...], index: int) -> ToolCall | str:
    """A ToolCall, or the reason the object is not one."""
    if not isinstance(obj, dict):
        return "tool call is not a JSON object"
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return "tool call has no 'name'"
    args = next((obj[k] for k in args_keys if k in obj), {})
    if isinstance(args, str):  # some models emit the arguments as a JSON string
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return f"arguments of {name} are not JSON"
    if not isinstance(args, dict):
        return f"arguments of {name} are not an object"
    return ToolCall(name=name, arguments=args, id=f"call_{index}")


def _json_calls(parts, args_keys: tuple[str, ...], text: str) -> list[ToolCall] | AssistantMessage:
    """One call per JSON object in `parts`; the first bad one makes the whole message malformed."""
    calls: list[ToolCall] = []
    for i, part in enumerate(parts):
        try:
            obj = json.loads(part)
        except json.JSONDecodeError:
            return AssistantMessage(content=text, malformed="tool call is not valid JSON", raw=text)
        call = _call_from_json(obj, args_keys, i)
        if isinstance(call, str):
            return AssistantMessage(content=text, malformed=call, raw=text)
        calls.append(call)
    return calls


def parse_qwen3(text: str) -> AssistantMessage:
    calls = _json_calls((m.group(1) for m in _QWEN_CALL.finditer(text)), ("arguments", "parameters"), text)
    if isinstance(calls, AssistantMessage):
        return calls
    rest = _QWEN_CALL.sub("", text)
    if "<tool_call>" in rest or "</tool_call>" in rest:
        return AssistantMessage(content=text, malformed="unclosed <tool_call>", raw=text)
    return AssistantMessage(content=rest.strip(), tool_calls=calls, raw=text)


PYTHON_TAG = "<|python_tag|>"


def parse_llama3(text: str) -> AssistantMessage:
    body = text.strip()
    if body.startswith(PYTHON_TAG):
        body = body[len(PYTHON_TAG):].strip()
        if body.startswith("{"):
            return _llama_json(body, text)
        return _llama_python(body, text)
    if body.startswith("{"):
        return _llama_json(body, text)
    if re.match(r"\[\s*[A-Za-z_][\w.]*\s*\(", body):  # Llama 3.2 pythonic list
        return _llama_python(body, text)
    return AssistantMessage(content=body, raw=text)


def _llama_json(body: str, text: str) -> AssistantMessage:
    calls = _json_calls((p for p in body.split(";") if p.strip()), ("parameters", "arguments"), text)
    if isinstance(calls, AssistantMessage):
        return calls
    return AssistantMessage(content="", tool_calls=calls, raw=text)


def _llama_python(body: str, text: str) -> AssistantMessage:
    calls = _python_calls(body)
    if isinstance(calls, str):
        return AssistantMessage(content=text, malformed=calls, raw=text)
    return AssistantMessage(content="", tool_calls=calls, raw=text)


def _python_calls(body: str) -> list[ToolCall] | str:
    """`f(a=1)`, `tool.call(q="x")` or `[f(a=1), g()]`: names and literal keyword arguments only."""
    try:
        tree = ast.parse(body, mode="eval").body
    except SyntaxError:
        return "tool call is not valid Python call syntax"
    nodes = tree.elts if isinstance(tree, ast.List) else [tree]
    calls = []
    for i, node in enumerate(nodes):
        if not isinstance(node, ast.Call) or node.args:
            return "tool call must be name(key=value, ...)"
        name = _dotted(node.func)
        if name is None:
            return "tool call has no name"
        if name.endswith(".call"):  # built-in tools: brave_search.call(query=...)
            name = name[: -len(".call")]
        try:
            args = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg}
        except ValueError:
            return f"arguments of {name} are not literals"
        calls.append(ToolCall(name=name, arguments=args, id=f"call_{i}"))
    return calls


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return None if head is None else f"{head}.{node.attr}"
    return None


def parse_tiny(text: str, tool: str = "calculator", argument: str = "expression") -> AssistantMessage:
    """`[expr]` is a call of `tool` with {argument: expr}; anything else without brackets is the final answer."""
    body = text.strip()
    if "[" not in body and "]" not in body:
        return AssistantMessage(content=body, raw=text)
    if body.startswith("[") and body.endswith("]") and body.count("[") == 1 and body.count("]") == 1:
        inner = body[1:-1]
        if inner:
            return AssistantMessage(content="", tool_calls=[ToolCall(tool, {argument: inner}, "call_0")], raw=text)
        return AssistantMessage(content=text, malformed="empty tool call", raw=text)
    return AssistantMessage(content=text, malformed="a tool call is [expression] and nothing else", raw=text)
