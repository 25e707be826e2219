#!/bin/bash
# Once scripts/bench/run learning has run arm e: e's final checkpoint and the SFT start, evaluated with
# Table 7 prompts retrieved from e's long-term memory (the files here are its outputs).
set -e
cd "$(dirname "$0")/../.."
R=runs/bench-learning-60-lr1e-4
E=$R/bench-learning-e
CK=$(ls -d $E/step-* | sort -V | tail -1)
echo "checkpoint $CK"
target/release/falcon eval --config $E/bench.toml --checkpoint $CK --memory $E --out $R/e-table7.json
target/release/falcon eval --config $E/bench.toml --checkpoint runs/demo-sft/step-20 --memory $E --out $R/a-table7.json
target/release/falcon eval compare $R/a-table7.json $R/e-table7.json
