"""A verl-style custom reward function: verl's naive reward manager calls
`compute_score(data_source=..., solution_str=..., ground_truth=...,
extra_info=...)` once per sample, and so does falcon. `ground_truth` is the
task's `ground_truth` field if it has one, else its tests; `extra_info`
holds the task's fields and falcon's `exec_report`. Return a float, or a
dict with a "score".

    [[reward.custom]]
    name = "short_code"
    kind = "python"
    path = "../examples/rewards/verl_reward.py"
    signature = "verl"          # function defaults to compute_score
"""


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    lines = [l for l in solution_str.splitlines() if l.strip()]
    return {"score": 1.0 if len(lines) <= 12 else 12.0 / len(lines), "lines": len(lines)}
