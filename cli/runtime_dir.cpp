#include "cli/runtime_dir.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

namespace tandem::cli {
namespace {

Status refuse(const std::string& dir, const std::string& why) {
  return Status::invalid("runtime folder " + dir + ": " + why);
}

// Whether a process listens on the Unix socket at `path` (a stale file left by a killed
// deployment does not: connect fails with ECONNREFUSED).
bool listening(const std::string& path) {
  sockaddr_un addr{};
  if (path.size() >= sizeof addr.sun_path) return false;
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  const bool live = ::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0;
  ::close(fd);
  return live;
}

// An existing folder: a directory (lstat: a symlink is refused, not followed) of this user,
// mode without group or other bits, serving no other deployment.
Status check_existing(const std::string& dir, const struct stat& st, const std::vector<std::string>& sockets) {
  if (S_ISLNK(st.st_mode)) return refuse(dir, "is a symbolic link (give the real folder)");
  if (!S_ISDIR(st.st_mode)) return refuse(dir, "is not a folder");
  if (st.st_uid != ::geteuid())
    return refuse(dir, "belongs to uid " + std::to_string(st.st_uid) + ", not to this user");
  if ((st.st_mode & 077) != 0)
    return refuse(dir, "is open to other users (mode " + std::to_string((st.st_mode >> 6) & 7) +
                           std::to_string((st.st_mode >> 3) & 7) + std::to_string(st.st_mode & 7) +
                           "; tandem needs 700)");
  for (const std::string& name : sockets) {
    if (listening(dir + "/" + name)) return refuse(dir, "is in use: another deployment listens on " + name);
  }
  return Status::ok();
}

}  // namespace

Result<RuntimeDir> RuntimeDir::open(const std::string& requested, const std::vector<std::string>& sockets) {
  RuntimeDir d;
  if (requested.empty()) {
    const char* base = std::getenv("XDG_RUNTIME_DIR");
    std::string tmpl =
        std::string(base && *base ? base : "/tmp") + "/tandem-" + std::to_string(::geteuid()) + "-XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr)
      return refuse(tmpl, std::string("cannot be created: ") + std::strerror(errno));
    d.path_ = tmpl;
    d.created_ = true;
    return d;
  }
  d.path_ = requested;
  while (d.path_.size() > 1 && d.path_.back() == '/') d.path_.pop_back();
  struct stat st {};
  if (::lstat(d.path_.c_str(), &st) == 0) {
    TANDEM_RETURN_IF_ERROR(check_existing(d.path_, st, sockets));
    return d;
  }
  if (errno != ENOENT) return refuse(d.path_, std::strerror(errno));
  // Parents as usual; the folder itself exclusively, so a race with another creator is lost
  // cleanly instead of sharing it.
  std::error_code ec;
  const std::filesystem::path parent = std::filesystem::path(d.path_).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  if (ec) return refuse(d.path_, "cannot create its parent: " + ec.message());
  if (::mkdir(d.path_.c_str(), 0700) != 0)
    return refuse(d.path_, std::string("cannot be created: ") + std::strerror(errno));
  if (::chmod(d.path_.c_str(), 0700) != 0)
    return refuse(d.path_, std::string("cannot be made private: ") + std::strerror(errno));
  d.created_ = true;
  return d;
}

void RuntimeDir::remove(const std::vector<std::string>& sockets) const {
  for (const std::string& name : sockets) {
    const std::string p = path_ + "/" + name;
    struct stat st {};
    if (::lstat(p.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) ::unlink(p.c_str());
  }
  if (created_) ::rmdir(path_.c_str());  // fails, and keeps the folder, if anything else is in it
}

}  // namespace tandem::cli
