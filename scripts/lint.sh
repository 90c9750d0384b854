#!/usr/bin/env bash
# The mechanical checks of the code itself, run by scripts/test.sh in its clang stage:
#   - every C++ file is formatted as .clang-format says (clang-format-14);
#   - no function outside tests, fuzz targets and kernels is over 100 lines (clang-tidy-14,
#     readability-function-size, configured in .clang-tidy), read through the compile
#     commands of a configured build.
#   scripts/lint.sh BUILD_DIR
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:?usage: scripts/lint.sh BUILD_DIR (a configured build with compile_commands.json)}
[ -f "$build/compile_commands.json" ] || { echo "lint: no $build/compile_commands.json"; exit 1; }
status=0

unformatted=$(git ls-files '*.cpp' '*.h' | xargs -r -n 20 clang-format-14 --dry-run 2>&1 | grep -o '^[^:]*:[0-9]*:[0-9]*: warning' |
              cut -d: -f1 | sort -u)
if [ -n "$unformatted" ]; then
  echo "lint: not formatted (clang-format-14 -i FILE):"; printf '  %s\n' $unformatted; status=1
else
  echo "lint: every C++ file is formatted"
fi

sources=$(git ls-files '*.cpp' | grep -vE '^(tests|fuzz)/|kernels' )
long=$(printf '%s\n' $sources | xargs -r -P "$(nproc)" -n 4 clang-tidy-14 -p "$build" --quiet 2>/dev/null |
       grep -E 'readability-function-size' | sort -u)
if [ -n "$long" ]; then
  echo "lint: functions over 100 lines:"; printf '%s\n' "$long"; status=1
else
  echo "lint: no function over 100 lines ($(printf '%s\n' $sources | wc -l) files)"
fi
exit $status
