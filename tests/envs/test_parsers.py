from forge_exp.envs.parsers import parse_llama3, parse_qwen3, parse_tiny
from forge_exp.envs.types import ToolCall


def test_qwen3_calls_and_content():
    text = 'Let me compute.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "2*3"}}\n</tool_call>' \
           '<tool_call>{"name": "calculator", "arguments": "{\\"expression\\": \\"4\\"}"}</tool_call>'
    m = parse_qwen3(text)
    assert m.malformed is None and m.content == "Let me compute."
    assert [(c.name, c.arguments) for c in m.tool_calls] == [("calculator", {"expression": "2*3"}), ("calculator", {"expression": "4"})]
    assert parse_qwen3("The answer is 6.").tool_calls == [] and parse_qwen3("The answer is 6.").content == "The answer is 6."


def test_qwen3_malformed():
    assert "JSON" in parse_qwen3('<tool_call>{"name": calculator}</tool_call>').malformed
    assert "unclosed" in parse_qwen3('<tool_call>{"name": "calculator", "arguments": {}}').malformed
    assert "name" in parse_qwen3('<tool_call>{"arguments": {}}</tool_call>').malformed
    assert "object" in parse_qwen3('<tool_call>{"name": "f", "arguments": [1]}</tool_call>').malformed


def test_llama3_json_python_tag_and_pythonic():
    m = parse_llama3('{"name": "calculator", "parameters": {"expression": "2+2"}}')
    assert m.tool_calls == [ToolCall("calculator", {"expression": "2+2"}, "call_0")]
    m = parse_llama3('<|python_tag|>{"name": "a", "parameters": {}}; {"name": "b", "parameters": {"x": 1}}')
    assert [(c.name, c.arguments) for c in m.tool_calls] == [("a", {}), ("b", {"x": 1})]
    m = parse_llama3('<|python_tag|>brave_search.call(query="weather")')
    assert (m.tool_calls[0].name, m.tool_calls[0].arguments) == ("brave_search", {"query": "weather"})
    m = parse_llama3('[calculator(expression="1+1"), lookup(key="k", n=2)]')
    assert [(c.name, c.arguments) for c in m.tool_calls] == [("calculator", {"expression": "1+1"}), ("lookup", {"key": "k", "n": 2})]
    assert parse_llama3("It is 4.").content == "It is 4." and not parse_llama3("It is 4.").tool_calls


def test_llama3_malformed_and_nothing_executed():
    assert parse_llama3('{"name": "calculator", "parameters": ').malformed
    assert parse_llama3("<|python_tag|>calculator(expression=__import__('os'))").malformed  # not a literal
    assert parse_llama3("[calculator(1)]").malformed  # positional arguments


def test_tiny():
    m = parse_tiny("[12*34]")
    assert m.tool_calls == [ToolCall("calculator", {"expression": "12*34"}, "call_0")] and m.malformed is None
    assert parse_tiny("408").content == "408" and parse_tiny("408").tool_calls == []
    for bad in ("[12*34", "12]", "[]", "[1][2]", "3[4]"):
        assert parse_tiny(bad).malformed, bad
