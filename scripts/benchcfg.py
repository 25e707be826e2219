"""What the bench and check scripts share: the run-config header ([run], [model] and a LoRA
adapter on the attention projections; each script appends its own sections), the RL-step
benchmarks' task file, and the atomic copy that keeps their results under results/."""
import json
import os
import shutil


def copy_atomic(src, dst):
    """Copies `src` to `dst` through a temp file in `dst`'s directory, fsynced, then renamed:
    a kept result is either whole or absent, never half-written."""
    tmp = os.path.join(os.path.dirname(dst) or ".", f".{os.path.basename(dst)}.tmp-{os.getpid()}")
    shutil.copyfile(src, tmp)
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(tmp, dst)


def run_header(name, output_dir, model, *, seed=1, device="cpu", lora_rank=16, dropout=None):
    """[run], [model] (fp32) and [model.lora] (rank R, alpha 2R, q/k/v/o) as TOML."""
    lines = [
        "[run]",
        f"name = {json.dumps(name)}",
        f"seed = {seed}",
        f"output_dir = {json.dumps(output_dir)}",
        "[model]",
        f"path = {json.dumps(model)}",
        'dtype = "fp32"',
        f"device = {json.dumps(device)}",
        "[model.lora]",
        "enabled = true",
        f"rank = {lora_rank}",
        f"alpha = {2.0 * lora_rank}",
    ]
    if dropout is not None:
        lines.append(f"dropout = {dropout}")
    lines.append('targets = ["q_proj", "k_proj", "v_proj", "o_proj"]')
    return "\n".join(lines) + "\n"


# The RL-step benchmarks' prompts: four tasks of data/easy_python.jsonl.
STEP_TASK_IDS = ["easy/add", "easy/is_even", "easy/reverse_string", "easy/factorial"]


def write_step_tasks(root, n, path):
    """Writes `n` tasks to `path` (JSONL): STEP_TASK_IDS repeated as needed, each with a
    distinct id (`easy/add#0`, ...), so N > 4 prompts are N tasks."""
    by_id = {}
    with open(os.path.join(root, "data", "easy_python.jsonl")) as f:
        for line in f:
            t = json.loads(line)
            by_id[t["id"]] = t
    ids = (STEP_TASK_IDS * ((n + 3) // 4))[:n]
    with open(path, "w") as f:
        for k, i in enumerate(ids):
            f.write(json.dumps(dict(by_id[i], id=f"{i}#{k}")) + "\n")
    return path
