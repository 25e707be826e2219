#!/usr/bin/env python3
"""TRL half of the side-by-side RL-step benchmark: wall time of GRPO optimizer steps.

One optimizer step = one generation round of N prompts x G sampled completions
(max T new tokens, temperature 1.0), a sandboxed reward per completion (a
subprocess runs the extracted code plus one assert), and one forward/backward/
AdamW update of a LoRA adapter (rank R, alpha 2R, q/k/v/o, dropout 0) over the
N*G completions. Fp32 on CPU, no reference model (beta=0), no vLLM.

Run:  .venv/bin/python scripts/bench/bench_train_trl.py --model DIR [--steps 3] [--json]
DIR is a Hugging Face model directory (config.json, model.safetensors, tokenizer).
The first step is warm-up and is left out of the median.

It installs TRL and the few packages TRL's GRPOTrainer import path needs that
the project venv lacks, pinned and --no-deps, into ~/.cache/falcon-rl/trl-ref
(not the project venv) on first use.
"""
import argparse
import hashlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

CACHE = os.environ.get("FALCON_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "falcon-rl"))
SIDE = os.path.join(CACHE, "trl-ref")
# TRL 1.16.0 (newest 1.16.*) and what it needs beyond scripts/requirements.txt (fsspec, filelock,
# jinja2 already come with torch). Resolved against transformers 5.24.0 / peft 0.21.2 / accelerate 1.15.0.
PINS = [
    "trl==1.16.0",
    "datasets==5.2.0",
    "pyarrow==26.0.1",
    "pandas==3.1.1",
    "python-dateutil==4.0.0",
    "tzdata==2026.6",
    "dill==0.4.1",
    "multiprocess==0.70.19",
    "xxhash==4.1.0",
]

INSTRUCTION = "Write a Python function for the task below. Answer with the complete code in one ```python block.\n\n"
TASKS = [
    ('def add(a, b):\n    """Return the sum of a and b.\n    """\n',
     "assert add(2, 3) == 5 and add(-1, 1) == 0"),
    ('def is_even(n):\n    """Return True if the integer n is even, otherwise False.\n    """\n',
     "assert is_even(4) is True and is_even(7) is False"),
    ('def reverse_string(s):\n    """Return the string s reversed.\n    """\n',
     "assert reverse_string('abc') == 'cba' and reverse_string('') == ''"),
    ('def factorial(n):\n    """Return n! for a non-negative integer n (0! is 1).\n    """\n',
     "assert factorial(0) == 1 and factorial(5) == 120"),
]
CODE_BLOCK = re.compile(r"```python[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)
EXEC_TIMEOUT_S = 5.0


def ensure_trl():
    """Install PINS into SIDE once (a marker file names the pin list), then put SIDE first on sys.path."""
    key = hashlib.sha256("\n".join(PINS).encode()).hexdigest()[:16]
    marker = os.path.join(SIDE, ".installed-" + key)
    if not os.path.exists(marker):
        if os.path.isdir(SIDE):
            shutil.rmtree(SIDE)  # a different pin list (or a broken install): start clean
        print("installing %s into %s" % (" ".join(PINS), SIDE), flush=True)
        subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", SIDE] + PINS)
        with open(marker, "w") as f:
            f.write("\n".join(PINS) + "\n")
    sys.path.insert(0, SIDE)
    # datasets fingerprints every Dataset by pickling it with dill, and dill pickles by value (instead
    # of by reference) any pure-Python module whose file is outside sys.prefix: all of SIDE. That fails
    # on pyarrow ("Can't pickle <class 'MonthDayNano'>"). Treat SIDE like site-packages.
    import dill._dill
    is_builtin = dill._dill._is_builtin_module
    side = os.path.realpath(SIDE) + os.sep
    dill._dill._is_builtin_module = lambda m: is_builtin(m) or os.path.realpath(
        getattr(m, "__file__", None) or "").startswith(side)


def run_check(code, check):
    """1.0 when the code plus its assert exits 0 in a fresh, isolated interpreter within the timeout."""
    with tempfile.TemporaryDirectory(prefix="trl-bench-") as d:
        path = os.path.join(d, "candidate.py")
        with open(path, "w") as f:
            f.write(code + "\n\n" + check + "\n")
        try:
            r = subprocess.run([sys.executable, "-I", path], cwd=d, stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=EXEC_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return 0.0
        return 1.0 if r.returncode == 0 else 0.0


def make_reward(workers, phase):
    pool = ThreadPoolExecutor(max_workers=max(1, workers))

    def exec_reward(prompts, completions, check, **kwargs):
        t0 = time.perf_counter()
        jobs = []
        for completion, chk in zip(completions, check):
            text = completion[-1]["content"] if isinstance(completion, list) else completion
            m = CODE_BLOCK.search(text)
            jobs.append(pool.submit(run_check, m.group(1), chk) if m else None)
        rewards = [j.result() if j is not None else 0.0 for j in jobs]
        phase["reward"] += time.perf_counter() - t0
        return rewards

    return exec_reward


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="Hugging Face model directory")
    ap.add_argument("--prompts", type=int, default=4, help="N prompts per step")
    ap.add_argument("--generations", type=int, default=8, help="G completions per prompt")
    ap.add_argument("--max-new-tokens", type=int, default=128, help="T, the most tokens per completion")
    ap.add_argument("--lora-rank", type=int, default=16, help="R (alpha is 2R)")
    ap.add_argument("--steps", type=int, default=3, help="optimizer steps; the first is warm-up")
    ap.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    ap.add_argument("--gradient-checkpointing", action="store_true",
                    help="TRL's own default; off here so the backward pass does no recomputation")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="print one final JSON line")
    args = ap.parse_args()
    if args.generations < 2:
        ap.error("GRPO needs --generations >= 2")
    if args.steps < 1 or args.prompts < 1:
        ap.error("--steps and --prompts must be >= 1")

    # CPU only: hide any GPU before torch is imported, and keep the libraries quiet and offline.
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("WANDB_DISABLED", "true")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("DATASETS_VERBOSITY", "error")

    ensure_trl()
    import warnings
    warnings.filterwarnings("ignore")
    import torch
    torch.set_num_threads(args.threads)
    import transformers
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    import trl
    from trl import GRPOConfig, GRPOTrainer
    transformers.logging.set_verbosity_error()

    n, g, t, r = args.prompts, args.generations, args.max_new_tokens, args.lora_rank
    tasks = [TASKS[i % len(TASKS)] for i in range(n)]
    dataset = Dataset.from_dict({
        "prompt": [[{"role": "user", "content": INSTRUCTION + sig}] for sig, _ in tasks],
        "check": [chk for _, chk in tasks],
    })

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32, attn_implementation="sdpa")

    out_dir = tempfile.mkdtemp(prefix="trl-bench-out-")
    config = GRPOConfig(
        output_dir=out_dir,
        # Batch sizes count completions, not prompts: one optimizer step = one generation batch of
        # N prompts x G completions, used once (steps_per_generation = num_iterations = grad accumulation = 1).
        per_device_train_batch_size=n * g,
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        num_generations=g,
        num_iterations=1,
        max_completion_length=t,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        beta=0.0,
        learning_rate=1e-5,
        lr_scheduler_type="constant",
        max_steps=args.steps,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        bf16=False,
        fp16=False,
        save_strategy="no",
        use_vllm=False,
        gradient_checkpointing=args.gradient_checkpointing,
        log_completions=False,
        dataloader_num_workers=0,
        disable_tqdm=True,
        seed=args.seed,
    )
    assert config.generation_batch_size == n * g and config.steps_per_generation == 1, \
        (config.generation_batch_size, config.steps_per_generation)

    phase = {"generate": 0.0, "reward": 0.0}  # seconds spent in each within the current step

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.t0 = None
            self.seconds = []
            self.phases = []  # per step: (generate_s, reward_s, rest_s)
            self.logs = {}

        def on_step_begin(self, args_, state, control, **kw):
            phase["generate"] = phase["reward"] = 0.0
            self.t0 = time.perf_counter()

        def on_step_end(self, args_, state, control, **kw):
            dt = time.perf_counter() - self.t0
            self.seconds.append(dt)
            self.phases.append((phase["generate"], phase["reward"], dt - phase["generate"] - phase["reward"]))
            print("step %d: %.2f s (generate %.2f s, reward %.2f s, loss/backward/optimizer %.2f s)"
                  % ((state.global_step, dt) + self.phases[-1]), flush=True)

        def on_log(self, args_, state, control, logs=None, **kw):
            if logs and "completions/mean_length" in logs:
                self.logs[state.global_step] = dict(logs)

    timer = StepTimer()
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=make_reward(args.threads, phase),
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[timer],
        peft_config=LoraConfig(r=r, lora_alpha=2 * r, lora_dropout=0.0, bias="none", task_type="CAUSAL_LM",
                               target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]),
    )
    # Time the sampling: TRL's non-vLLM generation path is one model.generate over all N*G sequences.
    generate_single_turn = trainer._generate_single_turn

    def timed_generate(*a, **kw):
        t0 = time.perf_counter()
        try:
            return generate_single_turn(*a, **kw)
        finally:
            phase["generate"] += time.perf_counter() - t0

    trainer._generate_single_turn = timed_generate
    trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    print("trl %s, transformers %s, torch %s, %d threads; model %s (%s); LoRA r=%d alpha=%d, %d trainable params"
          % (trl.__version__, transformers.__version__, torch.__version__, torch.get_num_threads(),
             args.model, type(model).__name__, r, 2 * r, trainable), flush=True)
    print("one step = %d prompts x %d generations = %d completions, max %d new tokens; device %s"
          % (n, g, n * g, t, trainer.accelerator.device), flush=True)
    trainer.train()
    shutil.rmtree(out_dir, ignore_errors=True)

    secs = timer.seconds
    timed = secs[1:] if len(secs) > 1 else secs
    median = statistics.median(timed)
    mean_lens = [timer.logs[s]["completions/mean_length"] for s in sorted(timer.logs)]
    rewards = [timer.logs[s].get("reward") for s in sorted(timer.logs)]
    tokens = [round(m * n * g) for m in mean_lens]
    mean_completion = statistics.mean(mean_lens) if mean_lens else None
    for i, s in enumerate(secs):
        extra = ""
        if i < len(mean_lens):
            extra = ", %d completion tokens (mean %.1f), reward %.3f" % (tokens[i], mean_lens[i], rewards[i] or 0.0)
        print("step %d%s: %.2f s%s" % (i + 1, " (warm-up)" if i == 0 and len(secs) > 1 else "", s, extra))
    print("median step (after warm-up): %.2f s over %d step(s)" % (median, len(timed)))
    if tokens:
        print("completion tokens per step: %s; %.1f tokens/s over the timed steps"
              % (tokens, sum(tokens[1:] or tokens) / sum(timed)))
    if args.json:
        print(json.dumps({
            "trl_version": trl.__version__,
            "step_seconds": [round(s, 3) for s in secs],
            "median_step_s": round(median, 3),
            "prompts": n,
            "generations": g,
            "max_new_tokens": t,
            "lora_rank": r,
            "mean_completion_tokens": round(mean_completion, 2) if mean_completion is not None else None,
            "completion_tokens_per_step": tokens,
            "reward_mean_per_step": rewards,
            "phase_seconds": [{"generate": round(a, 3), "reward": round(b, 3), "train": round(c, 3)}
                              for a, b, c in timer.phases],
            "threads": args.threads,
            "gradient_checkpointing": args.gradient_checkpointing,
        }))


if __name__ == "__main__":
    main()
