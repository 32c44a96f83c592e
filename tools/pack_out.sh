#!/usr/bin/env bash
# Run last in a device call: the device tool brings back at most 8 files of $OUT, so everything
# except up to 7 small top-level summaries (machine.txt, summary*.txt, *.md) goes into
# $OUT/rest.tgz (rest2.tgz, ... on later runs), which comes back. Nothing is lost to the count.
#   OUT=$OUT bash tools/pack_out.sh
set -euo pipefail
cd "${OUT:?set OUT to the output folder of the call}"
keep=$(find . -maxdepth 1 -type f \( -name machine.txt -o -name 'summary*.txt' -o -name '*.md' \) \
  -size -64k | sort | head -n 7)
all=$(find . -type f ! -name 'rest*.tgz' | sort)
rest=$(comm -23 <(echo "$all") <(echo "$keep") | sed '/^$/d')
[ -z "$rest" ] && exit 0
name=rest.tgz n=1  # an earlier run's archive stays: the next one is rest2.tgz, ...
while [ -e "$name" ]; do n=$((n + 1)) name=rest$n.tgz; done
echo "$rest" | tar czf "$name" -T -
echo "$rest" | xargs rm -f
find . -mindepth 1 -type d -empty -delete
echo "pack_out: $(echo "$rest" | wc -l) files in $name; kept: $(echo $keep)"
