// Whole-buffer file I/O for the file backend's layouts (file_storage.hpp, segment_storage.hpp):
// gathered writes and scattered reads that continue after a short transfer or an interrupt.
#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include <cstddef>
#include <string>

namespace kvgrid::cache {

// writev until `total` bytes are out; false on an error. `iov` is consumed.
bool write_all(int fd, iovec* iov, int n, std::size_t total);
// readv (offset < 0) or preadv from `offset` until `total` bytes or the end of the file; returns
// the bytes read. `iov` is consumed.
std::size_t read_all(int fd, iovec* iov, int n, std::size_t total, off_t offset = -1);

// A directory held open to sync its entries (cache.storage_fsync); closed with the handle.
class DirHandle {
 public:
  DirHandle() = default;
  ~DirHandle() { close(); }
  DirHandle(const DirHandle&) = delete;
  DirHandle& operator=(const DirHandle&) = delete;
  bool open(const std::string& dir);  // false: cannot open it
  void close();
  bool is_open() const { return fd_ >= 0; }
  bool sync() const;  // fsync of the directory (true when not open: nothing asked)
 private:
  int fd_ = -1;
};

// fdatasync, retried on EINTR.
bool sync_data(int fd);

}  // namespace kvgrid::cache
