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

// ---- extractor ------------------------------------------------------------------------------

/// Pulls exact byte counts out of a `tar_source`.
class reader {
public:
  explicit reader(const tar_source& src) : src_(src) {}

  /// Reads up to `n` bytes, fewer only at the end of the archive.
  size_t read(char* out, size_t n) {
    size_t got = 0;
    while (got < n) {
      size_t k = src_(out + got, n - got);
      if (k == 0)
        break;
      if (k > n - got)
        fail("the archive source returned " + std::to_string(k) + " bytes for a buffer of " +
             std::to_string(n - got));
      got += k;
    }
    offset_ += got;
    return got;
  }

  uint64_t offset() const noexcept { return offset_; }

private:
  const tar_source& src_;
  uint64_t offset_ = 0;
};

std::string field_text(const header& h, size_t off, size_t len) {
  const char* p = h.data() + off;
  return std::string(p, strnlen(p, len));
}

/// Parses a numeric header field: octal digits, optionally led by spaces and ended by a space or
/// NUL, or the base-256 form (leading byte 0x80). Fails naming the entry and the field.
uint64_t parse_number(const header& h, size_t off, size_t len, const char* field,
                      const std::string& entry_name) {
  auto bad = [&](const std::string& why) {
    fail("entry " + shown(entry_name) + ": malformed " + field + " field (" + why + ")");
  };
  auto byte = [&](size_t i) { return static_cast<unsigned char>(h[off + i]); };
  if (byte(0) & 0x80) {
    if (byte(0) != 0x80)
      bad("negative base-256 number");
    uint64_t v = 0;
    for (size_t i = 1; i < len; ++i) {
      if (v > (uint64_t{INT64_MAX} >> 8))
        bad("the value overflows 63 bits");
      v = (v << 8) | byte(i);
    }
    return v;
  }
  size_t i = 0;
  while (i < len && byte(i) == ' ')
    ++i;
  size_t digits = 0;
  uint64_t v = 0;
  for (; i < len && byte(i) >= '0' && byte(i) <= '7'; ++i, ++digits) {
    if (v > (uint64_t{INT64_MAX} >> 3))
      bad("the value overflows 63 bits");
    v = (v << 3) | (byte(i) - '0');
  }
  if (digits == 0)
    bad("no octal digits");
  for (; i < len; ++i)
    if (byte(i) != ' ' && byte(i) != '\0')
      bad("unexpected byte " + std::to_string(byte(i)) + " after the digits");
  return v;
}

/// A name split into its components; "." and empty components dropped.
std::vector<std::string> components(const std::string& name) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= name.size()) {
    size_t end = name.find('/', start);
    if (end == std::string::npos)
      end = name.size();
    auto part = name.substr(start, end - start);
    if (!part.empty() && part != ".")
      out.push_back(std::move(part));
    start = end + 1;
  }
  return out;
}

/// Everything one `extract_tar` call created, removed again unless `release` ran.
class undo_log {
public:
  ~undo_log() {
    for (auto it = created_.rbegin(); it != created_.rend(); ++it) {
      if (it->second)
        ::rmdir(it->first.c_str());
      else
        ::unlink(it->first.c_str());
    }
  }
  void add(fs::path p, bool directory) { created_.emplace_back(std::move(p), directory); }
  void release() noexcept { created_.clear(); }

private:
  std::vector<std::pair<fs::path, bool>> created_;
};

/// Opens the directory `parts[0..n)` below `root_fd`, creating missing ones (logged in `undo`).
/// Every component is opened with O_NOFOLLOW: a symlink anywhere on the way is refused, so no
/// write can leave the destination.
fd_guard open_dirs(int root_fd, const fs::path& dest, const std::vector<std::string>& parts,
                   size_t n, const std::string& entry_name, undo_log& undo) {
  fd_guard cur{::dup(root_fd)};
  if (cur.get() < 0)
    fail("entry " + shown(entry_name) + ": dup: " + errno_text(errno));
  fs::path path = dest;
  for (size_t i = 0; i < n; ++i) {
    path /= parts[i];
    int fd = ::openat(cur.get(), parts[i].c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT) {
      if (::mkdirat(cur.get(), parts[i].c_str(), 0755) != 0)
        fail("entry " + shown(entry_name) + ": cannot create directory " + shown(path.string()) +
             ": " + errno_text(errno));
      undo.add(path, true);
      fd = ::openat(cur.get(), parts[i].c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    }
    if (fd < 0) {
      int err = errno;
      if (err == ENOTDIR || err == ELOOP)
        fail("entry " + shown(entry_name) + ": " + shown(path.string()) +
             " exists and is not a directory (or is a symbolic link); refusing to write "
             "through it");
      fail("entry " + shown(entry_name) + ": cannot open directory " + shown(path.string()) + ": " +
           errno_text(err));
    }
    cur = fd_guard{fd};
  }
  return cur;
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

tar_extract_summary extract_tar(const tar_source& source, const fs::path& dest,
                                const tar_extract_limits& limits) {
  undo_log undo;
  // Create the destination (and missing parents), logging what this call made.
  {
    std::vector<fs::path> missing;
    for (fs::path p = dest; !p.empty(); p = p.parent_path()) {
      struct stat st {};
      if (::lstat(p.c_str(), &st) == 0)
        break;
      missing.push_back(p);
      if (p == p.parent_path())
        break;
    }
    for (auto it = missing.rbegin(); it != missing.rend(); ++it) {
      if (::mkdir(it->c_str(), 0755) != 0)
        fail("cannot create destination " + shown(it->string()) + ": " + errno_text(errno));
      undo.add(*it, true);
    }
  }
  fd_guard root{::open(dest.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  if (root.get() < 0)
    fail("cannot open destination " + shown(dest.string()) + ": " + errno_text(errno));

  reader in{source};
  tar_extract_summary summary;
  uint64_t entries = 0;
  std::vector<char> buf(chunk);
  for (;;) {
    header h{};
    uint64_t at = in.offset();
    size_t got = in.read(h.data(), block);
    if (got == 0)
      fail("truncated archive: it ends at byte " + std::to_string(at) +
           " without an end-of-archive block");
    if (got < block)
      fail("truncated archive: a header at byte " + std::to_string(at) + " has only " +
           std::to_string(got) + " of 512 bytes");
    if (std::all_of(h.begin(), h.end(), [](char c) { return c == 0; }))
      break;

    bool gnu = std::memcmp(h.data() + magic_off, "ustar  \0", 8) == 0;
    bool posix = std::memcmp(h.data() + magic_off, "ustar\0", 6) == 0;
    std::string name = field_text(h, name_off, name_len);
    std::string prefix = posix ? field_text(h, prefix_off, prefix_len) : "";
    if (!prefix.empty())
      name = prefix + "/" + name;
    std::string where = " (header at byte " + std::to_string(at) + ")";

    uint64_t stored_sum = parse_number(h, chksum_off, chksum_len, "checksum", name);
    uint64_t unsigned_sum = 0;
    int64_t signed_sum = 0;
    for (size_t i = 0; i < block; ++i) {
      bool in_field = i >= chksum_off && i < chksum_off + chksum_len;
      unsigned char u = in_field ? ' ' : static_cast<unsigned char>(h[i]);
      unsigned_sum += u;
      signed_sum += in_field ? ' ' : static_cast<signed char>(h[i]);
    }
    if (stored_sum != unsigned_sum && static_cast<int64_t>(stored_sum) != signed_sum)
      fail("entry " + shown(name) + where + ": bad header checksum (stored " +
           std::to_string(stored_sum) + ", computed " + std::to_string(unsigned_sum) + ")");
    if (!gnu && !posix)
      fail("entry " + shown(name) + where + ": not a ustar header (no 'ustar' magic)");

    char type = h[type_off];
    std::string link = field_text(h, linkname_off, linkname_len);
    switch (type) {
    case '0':
    case '\0':
    case '7':
    case '5':
      break;
    case '1':
      fail("entry " + shown(name) + where + ": hard link to " + shown(link) +
           " refused (archives may not contain links)");
    case '2':
      fail("entry " + shown(name) + where + ": symbolic link to " + shown(link) +
           " refused (archives may not contain links)");
    case '3':
      fail("entry " + shown(name) + where + ": character device refused");
    case '4':
      fail("entry " + shown(name) + where + ": block device refused");
    case '6':
      fail("entry " + shown(name) + where + ": FIFO refused");
    default:
      fail("entry " + shown(name) + where + ": unsupported entry type " + shown({&type, 1}) +
           " (only regular files and directories; no PAX or GNU extended headers)");
    }
    bool directory = type == '5';
    uint64_t size = parse_number(h, size_off, size_len, "size", name);
    uint64_t mode = parse_number(h, mode_off, mode_len, "mode", name);

    if (name.empty())
      fail("entry at byte " + std::to_string(at) + " has an empty name");
    if (name.front() == '/')
      fail("entry " + shown(name) + where + ": absolute paths are refused");
    auto parts = components(name);
    if (std::find(parts.begin(), parts.end(), "..") != parts.end())
      fail("entry " + shown(name) + where + ": paths with a '..' component are refused");
    if (parts.empty() && !directory)
      fail("entry " + shown(name) + where + ": a file entry needs a name");
    if (directory && size != 0)
      fail("entry " + shown(name) + where + ": a directory entry with size " +
           std::to_string(size));
    if (++entries > limits.max_entries)
      fail("entry " + shown(name) + where + ": the archive has more than " +
           std::to_string(limits.max_entries) + " entries");
    if (!directory && size > limits.max_total_bytes - summary.bytes)
      fail("entry " + shown(name) + where + ": the files exceed the limit of " +
           std::to_string(limits.max_total_bytes) + " bytes");

    if (directory) {
      // "./" names the destination itself.
      open_dirs(root.get(), dest, parts, parts.size(), name, undo);
      ++summary.directories;
      continue;
    }
    auto parent = open_dirs(root.get(), dest, parts, parts.size() - 1, name, undo);
    fs::path target = dest;
    for (const auto& p : parts)
      target /= p;
    mode_t file_mode = (mode & 0111) ? 0755 : 0644;
    fd_guard out{::openat(parent.get(), parts.back().c_str(),
                          O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, file_mode)};
    if (out.get() < 0) {
      int err = errno;
      if (err == EEXIST)
        fail("entry " + shown(name) + where + ": " + shown(target.string()) +
             " exists already (extraction never overwrites)");
      fail("entry " + shown(name) + where + ": cannot create " + shown(target.string()) + ": " +
           errno_text(err));
    }
    undo.add(target, false);
    uint64_t left = size;
    while (left > 0) {
      size_t want = static_cast<size_t>(std::min<uint64_t>(left, chunk));
      size_t n = in.read(buf.data(), want);
      if (n < want)
        fail("truncated archive: entry " + shown(name) + " declares " + std::to_string(size) +
             " bytes, the archive ends after " + std::to_string(size - left + n));
      for (size_t off = 0; off < n;) {
        ssize_t w = ::write(out.get(), buf.data() + off, n - off);
        if (w < 0 && errno == EINTR)
          continue;
        if (w < 0)
          fail("entry " + shown(name) + ": cannot write " + shown(target.string()) + ": " +
               errno_text(errno));
        off += static_cast<size_t>(w);
      }
      left -= n;
    }
    if (auto pad = padding(size); pad > 0 && in.read(buf.data(), pad) < pad)
      fail("truncated archive: the padding after entry " + shown(name) + " is missing");
    if (out.close() != 0)
      fail("entry " + shown(name) + ": cannot write " + shown(target.string()) + ": " +
           errno_text(errno));
    ++summary.files;
    summary.bytes += size;
  }
  undo.release();
  return summary;
}

tar_extract_summary extract_tar_file(const fs::path& archive, const fs::path& dest,
                                     const tar_extract_limits& limits) {
  fd_guard fd{::open(archive.c_str(), O_RDONLY | O_CLOEXEC)};
  if (fd.get() < 0)
    fail("cannot open archive " + shown(archive.string()) + ": " + errno_text(errno));
  tar_source source = [&](char* buf, size_t size) -> size_t {
    for (;;) {
      ssize_t n = ::read(fd.get(), buf, size);
      if (n >= 0)
        return static_cast<size_t>(n);
      if (errno != EINTR)
        fail("cannot read archive " + shown(archive.string()) + ": " + errno_text(errno));
    }
  };
  return extract_tar(source, dest, limits);
}

} // namespace rlforge::service
