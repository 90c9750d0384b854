#!/usr/bin/env bash
# Builds the libzmq tandem links: Debian 12's zeromq3 source package (upstream 4.3.4, fetched
# by apt from the machine's own Debian sources and checked against their signed Release files)
# with tandem's patches (third_party/libzmq/*.patch: why each exists is at its top), as a static
# library with CurveZMQ through libsodium. One build per machine and user, shared by every build
# tree and clone: it goes to a cache folder named after a hash of the patches and this script,
# so changing either builds anew and nothing else does. Idempotent; concurrent runs wait for
# each other. Called by scripts/install-deps.sh and by CMake at configure time.
#
#   build-libzmq.sh            build if missing (about a minute on 2 cores; prints progress)
#   build-libzmq.sh --prefix   print the install prefix and nothing else (CMake links from it)
#
# TANDEM_DEPS_DIR overrides the cache folder (default ${XDG_CACHE_HOME:-~/.cache}/tandem).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
upstream=4.3.4  # the version the patches are made against
patches=("$repo"/third_party/libzmq/*.patch)
key=$(cat "${patches[@]}" "$repo/scripts/build-libzmq.sh" | sha256sum | cut -c1-12)
cache=${TANDEM_DEPS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tandem}
prefix=$cache/libzmq-$upstream-$key
if [ "${1:-}" = --prefix ]; then echo "$prefix"; exit 0; fi
[ -e "$prefix/.complete" ] && exit 0

mkdir -p "$cache"
exec 9>"$cache/libzmq.lock"
flock 9
[ -e "$prefix/.complete" ] && exit 0  # another run built it while this one waited
start=$(date +%s)

# 1. The source package, by name, through apt with its own lists: the system's apt
#    configuration and state are not touched. deb-src entries are made from the machine's deb
#    entries (deb822 .sources files and classic .list lines).
apt_dir=$cache/apt
if ! ls "$apt_dir"/zeromq3_"$upstream"-*.dsc >/dev/null 2>&1; then
  rm -rf "$apt_dir" && mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache" "$apt_dir/sources"
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -e "$f" ] && sed -E 's/^Types:.*/Types: deb-src/' "$f" >"$apt_dir/sources/$(basename "$f")"
  done
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -e "$f" ] && sed -nE 's/^deb (.*)/deb-src \1/p' "$f" >"$apt_dir/sources/$(basename "$f")"
  done
  apt_opts=(-qq -o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$apt_dir/sources"
            -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache")
  echo "build-libzmq: fetching Debian's zeromq3 source package"
  apt-get "${apt_opts[@]}" update 2>&1 | grep -v "unsandboxed" || true
  (cd "$apt_dir" && apt-get "${apt_opts[@]}" source --download-only zeromq3 2>&1 |
     grep -v "unsandboxed" || true)
fi
dsc=$(ls "$apt_dir"/zeromq3_*.dsc 2>/dev/null | head -1)
version=$(sed -n 's/^Version: //p' "${dsc:-/dev/null}")
if [ "${version%-*}" != "$upstream" ]; then
  echo "build-libzmq: Debian's zeromq3 is '${version:-not found}', tandem's patches are made" \
       "for $upstream-*: update third_party/libzmq/ and 'upstream' in $0" >&2
  exit 1
fi

# 2. Unpack (dpkg-source checks the files against the .dsc and applies Debian's patches), then
#    apply tandem's.
src=$cache/libzmq-src-$key
rm -rf "$src" "$cache/libzmq-build-$key" "$prefix"
# (its "Can't check signature" is the .dsc's own signature: apt has checked the files' hashes
# against the signed Release file already.)
dpkg-source -q -x "$dsc" "$src" 2>&1 | grep -v -e "^gpgv:" -e "^dpkg-source: warning: .*signature" || true
[ -d "$src/src" ] || { echo "build-libzmq: dpkg-source -x $dsc failed" >&2; exit 1; }
for p in "${patches[@]}"; do patch -s -p1 -d "$src" <"$p"; done

# 3. Build and install: static, position-independent (tandem's executables are PIE), and shared
#    from the same objects (for the sanitizer builds: see CMakeLists.txt), CurveZMQ through
#    libsodium as Debian's build has it; no tests, docs, perf tools or draft API. Always with
#    the system's default compilers, whatever the build tree that asked uses.
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
env -u CC -u CXX -u CFLAGS -u CXXFLAGS -u LDFLAGS cmake -S "$src" -B "$cache/libzmq-build-$key" \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$prefix" -DCMAKE_INSTALL_LIBDIR=lib \
  -DBUILD_SHARED=ON -DBUILD_STATIC=ON -DBUILD_TESTS=OFF -DWITH_PERF_TOOL=OFF -DWITH_DOCS=OFF \
  -DWITH_DOC=OFF -DENABLE_DRAFTS=OFF -DENABLE_CPACK=OFF -DWITH_LIBSODIUM=ON -DENABLE_CURVE=ON \
  -DWITH_LIBBSD=OFF -DENABLE_WS=OFF "${launcher[@]}" >"$cache/libzmq-build-$key.log" 2>&1 ||
  { tail -30 "$cache/libzmq-build-$key.log"; exit 1; }
cmake --build "$cache/libzmq-build-$key" -j"$(nproc)" >>"$cache/libzmq-build-$key.log" 2>&1 &&
  cmake --install "$cache/libzmq-build-$key" >>"$cache/libzmq-build-$key.log" 2>&1 ||
  { grep -E -A5 "error" "$cache/libzmq-build-$key.log" | head -40; exit 1; }
rm -rf "$src" "$cache/libzmq-build-$key"
touch "$prefix/.complete"
echo "build-libzmq: libzmq $version + tandem's patches in $prefix ($(($(date +%s) - start)) s)"
