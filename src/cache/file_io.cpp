#include "cache/file_io.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

namespace kvgrid::cache {

namespace {
// Moves an iovec array past `bytes` transferred bytes (a short writev/readv continues there).
void skip(iovec*& iov, int& n, std::size_t bytes) {
  while (bytes > 0 && n > 0) {
    const std::size_t take = std::min(bytes, iov->iov_len);
    iov->iov_base = static_cast<char*>(iov->iov_base) + take;
    iov->iov_len -= take;
    bytes -= take;
    if (iov->iov_len == 0) {
      ++iov;
      --n;
    }
  }
}
}  // namespace

bool write_all(int fd, iovec* iov, int n, std::size_t total) {
  std::size_t done = 0;
  while (done < total) {
    const ssize_t w = ::writev(fd, iov, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    done += static_cast<std::size_t>(w);
    skip(iov, n, static_cast<std::size_t>(w));  // what was written
  }
  return true;
}

std::size_t read_all(int fd, iovec* iov, int n, std::size_t total, off_t offset) {
  std::size_t done = 0;
  while (done < total && n > 0) {
    const ssize_t r = offset < 0 ? ::readv(fd, iov, n) : ::preadv(fd, iov, n, offset + static_cast<off_t>(done));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    done += static_cast<std::size_t>(r);
    skip(iov, n, static_cast<std::size_t>(r));
  }
  return done;
}

bool DirHandle::open(const std::string& dir) {
  close();
  fd_ = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  return fd_ >= 0;
}

void DirHandle::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

bool DirHandle::sync() const {
  if (fd_ < 0) return true;
  int r;
  do r = ::fsync(fd_);
  while (r != 0 && errno == EINTR);
  return r == 0;
}

bool sync_data(int fd) {
  int r;
  do r = ::fdatasync(fd);
  while (r != 0 && errno == EINTR);
  return r == 0;
}

}  // namespace kvgrid::cache
