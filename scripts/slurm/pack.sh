#!/usr/bin/env bash
# Submit a packcli job as four dependent Slurm jobs. Edit the variables, then:
#   bash scripts/slurm/pack.sh
# Each sbatch call is an ordinary batch job; see scripts/slurm/README.md.
set -euo pipefail

INPUTS=${INPUTS:-"/shared/corpus/*.jsonl.zst"}
TOKENIZER=${TOKENIZER:-"/shared/tokenizers/llama3/tokenizer.json"}
OUT=${OUT:-"/shared/packed/run1"}
CONFIG=${CONFIG:-"configs/pretrain.yaml"}
TOKENIZE_TASKS=${TOKENIZE_TASKS:-64}
WRITE_TASKS=${WRITE_TASKS:-16}
PACKCLI=${PACKCLI:-packcli}

tok=$(sbatch --parsable --job-name=packcli-tokenize --array=0-$((TOKENIZE_TASKS - 1)) \
  --cpus-per-task=16 --mem=32G --time=12:00:00 \
  --wrap="$PACKCLI tokenize '$INPUTS' --tokenizer '$TOKENIZER' --out '$OUT' --config '$CONFIG' --quiet")

plan=$(sbatch --parsable --job-name=packcli-plan --dependency=afterok:$tok \
  --cpus-per-task=2 --mem=64G --time=2:00:00 \
  --wrap="$PACKCLI plan --out '$OUT' --config '$CONFIG' --quiet")

write=$(sbatch --parsable --job-name=packcli-write --dependency=afterok:$plan \
  --array=0-$((WRITE_TASKS - 1)) --cpus-per-task=4 --mem=32G --time=6:00:00 \
  --wrap="$PACKCLI write --out '$OUT' --config '$CONFIG' --quiet")

sbatch --job-name=packcli-finalize --dependency=afterok:$write \
  --cpus-per-task=2 --mem=16G --time=1:00:00 \
  --wrap="$PACKCLI finalize --out '$OUT' && $PACKCLI verify '$OUT' --no-shards"
