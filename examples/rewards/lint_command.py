"""A command reward term: falcon keeps this process running, writes one JSON
object per sample to its stdin ({"prompt", "completion", "completion_ids",
"task", "report", "step"}) and reads one result per line from its stdout: a
number, null (does not apply), or {"score": x}.

    [[reward.custom]]
    name = "lint"
    kind = "command"
    command = ["python3", "../examples/rewards/lint_command.py"]

Here: minus the share of lines over 79 characters.
"""

import json
import sys

for line in sys.stdin:
    sample = json.loads(line)
    lines = sample["completion"].splitlines() or [""]
    long = sum(1 for l in lines if len(l) > 79)
    print(json.dumps(-long / len(lines)), flush=True)
