"""What the bench and check scripts share: every benchmark's run configs (and the GPU
check's), built from one header ([run], [model] and a LoRA adapter on the attention
projections), the RL-step benchmarks' task file, and the atomic copy that keeps their results
under results/."""
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


# One builder per benchmark (and the GPU check), so that what each one runs can be read and
# compared in one place.


def dist_config(root, out, steps):
    """bench_dist: the step-time run, the same config for 1 process and for 2 ranks."""
    return run_header("dist", out, "embedded", lora_rank=16, dropout=0.0) + f"""
[generation]
max_new_tokens = 64
temperature = 1.0
[tasks]
path = {json.dumps(os.path.join(root, "data", "easy_python.jsonl"))}
[exec]
workers = 1
[train]
steps = {steps}
tasks_per_step = 4
group_size = 4
lr = 1e-4
checkpoint_every = 1000
"""


def learning_config(arm, a, spec, out, init_from, eval_every):
    """bench_learning: one arm (`spec` of its ARMS; None for the SFT start, which is only
    evaluated), run under `out`, trained from the SFT checkpoint `init_from`."""
    name = f"bench-learning-{arm}"
    meta = spec["meta"] or a.algorithm if spec else "off"
    off = 'style = "off"\ncomplexity = "off"\nnegative = "off"\n' if spec and spec["rewards"] == "tests" else ""
    meta_section = "" if meta == "off" else f"""
[meta]
algorithm = "{meta}"
inner_steps = {spec['inner']}
inner_lr = {a.inner_lr}
short_term_samples = 2
long_term = {str(spec['long_term']).lower()}
long_term_demos = {1 if spec['long_term'] else 0}
prompt = "{spec.get('prompt', 'table7')}"
"""
    return run_header(name, out, "embedded:smollm2-135m-instruct") + f"""[generation]
max_new_tokens = 128
temperature = 0.8
top_p = 0.95
stop = ["\\n```\\n"]
[tasks]
path = "data/easy_python.jsonl"
tags = ["train"]
[exec]
timeout_s = 3.0
[reward]
judge = "static"
{off}[memory]
embedder = "hash"
render = "{spec.get('render', 'full') if spec else 'full'}"
[train]
steps = {a.steps or 100000}
tasks_per_step = 4
group_size = 6
lr = {a.lr}
warmup_steps = 2
schedule = "constant"
advantage = "group_mean"
checkpoint_every = 5
keep_last = 1
eval_after = true
eval_every = {eval_every}
max_minutes = {a.minutes}
init_from = {json.dumps(init_from)}
[train.loss]
pg = 1.0
fine = {spec['fine'] if spec else 0.0}
sl = {spec['sl'] if spec else 0.0}
[eval]
tags = ["heldout"]
n = {a.n}
k = [1, 5]
temperature = 0.8
top_p = 0.95
{meta_section}"""


LEARNING_HELDOUT = '[eval]\ntags = ["heldout"]\n'


def learning_extra_config(text, path):
    """An arm's config (learning_config's, or a kept one) evaluating every task of `path`
    instead of the held-out tasks; None when `text` has no LEARNING_HELDOUT to replace."""
    if LEARNING_HELDOUT not in text:
        return None
    return text.replace(LEARNING_HELDOUT, f"[eval]\npath = {json.dumps(os.path.abspath(path))}\ntags = []\n")


def meta_memory_config(work, name, a, meta, micro_batch=0):
    """bench_meta_memory: one training step, meta (`meta`) or single-level over twice the
    group, on the tasks written to `work`/tasks.jsonl."""
    group = a.group if meta else 2 * a.group
    meta_section = (
        f'[meta]\nalgorithm = "{a.algorithm}"\ninner_steps = 2\ninner_lr = 1e-3\n'
        f"short_term_samples = 2\nlong_term = {str(a.long_term).lower()}\n"
        f"long_term_demos = {1 if a.long_term else 0}\nquery_size = {a.group}\n"
        if meta else ""
    )
    return run_header(name, os.path.join(work, "runs"), "embedded", dropout=0.0) + f"""[generation]
max_new_tokens = {a.max_new_tokens}
temperature = 1.0
[tasks]
path = {json.dumps(os.path.join(work, "tasks.jsonl"))}
[reward]
judge = "static"
[memory]
embedder = "hash"
[train]
steps = 1
tasks_per_step = 4
group_size = {group}
lr = 1e-5
advantage = "group_mean"
checkpoint_every = 1
keep_last = 1
micro_batch = {micro_batch}
{meta_section}"""


def rl_steps(tasks, a):
    """What bench_rollout's and bench_train's runs share: `a.steps` single-level RL steps of
    `a.prompts` tasks × `a.generations` samples from `tasks`, scored by the static judge."""
    return f"""[generation]
max_new_tokens = {a.max_new_tokens}
temperature = 1.0
[tasks]
path = {json.dumps(tasks)}
[reward]
judge = "static"
[memory]
embedder = "hash"
[train]
steps = {a.steps}
tasks_per_step = {a.prompts}
group_size = {a.generations}
lr = 1e-5
advantage = "group_mean"
checkpoint_every = {a.steps}
keep_last = 1
"""


def rollout_config(name, runs, model, tasks, a, engine, overlap=False):
    """bench_rollout: one side's RL steps, which differ only in [rollout] engine (and vLLM's
    overlap); `tasks` is write_step_tasks' file."""
    return run_header(name, runs, model, seed=a.seed, lora_rank=a.lora_rank,
                      dropout=0.0, device=a.device) + rl_steps(tasks, a) + f"""[rollout]
engine = "{engine}"
[rollout.vllm]
max_model_len = 2048
overlap = {"true" if overlap else "false"}
tis_cap = {2.0 if overlap else 0.0}
"""


def train_config(runs, model, tasks, a):
    """bench_train: falcon's side of the RL step, the settings TRL's side mirrors; `tasks` is
    write_step_tasks' file."""
    return run_header("bench", runs, model, seed=a.seed, lora_rank=a.lora_rank,
                      dropout=0.0) + rl_steps(tasks, a) + f"""shared_prefix = {"true" if a.shared_prefix == "on" else "false"}
autocast = "{a.autocast}"
[train.loss]
pg = 1.0
fine = 0.0
sl = 0.0
"""


def strategies_config(name, strategy, task, args, out, python, *, stream=False, api_docs=None):
    """bench_strategies: one arm's `falcon eval`. `task` is (task file, format, tasks used);
    a stream (NdonnxEval) is greedy with one sample and reads `api_docs`."""
    n = 1 if stream else args.n
    lines = [
        "[run]", f'name = "{name}"', "seed = 1", f'output_dir = "{out}/runs"',
        "[model]", f'path = "{args.model}"', 'dtype = "fp32"', 'device = "cpu"',
        "[generation]", f"max_new_tokens = {args.max_new_tokens}", 'stop = ["\\n```\\n"]',
        "[exec]", "timeout_s = 5.0", f'python = "{python}"',
        "[memory]",
        # FALCON's memory was written with the hash embedder; the docs
        # strategies embed with MiniLM, the papers' kind of embedder.
        f'embedder = "{"hash" if strategy == "falcon" else args.embedder}"',
        "k_doc = 5", "k_task = 3", "top_k = 3",
        # The papers' rendering of memory, which the kept rows ran with (before
        # `render` existed; its default is now "brief", scripts/bench/run render).
        'render = "full"',
    ]
    if api_docs is not None:
        lines.append(f'api_docs = "{api_docs}"')
    lines += [
        "[eval]", f'path = "{task[0]}"', f'format = "{task[1]}"', f"max_tasks = {task[2]}",
        f"n = {n}", f"k = {[1] if n == 1 else [1, 5]}",
        f"temperature = {0.0 if n == 1 else 0.8}", f"top_p = {1.0 if n == 1 else 0.95}",
        f"batch_size = {args.batch_size}", f"checkpoint_tasks = {args.checkpoint_tasks}",
        "[strategy]", f'kind = "{strategy}"', f"max_attempts = {args.max_attempts}",
    ]
    if strategy == "falcon":
        lines.append(f'memory_run = "{args.falcon_memory}"')
    if strategy == "memocoder":
        # The planner's order the kept rows ran with (the default is now "fallback").
        lines.append('planning = "first"')
    return "\n".join(lines) + "\n"


def render_config(name, strategy, render, task, out, python, kind, *, planning=None, api_docs=None,
                  memory_run=None):
    """bench_render: one arm's `falcon eval`, greedy, one sample, 256 new tokens. `task` is
    (task file, format, tasks used); `kind` is the [strategy] kind that `strategy` runs, with
    `planning` pinned for MemoCoder's arms."""
    lines = [
        "[run]", f'name = "{name}"', "seed = 1", f'output_dir = "{out}/runs"',
        "[model]", 'path = "embedded:smollm2-135m-instruct"', 'dtype = "fp32"', 'device = "cpu"',
        "[generation]", "max_new_tokens = 256",
        "[exec]", "timeout_s = 5.0", f'python = "{python}"',
        "[memory]", f'embedder = "{"hash" if strategy == "falcon" else "minilm"}"',
        "k_doc = 5", "k_task = 3", "top_k = 3", f'render = "{render}"',
    ]
    if api_docs is not None:
        lines.append(f'api_docs = "{api_docs}"')
    lines += [
        "[eval]", f'path = "{task[0]}"', f'format = "{task[1]}"', f"max_tasks = {task[2]}",
        "n = 1", "k = [1]", "temperature = 0.0", "top_p = 1.0", "batch_size = 8",
        "checkpoint_tasks = 20",
        "[strategy]", f'kind = "{kind}"', "max_attempts = 3",
    ]
    if planning is not None:
        lines.append(f'planning = "{planning}"')
    if strategy == "falcon":
        lines.append(f'memory_run = "{memory_run}"')
    return "\n".join(lines) + "\n"


def gpu_check_config(name, model, work, train_extra, meta, ruff, exec_section, steps=2):
    """gpu_check: a short LoRA training run on the GPU; `exec_section` is the [exec] the
    machine's sandbox allows, `train_extra` and `meta` are appended to [train]."""
    return run_header(name, work, model, device="cuda") + f"""[reward.static_judge]
ruff = "{ruff}"
{exec_section}[generation]
max_new_tokens = 64
temperature = 1.0
[tasks]
path = "data/easy_python.jsonl"
tags = ["train"]
[memory]
embedder = "hash"
[train]
steps = {steps}
tasks_per_step = 4
group_size = 4
lr = 1e-4
checkpoint_every = 100
eval_after = false
{train_extra}{meta}"""
