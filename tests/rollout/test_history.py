"""History-policy decisions (pure logic): what each request gives for a prefix-preserving
template and for one that rewrites history, and the refusals."""

from __future__ import annotations

import pytest

from toolrl.core.families import Family, Thinking
from toolrl.rollout.history import HistoryPolicyError, decide

WHY = "message 4 (assistant) rewrites the rendering"


def family(**kw):
    return Family(name="fam", title="t", tool_format="hermes", requirement=None, gguf=None,
                  template="gguf", template_sha256="0" * 64, **kw)


def test_auto_is_deltas_or_per_turn_and_says_why():
    assert decide("auto", True, "").policy == "delta"
    d = decide("auto", False, WHY)
    assert d.policy == "per_turn" and d.exact and WHY in d.line()
    assert decide("per_turn", True, "").per_turn  # asked for: exact either way


def test_keep_stream_is_stated_as_not_exact():
    d = decide("keep_stream", False, WHY)
    assert d.policy == "keep_stream" and not d.exact
    assert "NOT exact" in d.line() and WHY in d.line()
    assert decide("keep_stream", True, "").policy == "delta"  # nothing to keep apart


def test_delta_and_preserve_refusals():
    with pytest.raises(HistoryPolicyError, match="not prefix-preserving"):
        decide("delta", False, WHY)
    with pytest.raises(HistoryPolicyError, match="offers no chat-template keyword"):
        decide("preserve", False, WHY, family=family(thinking=Thinking(strips_history=True)))
    keep = family(thinking=Thinking(strips_history=True, preserve_kwargs={"keep": True}))
    d = decide("preserve", False, WHY, family=keep, recheck=lambda kw: (True, ""))
    assert d.policy == "delta" and d.template_kwargs == {"keep": True}
    d = decide("preserve", False, WHY, family=keep, recheck=lambda kw: (False, "still"))
    assert d.policy == "per_turn" and d.template_kwargs == {"keep": True}


def test_a_family_that_cannot_be_rendered_exactly_is_refused_unless_told():
    bad = family(exact=False, notes=("its template depends on the date",))
    for asked in ("auto", "per_turn", "delta"):
        with pytest.raises(HistoryPolicyError, match=r"cannot be rendered exactly.*date"):
            decide(asked, False, WHY, family=bad)
    assert not decide("keep_stream", False, WHY, family=bad).exact
