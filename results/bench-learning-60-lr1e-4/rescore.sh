#!/bin/bash
# Once scripts/bench/run learning has run arm g (the configs below are its own): the kept arms a-f,
# evaluated before the cut-off rule (an answer cut off at the token limit runs its complete
# statements, docs/eval.md), rescored with it, and compared with g on both held-out sets.
# Nothing is generated; the rescored results go to runs/, the printed tables to rescored.md.
set -e
cd "$(dirname "$0")/../.."
K=results/bench-learning-60-lr1e-4
G=runs/bench-learning-60-lr1e-4/bench-learning-g
O=runs/bench-learning-60-lr1e-4/rescored
F=${FALCON_BIN:-target/release/falcon}
mkdir -p $O
for a in a b c d e f; do
  [ -f $O/$a-eval.json ] || $F eval rescore $K/$a-eval.json --config $G/bench.toml --out $O/$a-eval.json
  [ -f $O/$a-easy_python_heldout2.json ] || $F eval rescore $K/$a-easy_python_heldout2.json \
    --config $G/extra/easy_python_heldout2.toml --out $O/$a-easy_python_heldout2.json
done
cp $K/g-eval.json $K/g-easy_python_heldout2.json $O/
.venv/bin/python - "$O" <<'PY' > $K/rescored.md
import os, subprocess, sys
sys.path.insert(0, "scripts/bench")
from bench_learning import merge
o = sys.argv[1]
for a in "abcdefg":
    merge([f"{o}/{a}-eval.json", f"{o}/{a}-easy_python_heldout2.json"], f"{o}/{a}-both.json")
print("Kept arms rescored with the cut-off rule, against g (falcon eval compare ARM g)\n")
for s in ["eval", "easy_python_heldout2", "both"]:
    print(f"## {s}\n")
    for a in "abcdef":
        out = subprocess.run([os.environ.get("FALCON_BIN", "target/release/falcon"), "eval", "compare",
                              f"{o}/{a}-{s}.json", f"{o}/g-{s}.json"], capture_output=True, text=True, check=True).stdout
        print(f"### {a} vs g\n\n```\n{out.strip()}\n```\n")
PY
cat $K/rescored.md
