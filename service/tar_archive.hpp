#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>

namespace rlforge::service {

/// The one exception the tar functions throw. The message names the archive entry or the file
/// and what is wrong with it.
class tar_error : public std::runtime_error {
public:
  explicit tar_error(const std::string& message);
};

/// Receives the archive bytes in order, in pieces of at most 64 KiB. It may throw to abort the
/// writer (the exception propagates unchanged).
using tar_sink = std::function<void(const char* data, size_t size)>;

/// Streams the tree under `dir` to `sink` as an uncompressed POSIX ustar archive and returns the
/// number of bytes written (always `tar_archive_size(dir)` when the tree did not change).
///
/// Entries are the tree's directories and regular files with paths relative to `dir` (no "./"
/// prefix; directory names end in '/'), in lexicographic order, depth first; `dir` itself is not
/// an entry. Each file is read in 64 KiB pieces, never whole. Headers carry the permission bits
/// (mode & 0777), the modification time, uid/gid 0 and no user/group names. Sizes of 8 GiB and
/// more use the base-256 size encoding (read by GNU tar and bsdtar). The archive
/// ends with two zero blocks.
///
/// Throws `tar_error` when `dir` is not a directory, when the tree holds anything other than
/// directories and regular files (a symlink, a FIFO, a socket, a device), when a path does not
/// fit ustar's 155-byte prefix + 100-byte name, or when a file cannot be read or shrank while it
/// was being archived (bytes already given to `sink` then form a truncated archive).
uint64_t write_tar(const std::filesystem::path& dir, const tar_sink& sink);

/// The size in bytes of the archive `write_tar(dir, ...)` writes, for a Content-Length. Throws
/// as `write_tar` for a tree it would refuse.
uint64_t tar_archive_size(const std::filesystem::path& dir);

} // namespace rlforge::service
