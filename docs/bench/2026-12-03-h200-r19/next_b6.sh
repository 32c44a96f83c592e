#!/bin/bash
# B6 (Liger-Kernel) at its own autotune, one shape and pass per call: carry [".whl"].
#   B6_SHAPE=S2 B6_PASS=fwd OUT=$OUT bash docs/bench/2026-12-03-h200-r19/next_b6.sh
# r19: S2's forward search outran a 280-s item limit; one item gets the whole call here (the
# search runs in the first, untimed call; the winners are then timed and recorded). Returns the
# merged benchmarks/b6_configs.json (commit it) and the run's results (merge by hand with
# `python -m benchmarks.peers_liger record results.partial.json` if the call was cut short).
# Still to record after r19: S2 fwd, S2 fwdbwd, S3-S5 both, S6 fwdbwd.
set -uo pipefail
export PYTHONUNBUFFERED=1 PATH=/usr/local/cuda/bin:$PATH
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
timeout 560 python3 -m benchmarks.run --b6-autotune record --impls B6 --routing balanced \
  --shapes ${B6_SHAPE:?} --passes ${B6_PASS:?} --no-ceilings --item-timeout-s 540 --budget-s 550 \
  --out $OUT/b6 > $OUT/b6.log 2>&1
echo "b6 rc=$?"; tail -8 $OUT/b6.log | cut -c1-200
cp benchmarks/b6_configs.json $OUT/
(cd $OUT && tar czf b6.tgz b6 b6.log && rm -rf b6 b6.log)
