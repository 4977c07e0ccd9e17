"""Which requests the on-demand scheduler may keep waiting behind a busy model (supervise/turns.py): only side calls
nobody watches. A chat client without tools (aider, Open WebUI, curl) in a conversation under way is a person
waiting, and must not be starved behind an agent that keeps another model busy."""

from coderouterd.routing.request import ClientRequest


def _req(body: dict) -> ClientRequest:
    return ClientRequest(ingress="openai", body=body, raw=b"", headers={}, stream=False, model="m", request_id="r")


def test_a_first_message_without_tools_is_background():
    assert _req({"messages": [{"role": "system", "content": "Name this session"},
                              {"role": "user", "content": "hi"}]}).is_background()


def test_tools_make_it_foreground():
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    assert not _req({"messages": [{"role": "user", "content": "hi"}], "tools": tools}).is_background()
    assert not _req({"messages": [{"role": "user", "content": "hi"}],
                     "functions": [{"name": "f", "parameters": {}}]}).is_background()


def test_a_conversation_under_way_without_tools_is_foreground():
    body = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
                         {"role": "user", "content": "and now?"}]}
    assert not _req(body).is_background()
