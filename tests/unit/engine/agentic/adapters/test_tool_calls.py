"""The shared tool-call parser (relax/engine/agentic/tool_calls.py), Qwen's `<tool_call>` format."""

from __future__ import annotations

from relax.engine.agentic.tool_calls import ToolCall, parse_call, parse_tool_calls


def test_every_closed_call_is_parsed_in_order_and_malformed_ones_say_why():
    text = ('I will look.<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
            '<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call>'
            '<tool_call>not json</tool_call><tool_call>{"arguments": {}}</tool_call>'
            '<tool_call>{"name": "g", "arguments": [1]}</tool_call><tool_call>{"name": "cut"')
    calls = parse_tool_calls(text)
    assert calls[:2] == [ToolCall("add", {"a": 2, "b": 3}), ToolCall("f", {"x": 1})]
    assert [c.error is not None for c in calls] == [False, False, True, True, True]  # the unclosed call is none
    assert "not JSON" in calls[2].error and '"name"' in calls[3].error and "object" in calls[4].error
    assert parse_tool_calls("The answer is \\boxed{5}.") == []


def test_parse_call_keeps_the_examples_contract():
    assert parse_call("no call") is None
    assert parse_call("<tool_call>oops</tool_call>") == {}
    assert parse_call('<tool_call>{"name": "lookup", "arguments": {"item": "fig"}}</tool_call>') == {
        "name": "lookup", "arguments": {"item": "fig"}}
