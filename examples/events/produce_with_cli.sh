#!/usr/bin/env bash
# Append JSON events to SEGMENT for SECONDS seconds with the tierfs command: every second
# the events of that second go in as one append (tierfs append SEGMENT - reads stdin).
#   produce_with_cli.sh events/batch 30
set -euo pipefail
export LC_ALL=C  # a dot in $EPOCHREALTIME whatever the locale
segment="$1" seconds="$2"
end=$((SECONDS + ${seconds%.*})) sent=0
while ((SECONDS < end)); do
  batch=""
  for _ in $(seq 20); do
    kind=view amount=0.0
    ((RANDOM % 4 == 0)) && kind=click
    ((RANDOM % 20 == 0)) && kind=buy amount="$((RANDOM % 199 + 1)).$((RANDOM % 100))"
    batch+=$(printf '{"ts":%s,"user":"batch-u%d","kind":"%s","amount":%s}' \
      "${EPOCHREALTIME:0:14}" $((RANDOM % 300)) "$kind" "$amount")$'\n'
  done
  printf '%s' "$batch" | tierfs append "$segment" - >/dev/null
  sent=$((sent + 20))
  sleep 1
done
echo "sent $sent events to $segment"
