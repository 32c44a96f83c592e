#!/bin/bash
# The next session's B6 call (written in r18), carry [".whl"] (liger_kernel-0.8.5 wheel): Liger's
# own Triton autotune searched once per shape and pass (--b6-autotune record), the winners written
# to the run's results for `python -m benchmarks.peers_liger record` to merge into
# benchmarks/b6_configs.json (commit it). r12: S6's forward search alone took 101 s; S1 / S2 are
# larger, hence one item per ~280 s. A later protocol run (r17 call4.sh with B6) then times B6 at
# these winners.
set -uo pipefail
export PYTHONUNBUFFERED=1 PATH=/usr/local/cuda/bin:$PATH
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
timeout 580 python3 -m benchmarks.run --b6-autotune record --impls B6 --routing balanced \
  --shapes ${B6_SHAPES:-S1,S2} --no-ceilings --item-timeout-s 280 --budget-s 560 \
  --out $OUT/b6 > $OUT/b6.log 2>&1
echo "b6 rc=$?"; tail -20 $OUT/b6.log | cut -c1-200
cp benchmarks/b6_configs.json $OUT/  # merged on this machine by record mode
(cd $OUT && tar czf b6.tgz b6 b6.log)
