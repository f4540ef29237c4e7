"""History policies: how a rollout holds a conversation whose template may rewrite history.

A token-in/token-out rollout appends only template deltas after each sampled turn. That equals
what the model sees at inference (the template's full rendering of the conversation) only
when the template is prefix-preserving. Templates that drop earlier reasoning (DeepSeek-R1,
Qwen3) or rewrite earlier turns are not. `decide` picks one policy per template, and says
which and why in one line (`HistoryDecision.line`):

- ``delta``: the template is prefix-preserving; one sample per episode, the sampled tokens
  and the deltas after them. Exact. (Asked for explicitly, a template that is not
  prefix-preserving is refused.)
- ``per_turn``: each model turn is its own sample, prompted with the template's rendering of
  the history as at inference (assistant turns as an OpenAI-compatible server hands them
  back: parsed calls, reasoning split off); the episode's samples share its advantage, like
  the gateway's split samples. Exact. The default for a template that is not
  prefix-preserving.
- ``keep_stream``: delta-append anyway and train on the sampled stream; it differs from what
  the template renders at inference, and the line says so (a warning).
- ``preserve``: pass the chat-template keywords the family offers for keeping earlier
  reasoning (`toolrl.core.families.Thinking.preserve_kwargs`); then ``delta`` if the template
  becomes prefix-preserving, else ``per_turn`` with those keywords. A template that offers
  none is refused.

``auto`` (the default) is ``delta`` for a prefix-preserving template, else ``per_turn``. A
family that cannot be rendered exactly (``Family.exact`` false) is refused unless
``keep_stream`` says to train on the stream anyway.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

__all__ = ["HISTORY_POLICIES", "HistoryDecision", "HistoryPolicy", "HistoryPolicyError", "decide"]

HistoryPolicy = Literal["auto", "delta", "per_turn", "keep_stream", "preserve"]  # as configured
HISTORY_POLICIES: tuple[str, ...] = get_args(HistoryPolicy)
Policy = Literal["delta", "per_turn", "keep_stream"]


class HistoryPolicyError(ValueError):
    """The policy asked for cannot hold this template; the message is one line."""


@dataclass(frozen=True)
class HistoryDecision:
    """The policy a renderer uses, why, and whether its samples equal inference exactly."""

    policy: Policy
    requested: str
    reason: str
    exact: bool
    template_kwargs: Mapping[str, Any] = field(default_factory=dict)

    @property
    def per_turn(self) -> bool:
        return self.policy == "per_turn"

    def line(self) -> str:
        """The one line the dry run and the run log print."""
        asked = "" if self.requested in ("auto", self.policy) else \
            f", asked for {self.requested}"
        exact = "exact to inference" if self.exact else \
            "NOT exact: the trained tokens differ from the template's rendering at inference"
        return f"history policy: {self.policy}{asked} ({exact}; {self.reason})"


def decide(requested: str, prefix_preserving: bool, why_not: str, *, family: Any = None,
           recheck: Any = None) -> HistoryDecision:
    """The policy for a template (see the module docstring).

    Args:
        requested: one of `HISTORY_POLICIES`.
        prefix_preserving: the template passed the prefix-preserving check.
        why_not: the check's report when it did not (where the rendering first breaks).
        family: the template's `toolrl.core.families.Family`, if it has one.
        recheck: ``recheck(kwargs) -> (prefix_preserving, why_not)`` with extra template
            keywords (``preserve``).
    """
    if requested not in HISTORY_POLICIES:
        raise HistoryPolicyError(f"history_policy={requested!r}; choose one of "
                                 f"{', '.join(HISTORY_POLICIES)}")
    name = f"family {family.name}" if family is not None else "the template"
    if family is not None and not family.exact and requested != "keep_stream":
        raise HistoryPolicyError(
            f"{name} cannot be rendered exactly ({'; '.join(family.notes)}); set "
            f"rollout.history_policy=keep_stream to train on the sampled stream anyway")
    if requested == "keep_stream":
        if prefix_preserving:
            return HistoryDecision("delta", requested, "the template is prefix-preserving, "
                                   "so the sampled stream is what it renders", True)
        return HistoryDecision("keep_stream", requested, f"{name} rewrites history: "
                               f"{why_not}", False)
    if requested == "preserve":
        kwargs = dict(getattr(getattr(family, "thinking", None), "preserve_kwargs", None) or {})
        if not kwargs:
            raise HistoryPolicyError(
                f"history_policy=preserve: {name} offers no chat-template keyword that keeps "
                f"earlier reasoning; use per_turn (exact) or keep_stream")
        ok, why = recheck(kwargs) if recheck is not None else (prefix_preserving, why_not)
        if ok:
            return HistoryDecision("delta", requested, f"with {kwargs} the template keeps "
                                   f"earlier reasoning and is prefix-preserving", True, kwargs)
        return HistoryDecision("per_turn", requested, f"with {kwargs} the template still "
                               f"rewrites history ({why}): one sample per model turn", True,
                               kwargs)
    if prefix_preserving:
        if requested == "per_turn":
            return HistoryDecision("per_turn", requested, "asked for; the template is "
                                   "prefix-preserving, so deltas would be exact too", True)
        return HistoryDecision("delta", requested, "the template is prefix-preserving: "
                               "deltas on the sampled stream equal a full re-render", True)
    if requested == "delta":
        raise HistoryPolicyError(
            f"history_policy=delta: the chat template is not prefix-preserving: {why_not}. "
            f"Use per_turn (exact: one sample per model turn) or keep_stream (the sampled "
            f"stream, not exact)")
    return HistoryDecision("per_turn", requested, f"{name} rewrites history ({why_not}): "
                           f"each model turn is its own sample, prompted with the template's "
                           f"rendering as at inference", True)
