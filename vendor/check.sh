#!/usr/bin/env bash
# vendor/candle-core is candle-core 0.9.2 as published on crates.io plus vendor/candle-core.patch,
# nothing else: download the published crate (checked against the checksum Cargo.lock had for
# it), apply the patch, and compare the two trees. `bash vendor/check.sh` (.ci/run calls it).
set -euo pipefail
cd "$(dirname "$0")"
sha=c15b675b80d994b2eadb20a4bbe434eabeb454eac3ee5e2b4cf6f147ee9be091
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python3 -c "import sys, urllib.request; urllib.request.urlretrieve(sys.argv[1], sys.argv[2])" \
  https://static.crates.io/crates/candle-core/candle-core-0.9.2.crate "$work/candle-core.crate"
echo "$sha  $work/candle-core.crate" | sha256sum --check --quiet
tar -xzf "$work/candle-core.crate" -C "$work"
here="$(pwd)"
(cd "$work/candle-core-0.9.2" && git apply -p1 "$here/candle-core.patch")
if ! diff -r "$work/candle-core-0.9.2" candle-core; then
  echo "vendor/candle-core differs from candle-core 0.9.2 with candle-core.patch applied"
  exit 1
fi
echo "vendor/candle-core: candle-core 0.9.2 with candle-core.patch, nothing else"
