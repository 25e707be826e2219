"""An OpenRLHF-style local reward function (`--remote_rm_url reward_func.py`):
`reward_func(queries, prompts, labels)` where a query is prompt plus
completion and labels come from the task field `label_key` names (default
"tests"). Return a tensor (or list) of rewards, or a dict with "rewards"
(and optionally "scores" and "extra_logs"), as OpenRLHF's examples do.

    [[reward.custom]]
    name = "mentions_entry_point"
    kind = "python"
    path = "../examples/rewards/openrlhf_reward_func.py"
    signature = "openrlhf"      # function defaults to reward_func
"""

import torch


def reward_func(queries, prompts, labels, **kwargs):
    rewards = []
    for query, prompt in zip(queries, prompts):
        completion = query[len(prompt):]
        rewards.append(1.0 if "return" in completion else 0.0)
    reward = torch.tensor(rewards, dtype=torch.float)
    return {"rewards": reward, "scores": reward, "extra_logs": {"dummy_scores": reward}}
