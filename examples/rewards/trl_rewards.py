"""TRL-style reward functions, written exactly as TRL's GRPOTrainer takes
them: keyword arguments `prompts`, `completions`, `completion_ids`, and
every dataset column (here: the task's fields and falcon's `exec_report`)
as a list with one entry per completion. Return one float per completion,
or None where the function does not apply.

    [[reward.custom]]
    name = "has_docstring"
    kind = "python"
    path = "../examples/rewards/trl_rewards.py"
    signature = "trl"
"""

import re


def has_docstring(completions, **kwargs):
    """1.0 when the answer's function has a docstring, else 0.0."""
    return [1.0 if re.search(r'def \w+\(.*\):\s*\n\s+("""|\'\'\')', c) else 0.0 for c in completions]


def reward_len(completions, **kwargs):
    """TRL's documentation example: prefer answers near 200 characters."""
    return [-abs(200 - len(completion)) / 200 for completion in completions]


def passes_all_tests(completions, exec_report, **kwargs):
    """None for samples the sandbox could not judge, else 1.0 or 0.0."""
    out = []
    for report in exec_report:
        if report.get("outcome") is None:
            out.append(None)
        else:
            out.append(1.0 if report["outcome"] == "pass" else 0.0)
    return out
