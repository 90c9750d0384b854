# Sourced by tests/data/fetch-*.sh. `npm_pack_checked PACKAGE VERSION INTEGRITY DIR` downloads
# PACKAGE@VERSION's tarball alone into DIR (`npm pack`: no dependencies, no install scripts),
# checks it against INTEGRITY (a lock file's sha512) and prints its path. Without npm, or on a
# mismatch, it says so on stderr and fails.
npm_pack_checked() {
  local package=$1 version=$2 integrity=$3 dir=$4 me tarball actual
  me=$(basename "$0" .sh)
  command -v npm >/dev/null || { echo "$me: npm not found (Debian: apt-get install npm)" >&2; return 1; }
  echo "$me: npm pack $package@$version" >&2
  tarball=$(cd "$dir" && npm pack --silent "$package@$version" 2>/dev/null | tail -1)
  actual="sha512-$(openssl dgst -sha512 -binary "$dir/$tarball" | base64 -w0)"
  if [ "$actual" != "$integrity" ]; then
    echo "$me: $tarball has integrity $actual, the lock says $integrity" >&2
    return 1
  fi
  echo "$dir/$tarball"
}
