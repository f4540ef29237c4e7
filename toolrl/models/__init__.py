"""Tiny locally built models for tests and the CPU demo."""
