"""The guided transcript both demos print (`mcphost demo host`, `mcphost demo fleet`).

Owns: printing a step's title, a line of what happened, and an `ok`/`FAIL` verdict per
expectation, and remembering the failures (a demo exits 1 when there is any).
Must never: write anywhere but stdout, or decide a demo's exit status itself.
"""

from __future__ import annotations


class Transcript:
    def __init__(self) -> None:
        self.failures: list[str] = []

    def say(self, text: str) -> None:
        print(text, flush=True)

    def step(self, title: str) -> None:
        self.say(f"\n== {title}")

    def expect(self, ok: bool, what: str) -> None:
        self.say(f"   {'ok ' if ok else 'FAIL'} {what}")
        if not ok:
            self.failures.append(what)
