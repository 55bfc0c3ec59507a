#!/bin/sh
# Regenerates the lowered .sched fixtures of this folder from models/ with a
# built megac (default build/compiler/megac). They are round-trip inputs and
# real-sized samples for the validator; they are not compared with the
# current lowering.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
megac=${MEGAC:-$root/build/compiler/megac}
"$megac" lower "$root/models/stories260k.yaml" --target cpu --workers 2 -o "$here/stories260k_w2.sched"
"$megac" lower "$root/models/stories260k.yaml" --target cpu --workers 3 -o "$here/stories260k_w3.sched"
"$megac" lower "$root/models/stories260k.yaml" --target host-cuda --workers 8 -o "$here/stories260k_w8.sched"
"$megac" lower "$root/models/stories260k.yaml" --target host-cuda --workers 3 -o "$here/stories260k_hc3.sched"
