#!/usr/bin/env bash
# Builds and runs every test: a Release build (every test), a ThreadSanitizer build (the
# threaded units and the actor processes), then one clang build with ASan+UBSan (and clang's
# thread-safety analysis) whose compile commands serve the lint (scripts/lint.sh: formatting,
# function length), and which runs the libFuzzer targets for a fixed time each and every test. All stages always run;
# the exit status is non-zero if any failed. ctest's summary of the last build closes the
# output.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh || exit 1
jobs=$(nproc)

# The sanitizer builds: -O1 and line tables only (half the compile time of -O2 -g; enough
# for the sanitizers' stack traces).
sanitize_flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG"
                "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG")

build() {  # name, extra cmake flags...
  local name=$1; shift
  cmake -S . -B "build/$name" "$@" >/dev/null || return 1
  if ! cmake --build "build/$name" -j"$jobs" >"build/$name.log" 2>&1; then
    grep -E -A5 "error" "build/$name.log" | head -80
    echo "build failed: build/$name.log"
    return 1
  fi
}

status=0
echo "=== tests: release build (build/release)"
if build release -DCMAKE_BUILD_TYPE=Release; then
  (cd build/release && ctest --output-on-failure -j"$jobs" --timeout 900) || status=1
else
  status=1
fi

# ThreadSanitizer: the threaded units, then the actor tests, in which every process (the test
# with its client library, tandem up, the scheduler, the workers) is built with TSan. Reports
# go to files (a killed worker cannot fail a test by its exit code); any file fails the stage.
# libzmq is not instrumented: see tests/tsan.supp.
echo "=== tests: tsan build (build/tsan), threaded units and actor processes"
tsan_targets="event_loop_test client_test core_test engine_test tandem tandem-worker serve_test disagg_test hardening_test prefix_cache_test prompt_pool_test"
tsan_reports=$PWD/build/tsan-reports
rm -rf "$tsan_reports" && mkdir -p "$tsan_reports"
if cmake -S . -B build/tsan "${sanitize_flags[@]}" -DTANDEM_TSAN=ON >/dev/null &&
   cmake --build build/tsan -j"$jobs" --target $tsan_targets >build/tsan.log 2>&1; then
  (cd build/tsan && TSAN_OPTIONS="suppressions=$PWD/../../tests/tsan.supp log_path=$tsan_reports/tsan" \
     ctest -j"$jobs" --timeout 900 \
     -R '^(EventLoop|Client|Core|Engine|BatchInvariance|Backends|Files|Presets|Serve|Disagg|Hardening|PrefixCacheServe|PromptPool)\.' \
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
# One clang build with ASan+UBSan (and libFuzzer's coverage): first the libFuzzer targets,
# each for a fixed time from the repository's seeds (new inputs go to a temporary folder; a
# crash or a sanitizer report fails the run), then every test.
echo "=== tests: asan build (build/asan: clang, ASan+UBSan, with the libFuzzer targets)"
# halt_on_error: a sanitizer finding fails the test that hit it.
export ASAN_OPTIONS=halt_on_error=1:detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
export LSAN_OPTIONS=suppressions=$PWD/tests/lsan.supp  # each suppression says why
# (A tree configured earlier with another compiler cannot be reconfigured with clang.)
grep -qs "CMAKE_CXX_COMPILER:.*clang" build/asan/CMakeCache.txt || rm -rf build/asan
if CC=clang CXX=clang++ build asan "${sanitize_flags[@]}" -DTANDEM_FUZZ=ON; then
  # Formatting and function length (clang-format-14, clang-tidy-14), through this clang build's
  # compile commands; its compiler also checked the thread-safety annotations.
  bash scripts/lint.sh build/asan || status=1
  # tokenizer_fuzz also runs the real vocabularies the test fixture fetches (npm).
  tests/data/fetch-llama-tree.sh build/asan/llama-tree >/dev/null || status=1
  for t in scheduler_fuzz worker_fuzz client_fuzz chat_template_fuzz chat_output_fuzz tokenizer_fuzz gguf_fuzz gateway_fuzz; do
    found=$(mktemp -d)
    if build/asan/fuzz/$t -max_total_time=20 -timeout=10 -rss_limit_mb=4096 "$found" "fuzz/corpus/$t" >"build/$t.log" 2>&1; then
      echo "fuzz: $t: $(grep -o 'Done [0-9]* runs in [0-9]* second' "build/$t.log"), no crash"
    else
      tail -40 "build/$t.log"; echo "fuzz: $t FAILED (build/$t.log)"; status=1
    fi
    rm -rf "$found"
  done
  (cd build/asan && ctest --output-on-failure -j"$jobs" --timeout 900) || status=1
else
  status=1
fi
[ $status -eq 0 ] && echo "tests: release, tsan and asan (with fuzz) builds passed" || echo "tests: FAILED (see above)"
exit $status
