#include "backends/model/safetensors.hpp"

#include <ATen/ATen.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include "backends/error.hpp"
#include "strings/format.hpp"

// The format stores little-endian bytes; we copy them verbatim.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors I/O assumes a little-endian host");

namespace rlforge::backends {

namespace {

// Linux transfers at most this much per read/write call.
constexpr size_t max_io_chunk = size_t{1} << 30;

using strings::in_quotes;

std::string errno_text() {
  return std::strerror(errno);
}

class file_descriptor {
public:
  explicit file_descriptor(int fd) : fd_(fd) {}
  file_descriptor(file_descriptor&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  file_descriptor(const file_descriptor&) = delete;
  file_descriptor& operator=(const file_descriptor&) = delete;
  file_descriptor& operator=(file_descriptor&&) = delete;
  ~file_descriptor() {
    if (fd_ >= 0)
      ::close(fd_);
  }
  int get() const noexcept { return fd_; }
  /// Closes now, reporting the result (close can report a deferred write error).
  int close() noexcept {
    int rc = ::close(fd_);
    fd_ = -1;
    return rc;
  }

private:
  int fd_;
};

file_descriptor open_for_reading(const std::string& path, uint64_t& size) {
  file_descriptor fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) {
    if (errno == ENOENT)
      fail(error_code::not_found, "safetensors: no file at " + in_quotes(path));
    fail(error_code::io_error, "safetensors: cannot open " + in_quotes(path) + ": " + errno_text());
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0)
    fail(error_code::io_error, "safetensors: cannot stat " + in_quotes(path) + ": " + errno_text());
  if (!S_ISREG(st.st_mode))
    fail(error_code::io_error, "safetensors: " + in_quotes(path) + " is not a regular file");
  size = static_cast<uint64_t>(st.st_size);
  return fd;
}

void read_exactly(int fd, const std::string& path, void* out, size_t n, uint64_t offset) {
  auto* p = static_cast<char*>(out);
  while (n > 0) {
    ssize_t got = ::pread(fd, p, std::min(n, max_io_chunk), static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR)
      continue;
    if (got < 0)
      fail(error_code::io_error,
           "safetensors: reading " + in_quotes(path) + " failed: " + errno_text());
    if (got == 0)
      fail(error_code::io_error,
           "safetensors: " + in_quotes(path) + " ended early (truncated while being read?)");
    p += got;
    n -= static_cast<size_t>(got);
    offset += static_cast<uint64_t>(got);
  }
}

void write_all(int fd, const std::string& path, const void* data, size_t n) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t put = ::write(fd, p, std::min(n, max_io_chunk));
    if (put < 0 && errno == EINTR)
      continue;
    if (put < 0)
      fail(error_code::io_error, "writing " + in_quotes(path) + " failed: " + errno_text());
    p += put;
    n -= static_cast<size_t>(put);
  }
}

// Error messages from the header parser gain the file's path.
template <class F> auto with_path(const std::string& path, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const error& e) {
    fail(e.code(), in_quotes(path) + ": " + e.what());
  }
}

safetensors_header read_header(int fd, const std::string& path, uint64_t size) {
  uint8_t prefix[8] = {};
  size_t n = static_cast<size_t>(std::min<uint64_t>(size, 8));
  read_exactly(fd, path, prefix, n, 0);
  return with_path(path, [&] {
    uint64_t header_bytes = safetensors_header_bytes(prefix, n, size);
    std::vector<uint8_t> buffer(static_cast<size_t>(header_bytes));
    read_exactly(fd, path, buffer.data(), buffer.size(), 0);
    return parse_safetensors_header(buffer.data(), buffer.size(), size);
  });
}

std::string directory_of(const std::string& path) {
  auto slash = path.find_last_of('/');
  if (slash == std::string::npos)
    return ".";
  if (slash == 0)
    return "/";
  return path.substr(0, slash);
}

// Writes through `fill(fd, temp_path)` into a temporary file next to `path`, then makes it
// durable and renames it over `path`, so readers see the old file or the new one, never a part.
template <class Fill> void atomic_write(const std::string& path, Fill&& fill) {
  static std::atomic<uint64_t> counter{0};
  std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
  file_descriptor fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (fd.get() < 0)
    fail(error_code::io_error,
         "cannot create " + in_quotes(tmp) + " to write " + in_quotes(path) + ": " + errno_text());
  try {
    fill(fd.get(), tmp);
    if (::fsync(fd.get()) != 0)
      fail(error_code::io_error, "fsync of " + in_quotes(tmp) + " failed: " + errno_text());
    if (fd.close() != 0)
      fail(error_code::io_error, "closing " + in_quotes(tmp) + " failed: " + errno_text());
    if (::rename(tmp.c_str(), path.c_str()) != 0)
      fail(error_code::io_error,
           "cannot rename " + in_quotes(tmp) + " to " + in_quotes(path) + ": " + errno_text());
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  // Make the rename itself durable.
  file_descriptor dir(::open(directory_of(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dir.get() >= 0)
    ::fsync(dir.get());
}

} // namespace

std::string safetensors_dtype_of(at::ScalarType type) {
  switch (type) {
  case at::kDouble:
    return "F64";
  case at::kFloat:
    return "F32";
  case at::kHalf:
    return "F16";
  case at::kBFloat16:
    return "BF16";
  case at::kLong:
    return "I64";
  case at::kInt:
    return "I32";
  case at::kShort:
    return "I16";
  case at::kChar:
    return "I8";
  case at::kByte:
    return "U8";
  case at::kBool:
    return "BOOL";
  default:
    break;
  }
  fail(error_code::invalid_argument,
       std::string("safetensors: dtype ") + c10::toString(type) + " cannot be stored");
}

at::ScalarType scalar_type_of_safetensors_dtype(const std::string& dtype) {
  static const std::pair<const char*, at::ScalarType> types[] = {
      {"F64", at::kDouble}, {"F32", at::kFloat}, {"F16", at::kHalf},  {"BF16", at::kBFloat16},
      {"I64", at::kLong},   {"I32", at::kInt},   {"I16", at::kShort}, {"I8", at::kChar},
      {"U8", at::kByte},    {"BOOL", at::kBool},
  };
  for (const auto& [name, type] : types)
    if (dtype == name)
      return type;
  fail(error_code::decode_error, "safetensors: unknown dtype " + in_quotes(dtype));
}

safetensors_header read_safetensors_header(const std::string& path) {
  uint64_t size = 0;
  auto fd = open_for_reading(path, size);
  return read_header(fd.get(), path, size);
}

safetensors_file read_safetensors_file(const std::string& path, const dtype_choice& keep_as) {
  uint64_t size = 0;
  auto fd = open_for_reading(path, size);
  auto header = read_header(fd.get(), path, size);
  safetensors_file out;
  out.metadata = std::move(header.metadata);
  constexpr size_t piece_bytes = size_t{8} << 20; // of the file's data, when converting
  std::vector<char> piece;
  for (const auto& t : header.tensors) {
    const auto stored = scalar_type_of_safetensors_dtype(t.dtype);
    const auto kept = keep_as ? keep_as(t.name, stored) : stored;
    const size_t bytes = static_cast<size_t>(t.end - t.begin);
    auto tensor = at::empty(t.shape, at::TensorOptions().dtype(kept));
    if (bytes > 0 && kept == stored) {
      // Straight into the tensor's own storage: one copy, nothing tied to the file.
      read_exactly(fd.get(), path, tensor.data_ptr(), bytes, header.data_offset + t.begin);
    } else if (bytes > 0) {
      const size_t element = c10::elementSize(stored);
      const size_t per_piece = std::max<size_t>(1, piece_bytes / element);
      piece.resize(per_piece * element);
      auto flat = tensor.view({-1});
      const auto numel = static_cast<size_t>(flat.numel());
      for (size_t first = 0; first < numel; first += per_piece) {
        const size_t n = std::min(per_piece, numel - first);
        read_exactly(fd.get(), path, piece.data(), n * element,
                     header.data_offset + t.begin + first * element);
        flat.narrow(0, static_cast<int64_t>(first), static_cast<int64_t>(n))
            .copy_(at::from_blob(piece.data(), {static_cast<int64_t>(n)},
                                 at::TensorOptions().dtype(stored)));
      }
    }
    out.tensors.emplace(t.name, std::move(tensor));
  }
  return out;
}

std::map<std::string, at::Tensor> read_safetensors(const std::string& path) {
  return read_safetensors_file(path).tensors;
}

std::map<std::string, at::Tensor> read_safetensors(const std::string& path,
                                                   const dtype_choice& keep_as) {
  return read_safetensors_file(path, keep_as).tensors;
}

void write_safetensors(const std::string& path, const std::map<std::string, at::Tensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<at::Tensor> contiguous;
  std::vector<tensor_entry> entries;
  contiguous.reserve(tensors.size());
  entries.reserve(tensors.size());
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    if (name.empty())
      fail(error_code::invalid_argument, "safetensors: tensor names must not be empty");
    if (!tensor.defined())
      fail(error_code::invalid_argument,
           "safetensors: tensor " + in_quotes(name) + " is undefined");
    tensor_entry e;
    e.name = name;
    try {
      e.dtype = safetensors_dtype_of(tensor.scalar_type());
    } catch (const error& err) {
      fail(err.code(), "tensor " + in_quotes(name) + ": " + err.what());
    }
    auto c = tensor.detach().to(at::kCPU).contiguous();
    e.shape = c.sizes().vec();
    e.begin = offset;
    e.end = offset + static_cast<uint64_t>(c.nbytes());
    offset = e.end;
    entries.push_back(std::move(e));
    contiguous.push_back(std::move(c));
  }
  std::string prefix = encode_safetensors_header(entries, metadata);

  atomic_write(path, [&](int fd, const std::string& tmp) {
    write_all(fd, tmp, prefix.data(), prefix.size());
    for (const auto& c : contiguous)
      if (c.nbytes() > 0)
        write_all(fd, tmp, c.data_ptr(), c.nbytes());
  });
}

void write_file_atomically(const std::string& path, const std::string& contents) {
  atomic_write(path, [&](int fd, const std::string& tmp) {
    write_all(fd, tmp, contents.data(), contents.size());
  });
}

} // namespace rlforge::backends
