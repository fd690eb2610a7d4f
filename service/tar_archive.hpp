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

/// Fills `buf` with up to `size` bytes of the archive and returns how many; 0 means the end of
/// the archive. It may throw to abort the extractor (the exception propagates unchanged).
using tar_source = std::function<size_t(char* buf, size_t size)>;

/// Streams the tree under `dir` to `sink` as an uncompressed POSIX ustar archive and returns the
/// number of bytes written (always `tar_archive_size(dir)` when the tree did not change).
///
/// Entries are the tree's directories and regular files with paths relative to `dir` (no "./"
/// prefix; directory names end in '/'), in lexicographic order, depth first; `dir` itself is not
/// an entry. Each file is read in 64 KiB pieces, never whole. Headers carry the permission bits
/// (mode & 0777), the modification time, uid/gid 0 and no user/group names. Sizes of 8 GiB and
/// more use the base-256 size encoding (read by GNU tar, bsdtar and `extract_tar`). The archive
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

/// Limits for `extract_tar`.
struct tar_extract_limits {
  uint64_t max_total_bytes = std::numeric_limits<uint64_t>::max(); ///< sum of file sizes
  uint64_t max_entries = std::numeric_limits<uint64_t>::max();     ///< files + directories
};

/// What `extract_tar` created.
struct tar_extract_summary {
  uint64_t files = 0;
  uint64_t directories = 0;
  uint64_t bytes = 0; ///< sum of file sizes
};

/// Extracts the ustar archive read from `source` into `dest` (created, with its parents, when
/// absent). Accepts regular files ('0', NUL; '7' is read as a regular file) and directories
/// ('5'), with octal or base-256 sizes, in POSIX ("ustar\0" "00") or GNU ("ustar  \0") headers.
/// Extracted files get mode 0644, or 0755 when the entry has any execute bit; directories 0755;
/// owners and times are not restored.
///
/// Refuses, with a `tar_error` naming the entry, and before writing anything for it:
/// - every hard link and symbolic link (all links are refused, wherever they point: a checkpoint
///   never needs one, and refusing them all leaves nothing to get wrong);
/// - character and block devices, FIFOs, and every other type (PAX 'x'/'g' and GNU 'L'/'K'
///   extended headers included);
/// - an empty name, an absolute name, or a name with a ".." component;
/// - a header with a bad checksum, no "ustar" magic, a malformed or overflowing number field, or
///   a directory entry with a non-zero size;
/// - an entry whose path exists already as a file, or whose parent is not a directory (a
///   symlink planted in `dest` included): nothing is ever overwritten or written through a link;
/// - more than `limits.max_entries` entries or `limits.max_total_bytes` bytes of files.
/// Also fails on a truncated archive (a short header, short file data, or a missing
/// end-of-archive zero block). Reading stops at the first zero block.
///
/// Nothing is ever written outside `dest`. On any failure every file and directory this call
/// created is removed again (directories that existed before are left), so `dest` looks as
/// before the call; then the error propagates.
tar_extract_summary extract_tar(const tar_source& source, const std::filesystem::path& dest,
                                const tar_extract_limits& limits = {});

/// `extract_tar` reading the archive file `archive`; also throws `tar_error` when it cannot be
/// opened or read.
tar_extract_summary extract_tar_file(const std::filesystem::path& archive,
                                     const std::filesystem::path& dest,
                                     const tar_extract_limits& limits = {});

} // namespace rlforge::service
