"""What a new task's message says when the run before it was abandoned (``objects_spec.md`` §14.4).

A run that ends ``failed`` or ``canceled`` leaves its task in the history
without an answer (or with half of one). The next task's message would then
follow it as a second user request, unmarked, and a model reads the two as
one job. So the task message of a new run (not a ``--retry``, which takes
the abandoned task up again) after such a run begins with one line saying
the previous task was abandoned; the run's ``task`` holds the task alone.
Pure: it reads and writes nothing.
"""

from __future__ import annotations

from kxen_agent.session.status import RunStatus

__all__ = ["ABANDONED", "task_message_text"]

#: The line a task message begins with after an abandoned run; ``{status}`` is that run's.
ABANDONED = "[The previous task was abandoned: its run was {status} before it was done. Do not go on with it; this is the new task.]"


def task_message_text(task: str, previous_status: str | None) -> str:
    """The content of the task message of a new run whose previous run ended ``previous_status`` (None: none)."""
    if previous_status in (RunStatus.FAILED, RunStatus.CANCELED):
        return ABANDONED.format(status=previous_status) + "\n\n" + task
    return task
