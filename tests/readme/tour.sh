#!/usr/bin/env bash
# Runs the README's tour exactly as written (the indented lines between
# <!-- tour:begin --> and <!-- tour:end -->), in a scratch directory holding a
# copy of the README, with build/engine on PATH as the tour's first line puts
# it; then checks what the tour says it makes.
#   tour.sh REPO_ROOT BUILD_DIR
set -euo pipefail
repo=$(realpath "$1"); build=$(realpath "$2")
work=$(mktemp -d /tmp/meshtrain-tour.XXXXXX)
trap 'rm -rf "$work"' EXIT
script=$work/tour-commands.sh
awk '/<!-- tour:begin -->/{on=1; next} /<!-- tour:end -->/{on=0} on && /^    /{sub(/^    /, ""); print}' \
  "$repo/README.md" > "$script"
lines=$(grep -cv '^#' "$script" || true)
[ "$lines" -ge 8 ] || { echo "tour: only $lines commands found between the README's tour markers"; exit 1; }
cp "$repo/README.md" "$work/"
mkdir -p "$work/build" && ln -s "$build/engine" "$work/build/engine"
cd "$work"
echo "tour: running $lines commands"
bash -euo pipefail -x "$script" > tour.log 2>&1 || { cat tour.log; echo "tour: a command failed (above)"; exit 1; }
for f in tour.model tour.bin tour-ckpt/manifest.json tour.jsonl tour-loss.svg tour-1024.svg; do
  [ -s "$f" ] || { cat tour.log; echo "tour: $f was not written"; exit 1; }
done
grep -q "The simulator" tour.log || { cat tour.log; echo "tour: generate did not print its prompt"; exit 1; }
grep -q "gpt3-175b" tour.log || { cat tour.log; echo "tour: no 175B simulation or plan in the output"; exit 1; }
echo "tour: every command ran and wrote what it says"
