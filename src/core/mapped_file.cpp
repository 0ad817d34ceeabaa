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

// The file behind fd (file_size bytes) read into anonymous memory of 2 MiB-aligned huge pages
// (MapMode::kHugePageCopy). *data and *mapped are set as soon as the region is mapped, so the
// caller unmaps it after a failed read too.
Status copy_into_huge_pages(int fd, size_t file_size, const std::string& path, uint8_t** data,
                            size_t* mapped) {
  constexpr size_t kHuge = size_t{2} << 20;
  const size_t size = (file_size + kHuge - 1) / kHuge * kHuge;
  void* raw =
      ::mmap(nullptr, size + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) {
    return errorf(StatusCode::kOutOfMemory, "{}: allocation of {} bytes for a copy failed", path,
                  size);
  }
  // Keep the 2 MiB-aligned part only.
  const auto base = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (base + kHuge - 1) / kHuge * kHuge;
  if (aligned > base) ::munmap(raw, aligned - base);
  if (aligned + size < base + size + kHuge) {
    ::munmap(reinterpret_cast<void*>(aligned + size), base + size + kHuge - (aligned + size));
  }
  *data = reinterpret_cast<uint8_t*>(aligned);
  *mapped = size;
  (void)::madvise(*data, size, MADV_HUGEPAGE);  // a hint: 4 KiB pages where the kernel refuses
  for (size_t done = 0; done < file_size;) {
    const ssize_t n = ::pread(fd, *data + done, file_size - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return errorf(StatusCode::kIoError, "{}: read failed at byte {}: {}", path, done,
                    n == 0 ? "unexpected end of file" : std::strerror(errno));
    }
    done += static_cast<size_t>(n);
  }
  return ok_status();
}

}  // namespace

Result<std::shared_ptr<MappedFile>> MappedFile::open(const std::string& path, MapMode mode) {
  struct stat st {};
  STRATA_ASSIGN_OR_RETURN(const int fd, open_regular(path, &st));
  std::shared_ptr<MappedFile> f(new MappedFile());
  f->path_ = path;
  f->size_ = static_cast<size_t>(st.st_size);
  f->unmap_size_ = f->size_;
  if (f->size_ > 0 && mode == MapMode::kHugePageCopy) {
    uint8_t* data = nullptr;
    const Status s = copy_into_huge_pages(fd, f->size_, path, &data, &f->unmap_size_);
    f->data_ = data;  // the destructor unmaps it, also after a failed read
    ::close(fd);
    if (!s.ok()) return s;
    return f;
  }
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
  if (data_) ::munmap(const_cast<uint8_t*>(data_), unmap_size_);
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
