"""falcon-rl's host for a user's Python reward function (a [[reward.custom]]
term with kind = "python"). This is the user's own, trusted code, so it runs
in a process of its own and not in the candidates' sandbox.

    python worker.py PATH FUNCTION SIGNATURE          serve requests
    python worker.py --check PATH FUNCTION SIGNATURE  import, check, exit

It reads one JSON request per line on stdin and writes one JSON answer per
line on the stdout it was started with. Before the user's file is imported,
file descriptor 1 is pointed at stderr, so a function that prints (or a
library that writes to fd 1) cannot corrupt the answers.

A request holds the step and the samples: prompt, completion, completion_ids,
task (the task's fields) and report (falcon's execution report). The answer
is {"values": [...], "extras": {...}}, one value per sample: a number, null
("does not apply", as in TRL), or {"invalid": why}; or {"error": ...} when
the function raised.
"""

import asyncio
import importlib.util
import inspect
import json
import math
import os
import sys
import traceback
import types

SIGNATURES = ("trl", "verl", "openrlhf")
# What each convention passes; a function must accept these (or **kwargs).
PARAMS = {
    "trl": ("prompts", "completions", "completion_ids"),
    "verl": ("data_source", "solution_str", "ground_truth"),
    "openrlhf": ("queries", "prompts", "labels"),
}
# TRL passes every dataset column except these as keyword arguments.
TRL_NOT_COLUMNS = ("prompt", "completion", "completion_ids")


def load(path, name):
    path = os.path.abspath(path)
    if not os.path.isfile(path):
        raise SystemExit("no such file: %s" % path)
    # The file's own directory first, so its helper modules import.
    sys.path.insert(0, os.path.dirname(path))
    mod_name = "falcon_reward_" + os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(mod_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    spec.loader.exec_module(module)
    fn = getattr(module, name, None)
    if fn is None:
        defined = sorted(
            k for k, v in vars(module).items() if callable(v) and not k.startswith("_")
        )
        raise SystemExit(
            "%s defines no %r (it defines: %s)" % (path, name, ", ".join(defined) or "nothing callable")
        )
    if not callable(fn):
        raise SystemExit("%s: %r is a %s, not a function" % (path, name, type(fn).__name__))
    return fn


def check_signature(fn, signature):
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None  # builtins and C functions: cannot tell, so let it run
    params = list(sig.parameters.values())
    var_kw = any(p.kind == p.VAR_KEYWORD for p in params)
    var_pos = any(p.kind == p.VAR_POSITIONAL for p in params)
    names = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    if signature == "openrlhf":
        positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if len(positional) < 3 and not var_pos:
            return "an OpenRLHF reward_func takes (queries, prompts, labels); %s%s takes %d positional arguments" % (
                fn.__name__, sig, len(positional))
        return None
    if signature == "trl" and not var_kw:
        return "a TRL reward function gets the dataset's columns as keyword arguments, so it needs **kwargs; %s%s has none" % (
            fn.__name__, sig)
    missing = [n for n in PARAMS[signature] if n not in names]
    if missing and not var_kw:
        return "a %s reward function is called with %s; %s%s does not accept %s" % (
            signature, ", ".join(PARAMS[signature]), fn.__name__, sig, ", ".join(missing))
    return None


def run(fn):
    if inspect.iscoroutinefunction(fn):
        return lambda *a, **k: asyncio.run(fn(*a, **k))
    return fn


def value_of(v):
    """A JSON-safe value: a float, None, or {"invalid": why}."""
    if v is None:
        return None
    if hasattr(v, "item") and callable(v.item) and not isinstance(v, (list, tuple, dict)):
        try:
            v = v.item()  # numpy and torch scalars
        except Exception:
            pass
    if isinstance(v, bool) or isinstance(v, (int, float)):
        f = float(v)
        if math.isfinite(f):
            return f
        return {"invalid": "returned %r, not a finite number" % f}
    return {"invalid": "returned a %s, not a number" % type(v).__name__}


def as_list(out):
    if hasattr(out, "tolist") and callable(out.tolist):
        out = out.tolist()  # torch tensors and numpy arrays
    if isinstance(out, (list, tuple)):
        return list(out)
    raise TypeError("returned a %s, not a list of numbers" % type(out).__name__)


def extras_of(rows, n):
    """{key: [per-sample values]} from a list of dicts (verl) or a dict of lists."""
    out = {}
    if isinstance(rows, dict):
        for k, v in rows.items():
            try:
                vals = as_list(v)
            except TypeError:
                continue
            if len(vals) == n:
                out[str(k)] = [value_of(x) if not isinstance(x, dict) else None for x in vals]
    return out


def column(task, key):
    """A task's column: its own field, else its extra field of that name."""
    if key in task and key != "extra":
        return task[key]
    return (task.get("extra") or {}).get(key)


def columns_of(samples):
    """The dataset columns TRL would pass: every task field and extra field
    of the batch (absent ones are None), less those TRL passes itself."""
    keys = []
    for s in samples:
        task = s["task"]
        for key in list(task) + list(task.get("extra") or {}):
            if key not in TRL_NOT_COLUMNS and key != "extra" and key not in keys:
                keys.append(key)
    return keys


def ground_truth(task):
    """verl's ground_truth: reward_model.ground_truth or ground_truth from a
    verl-style record, else the task's tests."""
    extra = task.get("extra") or {}
    rm = extra.get("reward_model")
    if isinstance(rm, dict) and "ground_truth" in rm:
        return rm["ground_truth"]
    if "ground_truth" in extra:
        return extra["ground_truth"]
    return task.get("tests")


def score(fn, signature, req):
    samples = req["samples"]
    n = len(samples)
    kwargs = req.get("kwargs") or {}
    conversational = req.get("completions") == "conversational"
    prompts = [s["prompt"] for s in samples]
    completions = [s["completion"] for s in samples]
    extras = {}
    if signature == "trl":
        if conversational:
            prompts_arg = [[{"role": "user", "content": p}] for p in prompts]
            completions_arg = [[{"role": "assistant", "content": c}] for c in completions]
        else:
            prompts_arg, completions_arg = prompts, completions
        columns = {}
        for key in columns_of(samples):
            columns[key] = [column(s["task"], key) for s in samples]
        columns["exec_report"] = [s["report"] for s in samples]
        columns["trainer_state"] = types.SimpleNamespace(global_step=req.get("step", 0))
        # TRL >= 1.0 hands these loggers to every reward function: per-sample
        # values of a column, and one number for the step.
        logged = {}
        columns["log_extra"] = lambda column, values: extras.__setitem__(str(column), values)
        columns["log_metric"] = lambda name, value: logged.__setitem__(str(name), value)
        columns.update(kwargs)
        out = run(fn)(
            prompts=prompts_arg,
            completions=completions_arg,
            completion_ids=[s["completion_ids"] for s in samples],
            **columns,
        )
        values = as_list(out)
        extras = extras_of(extras, n)
        for k, v in logged.items():
            extras.setdefault(k, [value_of(v)] * n)
    elif signature == "verl":
        values, rows = [], []
        call = run(fn)
        for s in samples:
            task = s["task"]
            extra = task.get("extra") or {}
            # A task read from a verl parquet file keeps its own extra_info;
            # any other task passes its fields.
            if isinstance(extra.get("extra_info"), dict):
                extra_info = dict(extra["extra_info"])
            else:
                extra_info = {k: v for k, v in task.items() if k != "extra"}
                extra_info.update(extra)
            extra_info["exec_report"] = s["report"]
            extra_info["step"] = req.get("step", 0)
            # What verl's naive reward manager adds for a single turn.
            extra_info.setdefault("num_turns", 1)
            extra_info.setdefault("rollout_reward_scores", {})
            r = call(
                data_source=extra.get("data_source", "falcon"),
                solution_str=s["completion"],
                ground_truth=ground_truth(task),
                extra_info=extra_info,
                **kwargs,
            )
            if isinstance(r, dict):
                if "score" not in r:
                    raise TypeError("returned a dict without a 'score' key (keys: %s)" % ", ".join(map(str, r)))
                rows.append(dict(r))
                r = r["score"]
            else:
                rows.append({})
            values.append(r)
        keys = sorted({k for r in rows for k in r if k != "score"})
        extras = {k: [value_of(r.get(k)) if not isinstance(r.get(k), dict) else None for r in rows] for k in keys}
    else:
        label_key = req.get("label_key", "tests")
        labels = [column(s["task"], label_key) for s in samples]
        out = run(fn)([p + c for p, c in zip(prompts, completions)], prompts, labels, **kwargs)
        if isinstance(out, dict):
            key = "rewards" if "rewards" in out else "scores" if "scores" in out else None
            if key is None:
                raise TypeError("returned a dict without 'rewards' (keys: %s)" % ", ".join(map(str, out)))
            extras = extras_of(out.get("extra_logs") or {}, n)
            out = out[key]
        values = as_list(out)
    return {"values": [value_of(v) for v in values], "extras": extras}


def main(argv):
    check = argv[:1] == ["--check"]
    if check:
        argv = argv[1:]
    if len(argv) != 3 or argv[2] not in SIGNATURES:
        raise SystemExit("usage: worker.py [--check] PATH FUNCTION {trl,verl,openrlhf}")
    path, name, signature = argv
    answers = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    try:
        fn = load(path, name)
    except SystemExit as e:
        answers.write(json.dumps({"ready": False, "error": str(e)}) + "\n")
        answers.flush()
        return 2
    except BaseException as e:
        tb = traceback.format_exc()
        answers.write(json.dumps({"ready": False, "error": "importing %s: %s: %s" % (path, type(e).__name__, e), "traceback": tb}) + "\n")
        answers.flush()
        return 2
    problem = check_signature(fn, signature)
    if problem:
        answers.write(json.dumps({"ready": False, "error": problem}) + "\n")
        answers.flush()
        return 2
    answers.write(json.dumps({"ready": True}) + "\n")
    answers.flush()
    if check:
        return 0
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            reply = score(fn, signature, json.loads(line))
        except Exception as e:
            reply = {"error": "%s: %s" % (type(e).__name__, e), "traceback": traceback.format_exc()}
        answers.write(json.dumps(reply, allow_nan=False) + "\n")
        answers.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
