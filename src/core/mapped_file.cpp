#include "core/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/status.h"

namespace strata {

namespace {

// Opens a regular file for reading. NOTE: O_NONBLOCK, so that opening a FIFO (or a device)
// returns at once instead of waiting for a writer; anything but a regular file is refused.
Result<int> open_regular(const std::string& path, struct stat* st) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    return errorf(errno == ENOENT ? StatusCode::kNotFound : StatusCode::kIoError, "{}: {}", path,
                  std::strerror(errno));
  }
  if (::fstat(fd, st) != 0 || !S_ISREG(st->st_mode)) {
    ::close(fd);
    return errorf(StatusCode::kIoError, "{}: not a regular file", path);
  }
  return fd;
}

}  // namespace

Result<std::shared_ptr<MappedFile>> MappedFile::open(const std::string& path) {
  struct stat st {};
  STRATA_ASSIGN_OR_RETURN(const int fd, open_regular(path, &st));
  std::shared_ptr<MappedFile> f(new MappedFile());
  f->path_ = path;
  f->size_ = static_cast<size_t>(st.st_size);
  if (f->size_ > 0) {
    void* p = ::mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return errorf(StatusCode::kIoError, "{}: mmap failed: {}", path, std::strerror(err));
    }
    f->data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
  return f;
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

Buffer MappedFile::buffer(size_t offset, size_t bytes,
                          const std::shared_ptr<MappedFile>& self) const {
  return Buffer(const_cast<uint8_t*>(data_) + offset, bytes, Device::cpu(), Residency::kHostMapped,
                self);
}

Result<std::string> read_text_file(const std::string& path) {
  struct stat st {};
  STRATA_ASSIGN_OR_RETURN(const int fd, open_regular(path, &st));
  std::string text;
  text.reserve(static_cast<size_t>(st.st_size));
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      return errorf(StatusCode::kIoError, "{}: read failed: {}", path, std::strerror(err));
    }
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return text;
}

}  // namespace strata
