#!/usr/bin/env bash
# Append JSON events, one line each, to FILE for SECONDS seconds, as a service writing its
# log would: FILE is on a tierfs mount (tierfs mount DIR), so each line is an append
# (the file is opened with O_APPEND; every 10 lines are fsync'ed).
#   produce_to_file.sh ~/tierfs/events/mobile 30
set -euo pipefail
export LC_ALL=C  # a dot in $EPOCHREALTIME whatever the locale
file="$1" seconds="$2"
kinds=(view view view view view view view click click click buy)  # roughly 70/25/5
exec 3>>"$file"
end=$((SECONDS + ${seconds%.*})) sent=0
while ((SECONDS < end)); do
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    kind=${kinds[RANDOM % ${#kinds[@]}]} amount=0.0
    [[ $kind == buy ]] && amount="$((RANDOM % 199 + 1)).$((RANDOM % 100))"
    printf '{"ts":%s,"user":"mobile-u%d","kind":"%s","amount":%s}\n' \
      "${EPOCHREALTIME:0:14}" $((RANDOM % 300)) "$kind" "$amount" >&3
    sent=$((sent + 1))
  done
  sync "$file"  # fsync: durable now, as any file system would make it
  sleep 0.2
done
exec 3>&-
echo "sent $sent events to $file"
