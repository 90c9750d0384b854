// The private folder of a deployment's ipc:// sockets (`tandem up --runtime-dir`).
//
// tandem never takes over or deletes what is not its own: the default folder is new
// (mkdtemp), a folder the user names is created if absent, and a folder that exists must be a
// real directory (not a symlink) of this user with no access for others, and not be serving
// another deployment. On exit only the sockets tandem made there are removed, and the folder
// only if tandem created it (and it is empty then).
#pragma once

#include <string>
#include <vector>

#include "tandem/status.h"

namespace tandem::cli {

class RuntimeDir {
 public:
  // `requested` empty: a new $XDG_RUNTIME_DIR (or /tmp)/tandem-<uid>-XXXXXX, mode 0700.
  // Otherwise that folder, checked as above; `sockets` are the file names this deployment will
  // bind there (a live listener on one of them means another deployment: refused).
  static Result<RuntimeDir> open(const std::string& requested, const std::vector<std::string>& sockets);

  const std::string& path() const { return path_; }
  bool created() const { return created_; }

  // Removes `sockets` (only Unix sockets of those names) and then the folder if tandem made it
  // and nothing else is left in it.
  void remove(const std::vector<std::string>& sockets) const;

 private:
  std::string path_;
  bool created_ = false;
};

}  // namespace tandem::cli
