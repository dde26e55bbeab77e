"""What a static check reports: one violated rule, said for the model that wrote the solution."""

from __future__ import annotations

from dataclasses import dataclass

# How the sandbox's guard names a change of torch's process-wide state (the default dtype, a
# backend flag) among what it reports, so that the trusted side says it as ``global_state``.
GLOBAL_STATE = "torch global state"


@dataclass(frozen=True)
class CheckFailure:
    """One violated rule, with a message written for the model that produced the solution."""

    name: str
    message: str
    lineno: int | None = None

    def __str__(self) -> str:
        where = f" (line {self.lineno})" if self.lineno else ""
        return f"[{self.name}]{where} {self.message}"


def dedup(failures: list[CheckFailure]) -> list[CheckFailure]:
    """One failure per (check, message): a rule broken on many lines is said once."""
    seen: set[tuple[str, str]] = set()
    unique = []
    for failure in failures:
        if (failure.name, failure.message) not in seen:
            seen.add((failure.name, failure.message))
            unique.append(failure)
    return unique
