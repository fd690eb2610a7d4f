#pragma once
// A fresh directory under the system temp dir for the service tests (no torch here, so not
// tests/backends' guard), removed with its contents at scope exit.
#include <atomic>
#include <filesystem>
#include <string>
#include <system_error>

#include <unistd.h>

namespace rlforge::service::testing {

class temp_dir {
public:
  /// `<tmp>/rlforge_<tag>_<pid>_<n>`, empty.
  explicit temp_dir(const std::string& tag) {
    static std::atomic<int> counter{0};
    path_ = std::filesystem::temp_directory_path() /
            ("rlforge_" + tag + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~temp_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  /// The path of `name` inside the directory.
  std::string file(const std::string& name) const { return (path_ / name).string(); }

private:
  std::filesystem::path path_;
};

} // namespace rlforge::service::testing
