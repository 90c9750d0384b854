#!/usr/bin/env bash
# Runs the test suite of built trees repeatedly under CPU contention, as CI's 2 cores may see
# it: `stress-ng --cpu 2` beside `ctest --repeat until-fail:N -j3`. A test that can lose a race
# shows here before it turns CI red at random. Not part of scripts/test.sh (it takes long).
#
#   scripts/stress-tests.sh [--repeat N] [--hog N] release [tsan] [asan]
#
# Each named build must exist (scripts/test.sh makes build/release, build/tsan, build/asan).
# The tsan and asan runs use the same test selection and options as scripts/test.sh. Prints one
# line per build with ctest's summary; exits non-zero if any run failed.
set -uo pipefail
cd "$(dirname "$0")/.."
repeat=5 hog=2
builds=()
while [ $# -gt 0 ]; do
  case $1 in
    --repeat) repeat=$2; shift 2 ;;
    --hog) hog=$2; shift 2 ;;
    release|tsan|asan) builds+=("$1"); shift ;;
    *) echo "usage: $0 [--repeat N] [--hog N] release|tsan|asan ..." >&2; exit 2 ;;
  esac
done
[ ${#builds[@]} -gt 0 ] || builds=(release)
command -v stress-ng >/dev/null || {
  sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends stress-ng >/dev/null
}

status=0
for b in "${builds[@]}"; do
  [ -d "build/$b" ] || { echo "stress: build/$b does not exist (run scripts/test.sh first)"; status=1; continue; }
  log=build/stress-$b.log
  # The hog lives at most 3 hours (every loop here is bounded), and dies with this script.
  stress-ng --cpu "$hog" --timeout 3h --quiet &
  hog_pid=$!
  start=$(date +%s)
  case $b in
    release)
      (cd build/release && ctest --output-on-failure -j3 --timeout 900 --repeat until-fail:"$repeat") >"$log" 2>&1 ;;
    tsan)
      reports=$PWD/build/tsan-stress-reports
      rm -rf "$reports" && mkdir -p "$reports"
      (cd build/tsan && TSAN_OPTIONS="suppressions=$PWD/../../tests/tsan.supp log_path=$reports/tsan" \
        ctest --output-on-failure -j3 --timeout 900 --repeat until-fail:"$repeat" \
        -R '^(EventLoop|Client|Core|Engine|BatchInvariance|Backends|Files|Presets|Serve|Disagg|Hardening|PrefixCacheServe)\.' \
        -E 'SmallIsNotDegenerate|ThroughASegfault') >"$log" 2>&1
      rc=$?
      if [ -n "$(ls -A "$reports")" ]; then echo "tsan reports in $reports" >>"$log"; rc=1; fi
      (exit $rc) ;;
    asan)
      (cd build/asan && ASAN_OPTIONS=halt_on_error=1:detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
        LSAN_OPTIONS=suppressions=$PWD/../../tests/lsan.supp \
        ctest --output-on-failure -j3 --timeout 900 --repeat until-fail:"$repeat") >"$log" 2>&1 ;;
  esac
  rc=$?
  kill "$hog_pid" 2>/dev/null; wait "$hog_pid" 2>/dev/null
  summary=$(grep -E "tests passed|tests failed" "$log" | tail -1)
  echo "stress: $b: until-fail:$repeat beside stress-ng --cpu $hog: $summary ($(( $(date +%s) - start )) s, $log)"
  if [ $rc -ne 0 ]; then
    status=1
    grep -E "^\s+[0-9]+ - |\(Failed\)|\(Timeout\)" "$log" | sort -u | head -20
  fi
done
exit $status
