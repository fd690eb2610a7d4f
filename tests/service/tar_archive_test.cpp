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

// ---- writer -------------------------------------------------------------------------------------

TEST(TarArchive, ItsSizeIsKnownBeforeWriting) {
  temp_dir src;
  make_tree(src.path());
  auto archive = archive_of(src.path());
  EXPECT_EQ(archive.size() % 512, 0u);
  EXPECT_EQ(archive.size(), tar_archive_size(src.path()));
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

