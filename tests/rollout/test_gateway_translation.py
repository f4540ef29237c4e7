"""The Responses and Messages bodies translated into the chat request the gateway serves (pure
logic: no engine). The same conversation must become the same chat messages and tools whichever
API carried it, so it renders to the same tokens."""

from __future__ import annotations

import pytest

from toolrl.rollout.gateway.anthropic_messages import MessagesRequest, error_object
from toolrl.rollout.gateway.openai_responses import ResponsesRequest, input_messages
from toolrl.rollout.gateway.protocol import ChatRequest, RequestError

TOOLS = [{"type": "function", "function": {
    "name": "add", "description": "a + b",
    "parameters": {"type": "object", "properties": {"a": {"type": "number"}},
                   "required": ["a"]}}}]
CHAT = [
    {"role": "system", "content": "Use the tools."},
    {"role": "user", "content": "What is 1 plus 2?"},
    {"role": "assistant", "content": "Adding.", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}},
        {"id": "c2", "type": "function", "function": {"name": "add", "arguments": '{"a": 2}'}}]},
    {"role": "tool", "tool_call_id": "c1", "name": "add", "content": "1"},
    {"role": "tool", "tool_call_id": "c2", "name": "add", "content": "2"},
]
RESPONSES = {"model": "m", "instructions": "Use the tools.", "input": [
    {"role": "user", "content": [{"type": "input_text", "text": "What is 1 plus 2?"}]},
    {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
     "content": [{"type": "output_text", "text": "Adding.", "annotations": []}]},
    {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "add",
     "arguments": '{"a": 1}'},
    {"type": "function_call", "call_id": "c2", "name": "add", "arguments": '{"a": 2}'},
    {"type": "function_call_output", "call_id": "c1", "output": "1"},
    {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text",
                                                                  "text": "2"}]},
], "tools": [{"type": "function", "strict": True, **TOOLS[0]["function"]}]}
MESSAGES = {"model": "m", "max_tokens": 9, "system": [{"type": "text", "text": "Use the tools."}],
            "messages": [
                {"role": "user", "content": "What is 1 plus 2?"},
                {"role": "assistant", "content": [
                    {"type": "text", "text": "Adding."},
                    {"type": "tool_use", "id": "c1", "name": "add", "input": {"a": 1}},
                    {"type": "tool_use", "id": "c2", "name": "add", "input": {"a": 2}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "c1", "content": "1"},
                    {"type": "tool_result", "tool_use_id": "c2",
                     "content": [{"type": "text", "text": "2"}], "is_error": False}]}],
            "tools": [{"name": "add", "description": "a + b",
                       "input_schema": TOOLS[0]["function"]["parameters"],
                       "cache_control": {"type": "ephemeral"}}]}


def _template(messages):
    from toolrl.rollout.gateway.capture import canonical, template_messages

    return [canonical(m) for m in template_messages(messages)]


def test_one_conversation_is_one_chat_request_whichever_api_carries_it():
    from toolrl.rollout.gateway.openai_responses import ResponsesAPI

    responses = ResponsesRequest.parse(RESPONSES)
    chat = ResponsesAPI().resolve(responses, None)
    messages = MessagesRequest.parse(MESSAGES).chat
    assert chat.tools == messages.tools == TOOLS  # tools keep the env's keys, in its order
    assert _template(chat.messages) == _template(messages.messages) == _template(CHAT)
    assert chat.tool_choice == messages.tool_choice == "auto"


def test_function_calls_join_the_assistant_message_they_follow():
    items = ResponsesRequest.parse({"model": "m", "input": [
        {"type": "function_call", "call_id": "a", "name": "f", "arguments": "{}"},
        {"type": "function_call", "call_id": "b", "name": "g", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "b", "output": "B"},
        {"type": "function_call", "call_id": "c", "name": "h", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "z", "output": "?"},
    ]}).items
    out = input_messages(items)
    assert [m["role"] for m in out] == ["assistant", "tool", "assistant", "tool"]
    assert [c["id"] for c in out[0]["tool_calls"]] == ["a", "b"] and out[0]["content"] is None
    assert out[1]["name"] == "g" and "name" not in out[3]  # an unknown call: no name
    history = [{"role": "assistant", "tool_calls": [
        {"id": "z", "type": "function", "function": {"name": "old", "arguments": "{}"}}]}]
    assert input_messages(items, history)[3]["name"] == "old"  # named from the kept history


def test_tool_results_come_before_the_user_text_of_one_message():
    chat = MessagesRequest.parse({"model": "m", "max_tokens": 1, "messages": [
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f",
                                           "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t"},
                                     {"type": "text", "text": "and now?"}]}]}).chat
    assert [(m["role"], m["content"]) for m in chat.messages] == [
        ("assistant", None), ("tool", ""), ("user", "and now?")]
    assert chat.messages[1]["name"] == "f"


@pytest.mark.parametrize(("choice", "want"), [
    ({"type": "auto"}, "auto"), ({"type": "any"}, "required"), ({"type": "none"}, "none"),
    ({"type": "tool", "name": "add"}, {"type": "function", "function": {"name": "add"}})])
def test_anthropic_tool_choice_maps_onto_the_chat_ones(choice, want):
    chat = MessagesRequest.parse({**MESSAGES, "tool_choice": choice}).chat
    assert chat.tool_choice == want
    assert chat.parses_calls == (want != "none")


def test_sampling_fields_carry_over():
    chat = MessagesRequest.parse({**MESSAGES, "temperature": 0.5, "top_p": 0.9, "top_k": 7,
                                  "stop_sequences": ["END"], "stream": True}).chat
    assert (chat.temperature, chat.top_p, chat.top_k, chat.stop, chat.max_tokens,
            chat.stream) == (0.5, 0.9, 7, ("END",), 9, True)
    req = ResponsesRequest.parse({**RESPONSES, "temperature": 0.3, "top_p": 0.5,
                                  "max_output_tokens": 17, "tool_choice": "required",
                                  "include": ["message.output_text.logprobs"]})
    assert (req.chat.temperature, req.chat.top_p, req.chat.max_tokens, req.chat.logprobs,
            req.chat.tool_choice) == (0.3, 0.5, 17, True, "required")
    assert isinstance(req.chat, ChatRequest)


def test_errors_take_anthropics_shape_and_type_by_status():
    assert error_object(400, "x")["error"] == {"type": "invalid_request_error", "message": "x"}
    assert error_object(404, "x")["error"]["type"] == "not_found_error"
    assert error_object(500, "x")["error"]["type"] == "api_error"
    assert error_object(400, "x")["type"] == "error"
    with pytest.raises(RequestError, match="max_tokens: Field required"):
        MessagesRequest.parse({"model": "m", "messages": [{"role": "user", "content": "x"}]})
    with pytest.raises(RequestError, match="Unknown parameter: 'seed'"):
        ResponsesRequest.parse({"model": "m", "input": "x", "seed": 1})
