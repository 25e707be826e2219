"""What the bench and check scripts share: the run-config header ([run], [model] and a LoRA
adapter on the attention projections; each script appends its own sections), and the
atomic copy that keeps their results under results/."""
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
