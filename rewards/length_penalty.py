"""`length_penalty`: DAPO-style soft penalty for long responses, in [-1, 0]."""

from __future__ import annotations

from toolrl import Trajectory, reward


@reward("length_penalty")
class LengthPenalty:
    """Soft penalty for long responses, in [-1, 0].

    0 up to ``max_tokens - buffer`` generated tokens, then linear down to -1 at ``max_tokens``,
    -1 beyond. ``buffer`` defaults to a quarter of ``max_tokens``; 0 makes it a hard cut."""

    def __init__(self, max_tokens: int, buffer: int | None = None) -> None:
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"length_penalty: max_tokens must be an int >= 1, got {max_tokens!r}")
        buffer = max_tokens // 4 if buffer is None else buffer
        if isinstance(buffer, bool) or not isinstance(buffer, int) or not 0 <= buffer <= max_tokens:
            raise ValueError(f"length_penalty: buffer must be an int in [0, max_tokens], "
                             f"got {buffer!r}")
        self.max_tokens, self.buffer = max_tokens, buffer

    def __call__(self, traj: Trajectory) -> float:
        length = traj.sampled_tokens
        if length > self.max_tokens:
            return -1.0
        start = self.max_tokens - self.buffer
        if length <= start:
            return 0.0
        return -(length - start) / self.buffer
