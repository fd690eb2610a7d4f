#include "service/tar_archive.hpp"

#include <gtest/gtest.h>

#include "tests/support/temp_dir.hpp"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <sys/stat.h>
#include <unistd.h>

using namespace rlforge::service;
namespace fs = std::filesystem;

namespace {

using rlforge::test_support::temp_dir;

void write_file(const fs::path& p, const std::string& content) {
  fs::create_directories(p.parent_path());
  std::ofstream out(p, std::ios::binary);
  out << content;
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// Relative path → content ("<dir>" for directories, "+x:" prefix for executable files) of
/// everything under `root`.
std::map<std::string, std::string> snapshot(const fs::path& root) {
  std::map<std::string, std::string> out;
  for (auto it = fs::recursive_directory_iterator(root); it != fs::recursive_directory_iterator();
       ++it) {
    auto rel = fs::relative(it->path(), root).string();
    if (it->is_symlink())
      out[rel] = "<symlink>";
    else if (it->is_directory())
      out[rel] = "<dir>";
    else {
      bool exec = (fs::status(it->path()).permissions() & fs::perms::owner_exec) != fs::perms::none;
      out[rel] = (exec ? "+x:" : "") + read_file(it->path());
    }
  }
  return out;
}

std::string archive_of(const fs::path& dir) {
  std::string out;
  write_tar(dir, [&](const char* p, size_t n) { out.append(p, n); });
  return out;
}

/// A source reading `bytes` in pieces of at most `piece` bytes.
tar_source source_of(const std::string& bytes, size_t piece = 1000) {
  auto pos = std::make_shared<size_t>(0);
  return [&bytes, pos, piece](char* buf, size_t size) {
    size_t n = std::min({size, piece, bytes.size() - *pos});
    std::memcpy(buf, bytes.data() + *pos, n);
    *pos += n;
    return n;
  };
}

/// A tree with nested directories, an empty directory, an empty file, an executable file and
/// a file larger than 1 MiB.
void make_tree(const fs::path& root) {
  write_file(root / "config.json", "{\"hidden_size\": 64}\n");
  write_file(root / "empty.bin", "");
  std::string big(1536 * 1024 + 7, '\0');
  for (size_t i = 0; i < big.size(); ++i)
    big[i] = static_cast<char>((i * 131 + i / 4096) % 251);
  write_file(root / "weights" / "model.safetensors", big);
  write_file(root / "weights" / "deep" / "er" / "note.txt", "nested");
  write_file(root / "run.sh", "#!/bin/sh\necho hi\n");
  fs::permissions(root / "run.sh", fs::perms::owner_exec, fs::perm_options::add);
  fs::create_directories(root / "empty_dir");
}

// ---- hand-made archives -----------------------------------------------------------------------

/// Fields of one hand-made ustar header.
struct raw_entry {
  raw_entry(std::string name_, char type_ = '0', std::string data_ = "", std::string link_ = "")
      : name(std::move(name_)), type(type_), data(std::move(data_)), link(std::move(link_)) {}
  std::string name;
  char type = '0';
  std::string data;
  std::string link;
  std::string prefix;
  std::string size_field; ///< overrides the octal size when non-empty (12 bytes)
  bool bad_checksum = false;
  std::string magic = std::string("ustar\0"
                                  "00",
                                  8);
};

/// One 512-byte ustar header built field by field, independently of the writer under test.
std::string raw_header(const raw_entry& e) {
  std::string h(512, '\0');
  auto put = [&](size_t off, const std::string& s) { std::memcpy(&h[off], s.data(), s.size()); };
  auto octal = [](uint64_t v, int width) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%0*llo", width, static_cast<unsigned long long>(v));
    return std::string(buf);
  };
  put(0, e.name.substr(0, 100));
  put(100, octal(0644, 7));
  put(108, octal(0, 7));
  put(116, octal(0, 7));
  if (e.size_field.empty())
    put(124, octal(e.data.size(), 11));
  else
    put(124, e.size_field);
  put(136, octal(1700000000, 11));
  h[156] = e.type;
  put(157, e.link);
  put(257, e.magic);
  put(345, e.prefix);
  put(148, std::string(8, ' '));
  unsigned sum = 0;
  for (unsigned char c : h)
    sum += c;
  if (e.bad_checksum)
    sum += 1;
  put(148, octal(sum, 6));
  h[154] = '\0';
  return h;
}

/// Header + data + padding of each entry, then (unless `end` is false) two zero blocks.
std::string raw_archive(const std::vector<raw_entry>& entries, bool end = true) {
  std::string out;
  for (const auto& e : entries) {
    out += raw_header(e);
    out += e.data;
    out.append((512 - e.data.size() % 512) % 512, '\0');
  }
  if (end)
    out.append(1024, '\0');
  return out;
}

/// A destination `root/dest` and a sibling `root/outside`, to check that nothing escapes.
struct sandbox {
  temp_dir root;
  fs::path dest = root.path() / "dest";
  fs::path outside = root.path() / "outside";
  sandbox() {
    fs::create_directories(dest);
    fs::create_directories(outside);
    write_file(outside / "keep.txt", "keep");
  }
  /// Everything under root except what is inside dest.
  std::map<std::string, std::string> outside_view() const {
    auto all = snapshot(root.path());
    for (auto it = all.begin(); it != all.end();)
      it = it->first.rfind("dest/", 0) == 0 ? all.erase(it) : std::next(it);
    return all;
  }
};

/// Extracting `archive` into the sandbox fails with a message containing `needle`, leaves the
/// destination empty and changes nothing outside it.
void expect_refused(const std::string& archive, const std::string& needle) {
  sandbox box;
  auto before = box.outside_view();
  try {
    extract_tar(source_of(archive), box.dest);
    ADD_FAILURE() << "archive accepted; expected an error containing '" << needle << "'";
  } catch (const tar_error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "message '" << e.what() << "' lacks '" << needle << "'";
  }
  EXPECT_EQ(box.outside_view(), before);
  EXPECT_TRUE(fs::exists(box.dest));
  EXPECT_TRUE(fs::is_empty(box.dest)) << "the refused archive left files in the destination";
  EXPECT_FALSE(fs::exists(box.root.path() / "evil.txt"));
  EXPECT_FALSE(fs::exists("/tmp/rlforge_tar_evil.txt"));
}

bool have_system_tar() {
  return std::system("tar --version > /dev/null 2>&1") == 0;
}

std::string run(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p)
    return out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0)
    out.append(buf, n);
  EXPECT_EQ(::pclose(p), 0) << cmd;
  return out;
}

} // namespace

// ---- writer + extractor -----------------------------------------------------------------------

TEST(TarArchive, RoundTripsATree) {
  temp_dir src, dst;
  make_tree(src.path());
  auto archive = archive_of(src.path());
  EXPECT_EQ(archive.size() % 512, 0u);
  EXPECT_EQ(archive.size(), tar_archive_size(src.path()));
  auto summary = extract_tar(source_of(archive, 777), dst.path() / "out");
  EXPECT_EQ(summary.files, 5u);
  EXPECT_EQ(summary.directories, 4u); // empty_dir, weights, weights/deep, weights/deep/er
  EXPECT_EQ(snapshot(dst.path() / "out"), snapshot(src.path()));
  EXPECT_EQ(fs::file_size(dst.path() / "out" / "empty.bin"), 0u);
  EXPECT_EQ(fs::file_size(dst.path() / "out" / "weights" / "model.safetensors"), 1536u * 1024 + 7);
}

TEST(TarArchive, EntriesAreSortedAndRelative) {
  temp_dir src;
  make_tree(src.path());
  auto archive = archive_of(src.path());
  std::vector<std::string> names;
  for (size_t off = 0; off + 512 <= archive.size();) {
    std::string name(archive.data() + off, strnlen(archive.data() + off, 100));
    if (name.empty())
      break;
    names.push_back(name);
    size_t size = std::strtoull(std::string(archive.data() + off + 124, 11).c_str(), nullptr, 8);
    off += 512 + (size + 511) / 512 * 512;
  }
  std::vector<std::string> expected = {"config.json",
                                       "empty.bin",
                                       "empty_dir/",
                                       "run.sh",
                                       "weights/",
                                       "weights/deep/",
                                       "weights/deep/er/",
                                       "weights/deep/er/note.txt",
                                       "weights/model.safetensors"};
  EXPECT_EQ(names, expected);
}

TEST(TarArchive, StreamsInBoundedPieces) {
  temp_dir src;
  make_tree(src.path());
  size_t pieces = 0, largest = 0, total = 0;
  auto n = write_tar(src.path(), [&](const char*, size_t size) {
    ++pieces;
    largest = std::max(largest, size);
    total += size;
  });
  EXPECT_EQ(n, total);
  EXPECT_LE(largest, 64u * 1024);
  EXPECT_GT(pieces, 24u); // the 1.5 MiB file alone takes 25 pieces
}

TEST(TarArchive, LongPathsUseThePrefixField) {
  temp_dir src, dst;
  std::string deep = std::string(60, 'a') + "/" + std::string(60, 'b') + "/" + std::string(20, 'c');
  write_file(src.path() / deep / (std::string(90, 'f') + ".txt"), "long");
  auto archive = archive_of(src.path());
  extract_tar(source_of(archive), dst.path());
  EXPECT_EQ(snapshot(dst.path()), snapshot(src.path()));
}

TEST(TarArchive, WriterRefusesNamesTooLongForUstar) {
  temp_dir src;
  write_file(src.path() / "d" / (std::string(120, 'x') + ".txt"), "x");
  size_t written = 0;
  try {
    write_tar(src.path(), [&](const char*, size_t n) { written += n; });
    ADD_FAILURE() << "no error";
  } catch (const tar_error& e) {
    EXPECT_NE(std::string(e.what()).find("too long"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("xxxx.txt"), std::string::npos) << e.what();
  }
  EXPECT_EQ(written, 0u);
  EXPECT_THROW(tar_archive_size(src.path()), tar_error);
}

TEST(TarArchive, WriterRefusesLinksAndSpecialFiles) {
  temp_dir src;
  write_file(src.path() / "a.txt", "a");
  fs::create_symlink("a.txt", src.path() / "link");
  try {
    archive_of(src.path());
    ADD_FAILURE() << "symlink archived";
  } catch (const tar_error& e) {
    EXPECT_NE(std::string(e.what()).find("/link': it is a symbolic link"), std::string::npos)
        << e.what();
  }
  fs::remove(src.path() / "link");
  ASSERT_EQ(::mkfifo((src.path() / "pipe").c_str(), 0644), 0);
  try {
    archive_of(src.path());
    ADD_FAILURE() << "FIFO archived";
  } catch (const tar_error& e) {
    EXPECT_NE(std::string(e.what()).find("/pipe': it is a FIFO"), std::string::npos) << e.what();
  }
}

TEST(TarArchive, WriterRefusesMissingOrNonDirectoryInput) {
  temp_dir src;
  EXPECT_THROW(archive_of(src.path() / "missing"), tar_error);
  write_file(src.path() / "file", "x");
  try {
    archive_of(src.path() / "file");
    ADD_FAILURE() << "no error";
  } catch (const tar_error& e) {
    EXPECT_NE(std::string(e.what()).find("not a directory"), std::string::npos) << e.what();
  }
}

TEST(TarArchive, SinkErrorsPropagate) {
  temp_dir src;
  make_tree(src.path());
  size_t calls = 0;
  EXPECT_THROW(write_tar(src.path(),
                         [&](const char*, size_t) {
                           if (++calls == 3)
                             throw std::runtime_error("client went away");
                         }),
               std::runtime_error);
  EXPECT_EQ(calls, 3u);
}

TEST(TarArchive, ExtractRefusesADestinationThatIsAFile) {
  temp_dir work;
  write_file(work.path() / "file", "x");
  auto archive = raw_archive({{"a.txt", '0', "a"}});
  try {
    extract_tar(source_of(archive), work.path() / "file");
    ADD_FAILURE() << "no error";
  } catch (const tar_error& e) {
    EXPECT_NE(std::string(e.what()).find("destination"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("/file'"), std::string::npos) << e.what();
  }
  EXPECT_EQ(read_file(work.path() / "file"), "x");
  EXPECT_THROW(extract_tar(source_of(archive), work.path() / "file" / "sub"), tar_error);
}

TEST(TarArchive, ExtractFromFile) {
  temp_dir src, work;
  make_tree(src.path());
  auto archive = archive_of(src.path());
  write_file(work.path() / "a.tar", archive);
  extract_tar_file(work.path() / "a.tar", work.path() / "x");
  EXPECT_EQ(snapshot(work.path() / "x"), snapshot(src.path()));
  try {
    extract_tar_file(work.path() / "missing.tar", work.path() / "y");
    ADD_FAILURE() << "no error";
  } catch (const tar_error& e) {
    EXPECT_NE(std::string(e.what()).find("missing.tar"), std::string::npos) << e.what();
  }
}

TEST(TarArchive, ExtractsHandMadeArchive) {
  sandbox box;
  raw_entry dir{"sub/", '5'};
  raw_entry file{"sub/f.txt", '0', "hello"};
  raw_entry nul_type{"g.txt", '\0', "old style"};
  raw_entry prefixed{"name.txt", '0', "with prefix"};
  prefixed.prefix = "pre/fix";
  raw_entry gnu{"gnu.txt", '0', "gnu magic"};
  gnu.magic = std::string("ustar  \0", 8);
  raw_entry dot{"./", '5'};
  auto summary =
      extract_tar(source_of(raw_archive({dot, dir, file, nul_type, prefixed, gnu})), box.dest);
  EXPECT_EQ(summary.files, 4u);
  EXPECT_EQ(summary.bytes, 5u + 9 + 11 + 9);
  EXPECT_EQ(read_file(box.dest / "sub" / "f.txt"), "hello");
  EXPECT_EQ(read_file(box.dest / "g.txt"), "old style");
  EXPECT_EQ(read_file(box.dest / "pre" / "fix" / "name.txt"), "with prefix");
  EXPECT_EQ(read_file(box.dest / "gnu.txt"), "gnu magic");
}

// ---- refused archives -------------------------------------------------------------------------

TEST(TarArchiveRefuses, AbsolutePaths) {
  expect_refused(raw_archive({{"/tmp/rlforge_tar_evil.txt", '0', "x"}}),
                 "'/tmp/rlforge_tar_evil.txt'");
  expect_refused(raw_archive({{"/tmp/rlforge_tar_evil.txt", '0', "x"}}), "absolute");
}

TEST(TarArchiveRefuses, DotDotComponents) {
  expect_refused(raw_archive({{"../evil.txt", '0', "x"}}), "'../evil.txt'");
  expect_refused(raw_archive({{"a/../../evil.txt", '0', "x"}}), "'..' component");
  expect_refused(raw_archive({{"ok.txt", '0', "fine"}, {"../outside/keep.txt", '0', "x"}}),
                 "'../outside/keep.txt'");
  raw_entry via_prefix{"evil.txt", '0', "x"};
  via_prefix.prefix = "..";
  expect_refused(raw_archive({via_prefix}), "'../evil.txt'");
}

TEST(TarArchiveRefuses, SymbolicAndHardLinks) {
  expect_refused(raw_archive({{"link", '2', "", "../outside"}}), "symbolic link to '../outside'");
  expect_refused(raw_archive({{"link", '2', "", "inside.txt"}}), "entry 'link'");
  expect_refused(raw_archive({{"a.txt", '0', "a"}, {"hard", '1', "", "a.txt"}}),
                 "hard link to 'a.txt'");
  expect_refused(raw_archive({{"hard", '1', "", "/etc/passwd"}}), "refused");
}

TEST(TarArchiveRefuses, DevicesFifosAndExtendedHeaders) {
  expect_refused(raw_archive({{"tty", '3'}}), "entry 'tty'");
  expect_refused(raw_archive({{"tty", '3'}}), "character device");
  expect_refused(raw_archive({{"disk", '4'}}), "block device");
  expect_refused(raw_archive({{"pipe", '6'}}), "FIFO");
  expect_refused(raw_archive({{"PaxHeaders/x", 'x', "30 path=x\n"}}), "unsupported entry type 'x'");
  expect_refused(raw_archive({{"././@LongLink", 'L', "long\n"}}), "unsupported entry type 'L'");
}

TEST(TarArchiveRefuses, MalformedHeaders) {
  raw_entry bad_sum{"a.txt", '0', "data"};
  bad_sum.bad_checksum = true;
  expect_refused(raw_archive({bad_sum}), "entry 'a.txt'");
  expect_refused(raw_archive({bad_sum}), "bad header checksum");
  raw_entry no_magic{"a.txt", '0', "data"};
  no_magic.magic = std::string(8, '\0');
  expect_refused(raw_archive({no_magic}), "no 'ustar' magic");
  raw_entry bad_digit{"a.txt", '0', "data"};
  bad_digit.size_field = "0000000009x";
  expect_refused(raw_archive({bad_digit}), "malformed size field");
  raw_entry overflow{"big.bin", '0', ""};
  overflow.size_field = std::string("\x80\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff", 12);
  expect_refused(raw_archive({overflow}), "overflows");
  raw_entry negative{"neg.bin", '0', ""};
  negative.size_field = std::string("\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xfe", 12);
  expect_refused(raw_archive({negative}), "negative base-256");
  raw_entry dir_with_size{"d/", '5'};
  dir_with_size.size_field = "00000000010";
  expect_refused(raw_archive({dir_with_size}), "directory entry with size 8");
  expect_refused(raw_archive({{"", '0', "x"}}), "empty name");
  // Random bytes are no header.
  std::string noise(1536, '\0');
  for (size_t i = 0; i < noise.size(); ++i)
    noise[i] = static_cast<char>(i * 7 + 3);
  expect_refused(noise, "checksum");
}

TEST(TarArchiveRefuses, TruncatedArchives) {
  auto full = raw_archive({{"a.txt", '0', std::string(1000, 'a')}});
  expect_refused(full.substr(0, 512 + 100), "entry 'a.txt' declares 1000 bytes");
  expect_refused(full.substr(0, 300), "truncated archive: a header at byte 0 has only 300");
  expect_refused(full.substr(0, 512 + 1000), "padding after entry 'a.txt'");
  expect_refused(raw_archive({{"a.txt", '0', "a"}}, false), "without an end-of-archive block");
  expect_refused("", "without an end-of-archive block");
}

TEST(TarArchiveRefuses, OverwritingAndWritingThroughLinks) {
  // An existing file is never overwritten.
  {
    sandbox box;
    write_file(box.dest / "exists.txt", "original");
    EXPECT_THROW(extract_tar(source_of(raw_archive({{"exists.txt", '0', "new"}})), box.dest),
                 tar_error);
    EXPECT_EQ(read_file(box.dest / "exists.txt"), "original");
  }
  // A symlink planted in the destination is never followed.
  {
    sandbox box;
    fs::create_directory_symlink(box.outside, box.dest / "link");
    auto before = box.outside_view();
    try {
      extract_tar(source_of(raw_archive({{"link/evil.txt", '0', "x"}})), box.dest);
      ADD_FAILURE() << "wrote through a symlink";
    } catch (const tar_error& e) {
      EXPECT_NE(std::string(e.what()).find("'link/evil.txt'"), std::string::npos) << e.what();
    }
    EXPECT_FALSE(fs::exists(box.outside / "evil.txt"));
    EXPECT_EQ(box.outside_view(), before);
    fs::create_symlink(box.outside / "keep.txt", box.dest / "file_link");
    EXPECT_THROW(extract_tar(source_of(raw_archive({{"file_link", '0', "x"}})), box.dest),
                 tar_error);
    EXPECT_EQ(read_file(box.outside / "keep.txt"), "keep");
  }
  // A file where a directory is needed.
  {
    sandbox box;
    write_file(box.dest / "f", "x");
    EXPECT_THROW(extract_tar(source_of(raw_archive({{"f/g.txt", '0', "x"}})), box.dest), tar_error);
  }
}

TEST(TarArchiveRefuses, RemovesWhatItCreatedBeforeTheBadEntry) {
  sandbox box;
  write_file(box.dest / "pre-existing.txt", "mine");
  fs::create_directories(box.dest / "old_dir");
  auto archive = raw_archive({{"old_dir/", '5'},
                              {"old_dir/new.txt", '0', "new"},
                              {"fresh/deep/", '5'},
                              {"fresh/deep/file.bin", '0', std::string(2000, 'z')},
                              {"link", '2', "", "/etc"}});
  EXPECT_THROW(extract_tar(source_of(archive), box.dest), tar_error);
  std::map<std::string, std::string> expected = {{"old_dir", "<dir>"},
                                                 {"pre-existing.txt", "mine"}};
  EXPECT_EQ(snapshot(box.dest), expected);
  // A destination the call created is removed again too.
  EXPECT_THROW(extract_tar(source_of(archive), box.root.path() / "new" / "dest"), tar_error);
  EXPECT_FALSE(fs::exists(box.root.path() / "new"));
}

TEST(TarArchiveRefuses, LimitsOnEntriesAndBytes) {
  auto archive = raw_archive({{"a", '0', "12345"}, {"b", '0', "67890"}});
  {
    sandbox box;
    tar_extract_limits limits;
    limits.max_entries = 1;
    try {
      extract_tar(source_of(archive), box.dest, limits);
      ADD_FAILURE() << "no error";
    } catch (const tar_error& e) {
      EXPECT_NE(std::string(e.what()).find("more than 1 entries"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(fs::is_empty(box.dest));
  }
  {
    sandbox box;
    tar_extract_limits limits;
    limits.max_total_bytes = 9;
    try {
      extract_tar(source_of(archive), box.dest, limits);
      ADD_FAILURE() << "no error";
    } catch (const tar_error& e) {
      EXPECT_NE(std::string(e.what()).find("limit of 9 bytes"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(fs::is_empty(box.dest));
    limits.max_total_bytes = 10;
    EXPECT_EQ(extract_tar(source_of(archive), box.dest, limits).bytes, 10u);
  }
}

TEST(TarArchiveRefuses, SourceErrorsPropagate) {
  sandbox box;
  auto archive = raw_archive({{"a.txt", '0', std::string(4000, 'a')}});
  size_t served = 0;
  tar_source failing = [&](char* buf, size_t size) -> size_t {
    if (served >= 1024)
      throw std::runtime_error("connection reset");
    size_t n = std::min<size_t>(size, 512);
    std::memcpy(buf, archive.data() + served, n);
    served += n;
    return n;
  };
  EXPECT_THROW(extract_tar(failing, box.dest), std::runtime_error);
  EXPECT_TRUE(fs::is_empty(box.dest));
}

TEST(TarArchiveRefuses, SourceReturningMoreThanAskedFor) {
  sandbox box;
  auto archive = raw_archive({{"a.txt", '0', "a"}});
  tar_source liar = [&](char* buf, size_t size) -> size_t {
    std::memcpy(buf, archive.data(), std::min(size, archive.size()));
    return size + 1;
  };
  try {
    extract_tar(liar, box.dest);
    ADD_FAILURE() << "no error";
  } catch (const tar_error& e) {
    EXPECT_NE(std::string(e.what()).find("returned 513 bytes for a buffer of 512"),
              std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(fs::is_empty(box.dest));
}

// ---- the system tar ---------------------------------------------------------------------------

TEST(TarArchiveSystemTar, ListsAndExtractsOurArchive) {
  if (!have_system_tar())
    GTEST_SKIP() << "no tar binary on PATH";
  temp_dir src, work;
  make_tree(src.path());
  std::string deep = std::string(60, 'a') + "/" + std::string(60, 'b') + "/" + std::string(20, 'c');
  write_file(src.path() / deep / (std::string(90, 'f') + ".txt"), "long");
  auto tar_file = work.path() / "ours.tar";
  write_file(tar_file, archive_of(src.path()));
  auto listing = run("tar -tf '" + tar_file.string() + "'");
  EXPECT_NE(listing.find("weights/model.safetensors\n"), std::string::npos) << listing;
  EXPECT_NE(listing.find("empty_dir/\n"), std::string::npos) << listing;
  EXPECT_NE(listing.find(deep + "/" + std::string(90, 'f') + ".txt\n"), std::string::npos)
      << listing;
  fs::create_directories(work.path() / "x");
  run("tar -xf '" + tar_file.string() + "' -C '" + (work.path() / "x").string() + "'");
  EXPECT_EQ(snapshot(work.path() / "x"), snapshot(src.path()));
}

TEST(TarArchiveSystemTar, ExtractsArchiveOfSystemTar) {
  if (!have_system_tar())
    GTEST_SKIP() << "no tar binary on PATH";
  temp_dir src, work;
  make_tree(src.path());
  auto tar_file = work.path() / "theirs.tar";
  run("tar --format=ustar -cf '" + tar_file.string() + "' -C '" + src.path().string() + "' .");
  extract_tar_file(tar_file, work.path() / "x");
  EXPECT_EQ(snapshot(work.path() / "x"), snapshot(src.path()));
}
