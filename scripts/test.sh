#!/usr/bin/env bash
# Builds and runs every test: a Release build (every test), a ThreadSanitizer build (the
# threaded units and the actor processes), the libFuzzer targets (clang, ASan+UBSan, a fixed time each), then an
# ASan+UBSan build (every test). All stages always run; the exit status is non-zero if any
# failed. ctest's summary of the last build closes the output.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh || exit 1
jobs=$(nproc)

run_suite() {  # name, extra cmake flags...
  local name=$1; shift
  echo "=== tests: $name build (build/$name)"
  cmake -S . -B "build/$name" "$@" >/dev/null || return 1
  if ! cmake --build "build/$name" -j"$jobs" >"build/$name.log" 2>&1; then
    grep -E -A5 "error" "build/$name.log" | head -80
    echo "build failed: build/$name.log"
    return 1
  fi
  (cd "build/$name" && ctest --output-on-failure -j"$jobs" --timeout 900)
}

status=0
run_suite release -DCMAKE_BUILD_TYPE=Release || status=1

# ThreadSanitizer: the threaded units, then the actor tests, in which every process (the test
# with its client library, tandem up, the scheduler, the workers) is built with TSan. Reports
# go to files (a killed worker cannot fail a test by its exit code); any file fails the stage.
# libzmq is not instrumented: see tests/tsan.supp.
echo "=== tests: tsan build (build/tsan), threaded units and actor processes"
tsan_targets="event_loop_test client_test core_test engine_test tandem tandem-worker serve_test disagg_test hardening_test prefix_cache_test"
tsan_reports=$PWD/build/tsan-reports
rm -rf "$tsan_reports" && mkdir -p "$tsan_reports"
if cmake -S . -B build/tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTANDEM_TSAN=ON >/dev/null &&
   cmake --build build/tsan -j"$jobs" --target $tsan_targets >build/tsan.log 2>&1; then
  (cd build/tsan && TSAN_OPTIONS="suppressions=$PWD/../../tests/tsan.supp log_path=$tsan_reports/tsan" \
     ctest -j"$jobs" --timeout 900 \
     -R '^(EventLoop|Client|Core|Engine|BatchInvariance|Backends|Files|Presets|Serve|Disagg|Hardening|PrefixCacheServe)\.' \
     -E 'SmallIsNotDegenerate|ThroughASegfault') || status=1
  # (ThroughASegfault sends a worker SIGSEGV on purpose: TSan reports that as a crash.)
  if [ -n "$(ls -A "$tsan_reports")" ]; then
    for f in "$tsan_reports"/*; do echo "--- $f"; head -60 "$f"; done
    echo "tsan: $(ls "$tsan_reports" | wc -l) report(s) in $tsan_reports"; status=1
  else
    echo "tsan: no reports from any process"
  fi
else
  grep -E -A5 "error" build/tsan.log | head -40; echo "build failed: build/tsan.log"; status=1
fi
# libFuzzer targets (clang, ASan+UBSan): each runs for a fixed time from the repository's
# seeds (new inputs go to a temporary folder); a crash or a sanitizer report fails the run.
echo "=== tests: fuzz build (build/fuzz), libFuzzer targets, 20 s each"
if CC=clang CXX=clang++ cmake -S . -B build/fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTANDEM_FUZZ=ON >/dev/null &&
   cmake --build build/fuzz -j"$jobs" >build/fuzz.log 2>&1; then
  for t in scheduler_fuzz worker_fuzz client_fuzz; do
    found=$(mktemp -d)
    if build/fuzz/fuzz/$t -max_total_time=20 -timeout=10 -rss_limit_mb=4096 "$found" "fuzz/corpus/$t" >"build/$t.log" 2>&1; then
      echo "fuzz: $t: $(grep -o 'Done [0-9]* runs in [0-9]* second' "build/$t.log"), no crash"
    else
      tail -40 "build/$t.log"; echo "fuzz: $t FAILED (build/$t.log)"; status=1
    fi
    rm -rf "$found"
  done
else
  grep -E -A5 "error" build/fuzz.log | head -40; echo "build failed: build/fuzz.log"; status=1
fi
# halt_on_error: a sanitizer finding fails the test that hit it.
export ASAN_OPTIONS=halt_on_error=1:detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
export LSAN_OPTIONS=suppressions=$PWD/tests/lsan.supp  # each suppression says why
run_suite asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTANDEM_SANITIZE=ON || status=1
[ $status -eq 0 ] && echo "tests: release, tsan, fuzz and asan builds passed" || echo "tests: FAILED (see above)"
exit $status
