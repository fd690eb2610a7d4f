#include "service/tar_archive.hpp"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <string_view>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace rlforge::service {

tar_error::tar_error(const std::string& message) : std::runtime_error(message) {}

namespace fs = std::filesystem;

namespace {

constexpr size_t block = 512;
constexpr size_t chunk = 64 * 1024;

// ustar header layout (POSIX.1-1988): offset and width of each field.
constexpr size_t name_off = 0, name_len = 100;
constexpr size_t mode_off = 100, mode_len = 8;
constexpr size_t uid_off = 108, gid_off = 116, id_len = 8;
constexpr size_t size_off = 124, size_len = 12;
constexpr size_t mtime_off = 136, mtime_len = 12;
constexpr size_t chksum_off = 148, chksum_len = 8;
constexpr size_t type_off = 156;
constexpr size_t linkname_off = 157, linkname_len = 100;
constexpr size_t magic_off = 257;
constexpr size_t version_off = 263;
constexpr size_t prefix_off = 345, prefix_len = 155;

using header = std::array<char, block>;

[[noreturn]] void fail(const std::string& message) {
  throw tar_error("tar: " + message);
}

std::string errno_text(int err) {
  return std::strerror(err);
}

/// `s` in single quotes with bytes outside printable ASCII shown as '?', for messages.
std::string shown(std::string_view s) {
  std::string out = "'";
  for (char c : s)
    out.push_back(c >= 0x20 && c < 0x7f ? c : '?');
  out.push_back('\'');
  return out;
}

/// Closes a file descriptor at scope exit.
class fd_guard {
public:
  explicit fd_guard(int fd = -1) noexcept : fd_(fd) {}
  ~fd_guard() {
    if (fd_ >= 0)
      ::close(fd_);
  }
  fd_guard(fd_guard&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  fd_guard& operator=(fd_guard&& other) noexcept {
    std::swap(fd_, other.fd_);
    return *this;
  }
  fd_guard(const fd_guard&) = delete;
  fd_guard& operator=(const fd_guard&) = delete;
  int get() const noexcept { return fd_; }
  /// Closes now and reports close(2)'s result (where delayed write errors surface).
  int close() noexcept { return fd_ < 0 ? 0 : ::close(std::exchange(fd_, -1)); }

private:
  int fd_;
};

uint64_t padding(uint64_t size) {
  return (block - size % block) % block;
}

// ---- writer ---------------------------------------------------------------------------------

struct entry {
  fs::path path;    ///< on disk
  std::string name; ///< in the archive (directories end in '/')
  bool directory = false;
  uint64_t size = 0;
  uint32_t mode = 0;
  int64_t mtime = 0;
};

/// The directories and regular files under `dir`, sorted by name, each directory before its
/// contents. Refuses every other kind of file.
void collect(const fs::path& dir, const std::string& prefix, std::vector<entry>& out) {
  std::vector<std::string> names;
  std::error_code ec;
  for (fs::directory_iterator it{dir, ec}, end; !ec && it != end; it.increment(ec))
    names.push_back(it->path().filename().string());
  if (ec)
    fail("cannot list directory " + shown(dir.string()) + ": " + ec.message());
  std::sort(names.begin(), names.end());
  for (const auto& n : names) {
    entry e;
    e.path = dir / n;
    struct stat st {};
    if (::lstat(e.path.c_str(), &st) != 0)
      fail("cannot stat " + shown(e.path.string()) + ": " + errno_text(errno));
    e.mode = st.st_mode & 0777;
    e.mtime = st.st_mtime;
    if (S_ISDIR(st.st_mode)) {
      e.name = prefix + n + "/";
      e.directory = true;
      out.push_back(e);
      collect(e.path, e.name, out);
    } else if (S_ISREG(st.st_mode)) {
      e.name = prefix + n;
      e.size = static_cast<uint64_t>(st.st_size);
      out.push_back(e);
    } else {
      const char* kind = S_ISLNK(st.st_mode)    ? "a symbolic link"
                         : S_ISFIFO(st.st_mode) ? "a FIFO"
                         : S_ISSOCK(st.st_mode) ? "a socket"
                         : S_ISCHR(st.st_mode)  ? "a character device"
                         : S_ISBLK(st.st_mode)  ? "a block device"
                                                : "not a regular file";
      fail("cannot archive " + shown(e.path.string()) + ": it is " + kind +
           " (only directories and regular files are archived)");
    }
  }
}

std::vector<entry> collect_tree(const fs::path& dir) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0)
    fail("cannot archive " + shown(dir.string()) + ": " + errno_text(errno));
  if (!S_ISDIR(st.st_mode))
    fail("cannot archive " + shown(dir.string()) + ": it is not a directory");
  std::vector<entry> out;
  collect(dir, "", out);
  return out;
}

/// Writes `value` as zero-padded octal digits filling `len - 1` bytes plus a NUL.
void put_octal(header& h, size_t off, size_t len, uint64_t value) {
  for (size_t i = len - 1; i-- > 0;) {
    h[off + i] = static_cast<char>('0' + (value & 7));
    value >>= 3;
  }
  h[off + len - 1] = '\0';
}

/// Splits `name` into ustar's prefix and name fields, or fails naming it.
std::pair<std::string, std::string> split_name(const std::string& name) {
  if (name.size() <= name_len)
    return {"", name};
  // Split at the last '/' that leaves a prefix of at most 155 bytes and a non-empty name of at
  // most 100 bytes (a directory's trailing '/' stays in the name part).
  for (size_t p = std::min(name.size() - 1, prefix_len); p > 0; --p) {
    if (name[p] != '/')
      continue;
    size_t rest = name.size() - p - 1;
    if (rest > 0 && rest <= name_len)
      return {name.substr(0, p), name.substr(p + 1)};
    if (rest > name_len)
      break;
  }
  fail("cannot archive " + shown(name) +
       ": the path is too long for a ustar header (at most "
       "155 bytes of directories plus 100 bytes of name)");
}

header make_header(const entry& e) {
  header h{};
  auto [prefix, name] = split_name(e.name);
  std::memcpy(h.data() + name_off, name.data(), name.size());
  std::memcpy(h.data() + prefix_off, prefix.data(), prefix.size());
  put_octal(h, mode_off, mode_len, e.mode);
  put_octal(h, uid_off, id_len, 0);
  put_octal(h, gid_off, id_len, 0);
  constexpr uint64_t octal_max = (uint64_t{1} << 33) - 1; // 11 octal digits
  if (e.size <= octal_max) {
    put_octal(h, size_off, size_len, e.size);
  } else {
    // Base-256: a leading 0x80 byte, then the value big-endian in the remaining 11 bytes.
    h[size_off] = static_cast<char>(0x80);
    uint64_t v = e.size;
    for (size_t i = size_len - 1; i > 0; --i) {
      h[size_off + i] = static_cast<char>(v & 0xff);
      v >>= 8;
    }
  }
  put_octal(h, mtime_off, mtime_len,
            static_cast<uint64_t>(std::clamp<int64_t>(e.mtime, 0, int64_t{octal_max})));
  h[type_off] = e.directory ? '5' : '0';
  std::memcpy(h.data() + magic_off, "ustar", 6); // "ustar\0"
  std::memcpy(h.data() + version_off, "00", 2);
  std::memset(h.data() + chksum_off, ' ', chksum_len);
  uint64_t sum = 0;
  for (char c : h)
    sum += static_cast<unsigned char>(c);
  put_octal(h, chksum_off, 7, sum); // six digits and a NUL, then the space already there
  return h;
}

uint64_t archive_size(const std::vector<entry>& entries) {
  uint64_t total = 2 * block;
  for (const auto& e : entries)
    total += block + e.size + padding(e.size);
  return total;
}

} // namespace

uint64_t tar_archive_size(const fs::path& dir) {
  auto entries = collect_tree(dir);
  for (const auto& e : entries)
    split_name(e.name); // refuse names write_tar would refuse
  return archive_size(entries);
}

uint64_t write_tar(const fs::path& dir, const tar_sink& sink) {
  auto entries = collect_tree(dir);
  // Check every name before writing anything, so that a refused tree writes no bytes.
  for (const auto& e : entries)
    split_name(e.name);
  uint64_t written = 0;
  std::vector<char> buf(chunk);
  for (const auto& e : entries) {
    if (e.directory) {
      auto h = make_header(e);
      sink(h.data(), h.size());
      written += h.size();
      continue;
    }
    fd_guard fd{::open(e.path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC)};
    if (fd.get() < 0)
      fail("cannot read " + shown(e.path.string()) + ": " + errno_text(errno));
    // Size the header from the open file, so that a file replaced since the listing is caught.
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode))
      fail("cannot archive " + shown(e.path.string()) + ": it is no longer a regular file");
    auto h = make_header(e);
    sink(h.data(), h.size());
    written += h.size();
    uint64_t left = e.size;
    while (left > 0) {
      size_t want = static_cast<size_t>(std::min<uint64_t>(left, chunk));
      ssize_t got = ::read(fd.get(), buf.data(), want);
      if (got < 0 && errno == EINTR)
        continue;
      if (got < 0)
        fail("cannot read " + shown(e.path.string()) + ": " + errno_text(errno));
      if (got == 0)
        fail("cannot archive " + shown(e.path.string()) + ": it shrank from " +
             std::to_string(e.size) + " to " + std::to_string(e.size - left) +
             " bytes while being archived");
      sink(buf.data(), static_cast<size_t>(got));
      left -= static_cast<uint64_t>(got);
      written += static_cast<uint64_t>(got);
    }
    if (auto pad = padding(e.size); pad > 0) {
      std::memset(buf.data(), 0, pad);
      sink(buf.data(), pad);
      written += pad;
    }
  }
  std::memset(buf.data(), 0, 2 * block);
  sink(buf.data(), 2 * block);
  return written + 2 * block;
}

} // namespace rlforge::service
