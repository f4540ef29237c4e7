"""Fault table, tools: a tool raises, hangs past its timeout, returns 10 MB, returns bytes that
are not UTF-8 or values that are not JSON.

Expected: the call becomes a typed error observation (or, for odd but harmless output, a clean
text observation), the episode goes on (the next call works and the episode ends normally), and
the whole batch, event-loop shutdown included, finishes in bounded time. Each test plays a batch
of episodes at once and counts them in and out.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from fault_harness import (
    FAULT_ENV,
    assert_conserved,
    call,
    fault_row,
    play_batch,
    turn_errors,
)

from toolrl.core.parse import get_format
from toolrl.core.registration import make_env

pytestmark = pytest.mark.timeout(120)
CAP = 2000  # ToolEnv.default_max_output_chars


def play(rows, **env_kwargs):
    """Run the batch on a fresh event loop; asyncio.run returning proves nothing waits on a
    hung tool thread at shutdown. Tools get 10 s unless a test times them out on purpose (the
    env's 0.5 s default timed a raising tool out once on a loaded machine)."""
    env_kwargs.setdefault("tool_timeout", 10.0)
    return asyncio.run(play_batch(lambda: make_env(FAULT_ENV, **env_kwargs), rows, timeout=60))


def assert_episode_went_on(ep) -> None:
    assert ep.finish_reason == "terminated" and ep.success, \
        "the episode did not reach its end after the fault"
    echoes = [m["content"] for m in ep.messages if m.get("name") == "echo"]
    assert ep.turns[1].errors == [] and echoes[-1] == "still here"


def test_a_tool_that_raises_is_a_tool_exception():
    rows = [fault_row(f"raise-{i}", "boom") for i in range(4)]
    episodes = play(rows)
    for ep in episodes.values():
        assert turn_errors(ep) == ["tool_exception"]
        assert json.loads(ep.messages[2]["content"]) == {
            "error": "tool_exception", "tool": "boom", "message": "RuntimeError: kaboom"}
        assert_episode_went_on(ep)


@pytest.mark.parametrize("tool_name", ["hang_sync", "hang_async"])
def test_a_tool_that_hangs_times_out(tool_name):
    rows = [fault_row(f"{tool_name}-{i}", tool_name) for i in range(4)]
    episodes = play(rows, tool_timeout=0.3)
    for ep in episodes.values():
        assert turn_errors(ep) == ["timeout"]
        assert "did not finish within 0.3 s" in ep.messages[2]["content"]
        assert_episode_went_on(ep)


def test_a_hung_sync_tool_does_not_block_the_sync_shim_or_close():
    """env.step (private loop) and env.close (executor shutdown) return despite the thread."""
    env = make_env(FAULT_ENV, tool_timeout=0.3)
    env.reset(options=fault_row("shim", "hang_sync"))
    obs, _, terminated, _, info = env.step("go")
    assert [e["type"] for e in info["errors"]] == ["timeout"] and not terminated
    obs, _, _, _, info = env.step("go")
    assert obs[0]["content"] == "still here"
    env.close()


@pytest.mark.parametrize("kind", ["text", "bytes", "json"])
def test_a_10_mb_output_is_cut_to_the_cap(kind):
    rows = [fault_row(f"huge-{kind}-{i}", "huge", kind=kind) for i in range(3)]
    episodes = play(rows)
    for ep in episodes.values():
        assert turn_errors(ep) == ["output_truncated"]
        content = ep.messages[2]["content"]
        assert len(content) < CAP + 40 and "...[truncated " in content[CAP:]
        assert_episode_went_on(ep)
    assert sum(len(m["content"]) for ep in episodes.values() for m in ep.messages) < 20 * CAP


@pytest.mark.parametrize("kind", ["bytes", "surrogates"])
def test_output_that_is_not_utf8_becomes_valid_text(kind):
    """Raw bytes are decoded with U+FFFD; surrogate-escaped strings (what os.fsdecode and
    ``errors="surrogateescape"`` produce) lose the lone surrogates that tokenizers reject."""
    rows = [fault_row(f"utf8-{kind}-{i}", "not_utf8", kind=kind) for i in range(3)]
    episodes = play(rows)
    for ep in episodes.values():
        content = ep.messages[2]["content"]
        assert turn_errors(ep) == []
        content.encode("utf-8")  # strict: raises if a lone surrogate survived
        assert content.startswith("caf") and content.endswith(" end")
        assert_episode_went_on(ep)


@pytest.mark.parametrize("kind, expected", [("set", None), ("object", None),
                                            ("huge_int", "tool_exception")])
def test_output_that_is_not_json(kind, expected):
    """Values JSON cannot encode are shown with str(); a value that cannot even be printed
    (an int beyond Python's 4300-digit str limit) is a typed error, not a crash."""
    rows = [fault_row(f"json-{kind}-{i}", "not_json", kind=kind) for i in range(3)]
    episodes = play(rows)
    for ep in episodes.values():
        content = ep.messages[2]["content"]
        if expected is None:
            assert turn_errors(ep) == []
            assert content in ('"{1, 2, 3}"', '"<opaque value>"')
        else:
            assert turn_errors(ep) == [expected] and "cannot be rendered" in content
        assert_episode_went_on(ep)


def test_a_mixed_batch_of_tool_faults_keeps_every_episode():
    """All tool faults at once, with healthy episodes between them."""
    faults = [("boom", {}), ("hang_sync", {}), ("hang_async", {}), ("huge", {"kind": "text"}),
              ("not_utf8", {"kind": "surrogates"}), ("not_json", {"kind": "huge_int"}),
              ("echo", {"text": "healthy"})]
    rows = [fault_row(f"mixed-{i}-{name}", name, **args)
            for i in range(3) for name, args in faults]
    episodes = play(rows, tool_timeout=0.3)
    assert_conserved([r["id"] for r in rows], episodes)
    for row in rows:
        ep = episodes[row["id"]]
        assert_episode_went_on(ep)
        assert ep.messages[1]["content"] == "next" and len(ep.turns) == 3
    healthy = [ep for i, ep in episodes.items() if i.endswith("-echo")]
    assert all(turn_errors(ep) == [] for ep in healthy)


def test_the_hermes_path_reports_the_same_errors():
    """A real parse of the model's text (not the row script) reaches the same typed errors."""
    env = make_env(FAULT_ENV, tool_timeout=0.3)
    env.reset(options={"id": "hermes", "question": "q"})
    env.unwrapped.parser = get_format("hermes")
    obs, _, terminated, _, info = env.step(call("boom") + call("hang_async") +
                                           call("huge", kind="bytes") + call("echo", text="ok"))
    assert [e["type"] for e in info["errors"]] == ["tool_exception", "timeout",
                                                  "output_truncated"]
    assert [m["name"] for m in obs] == ["boom", "hang_async", "huge", "echo"]
    assert obs[-1]["content"] == "ok" and not terminated
    env.close()
