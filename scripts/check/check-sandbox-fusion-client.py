"""Drive a sandbox service with SandboxFusion's official client (sandbox-fusion
from PyPI), as verl's code reward and other users call it. Exits non-zero,
naming the check, when the service answers differently from what the client
and SandboxFusion's semantics expect.

    python check-sandbox-fusion-client.py http://127.0.0.1:8080
"""
import base64
import sys
import time

from sandbox_fusion import (CommandRunStatus, RunCodeRequest, RunStatus, SubmitRequest, TestConfig, run_code,
                            submit)

endpoint = sys.argv[1]
failures = []


def check(name, cond, detail=""):
    print(("ok   " if cond else "FAIL ") + name + ("" if cond else ": " + str(detail)), flush=True)
    if not cond:
        failures.append(name)


def run(**kw):
    kw.setdefault("language", "python")
    return run_code(RunCodeRequest(**kw), endpoint=endpoint, max_attempts=1)


r = run(code="print('Hello, world!')")
check("hello: Success, Finished, exit 0", r.status == RunStatus.Success and r.run_result.status == CommandRunStatus.Finished
      and r.run_result.return_code == 0, r)
check("hello: stdout", r.run_result.stdout == "Hello, world!\n", r.run_result.stdout)

r = run(code="import sys\nfor line in sys.stdin:\n    print(int(line) * 2)\n", stdin="3\n21\n")
check("stdin in, stdout out", r.run_result.stdout == "6\n42\n", r.run_result.stdout)

r = run(code="import sys\nprint('partial')\nsys.stderr.write('bad input\\n')\nsys.exit(3)")
check("exit status 3: Failed with return_code 3", r.status == RunStatus.Failed and r.run_result.return_code == 3, r)
check("stderr kept apart", r.run_result.stderr == "bad input\n" and r.run_result.stdout == "partial\n", r.run_result)

r = run(code="def f():\n    return 1 / 0\nf()\n")
check("an exception: Failed, return_code 1, traceback on stderr",
      r.status == RunStatus.Failed and r.run_result.return_code == 1 and "ZeroDivisionError" in r.run_result.stderr, r)

t0 = time.time()
r = run(code="while True:\n    pass\n", run_timeout=1)
took = time.time() - t0
check("busy loop: TimeLimitExceeded", r.run_result.status == CommandRunStatus.TimeLimitExceeded and r.status == RunStatus.Failed, r)
check("busy loop stopped near its 1 s limit", took < 8, took)

r = run(code="import time\ntime.sleep(30)\n", run_timeout=1)
check("sleep past the limit: TimeLimitExceeded (wall clock)", r.run_result.status == CommandRunStatus.TimeLimitExceeded, r)

r = run(code="data = open('in/x.txt').read()\nopen('out.txt', 'w').write(data.upper())\n",
        files={"in/x.txt": base64.b64encode(b"abc").decode()}, fetch_files=["out.txt", "missing.txt"])
check("files in and fetched back", r.status == RunStatus.Success and base64.b64decode(r.files.get("out.txt", "")) == b"ABC", r)

r = run(code="import socket\ns = socket.create_connection(('1.1.1.1', 80), timeout=2)\nprint('connected')\n")
check("no network inside the sandbox", r.status == RunStatus.Failed and "connected" not in (r.run_result.stdout or ""), r)

try:
    run(code="int main() {}", language="cpp")
    check("an unsupported language is refused", False, "answered")
except Exception as e:
    check("an unsupported language is refused", "400" in str(e), e)

res = submit(SubmitRequest(dataset="mine", id=7, completion="Here:\n```python\ndef add(a, b):\n    return a + b\n```\n",
                           config=TestConfig(provided_data={"id": 7, "test": {"code": "assert add(2, 3) == 5\n"}})),
             endpoint=endpoint, max_attempts=1)
check("submit: a right answer is accepted", res.accepted and res.extracted_code.strip().startswith("def add"), res)
res = submit(SubmitRequest(dataset="mine", id=7, completion="```python\ndef add(a, b):\n    return a - b\n```",
                           config=TestConfig(provided_data={"id": 7, "test": {"code": "assert add(2, 3) == 5\n"}})),
             endpoint=endpoint, max_attempts=1)
check("submit: a wrong answer is rejected", not res.accepted and len(res.tests) == 1 and not res.tests[0].passed, res)

if failures:
    print("%d check(s) failed: %s" % (len(failures), ", ".join(failures)))
    sys.exit(1)
print("all checks passed")
