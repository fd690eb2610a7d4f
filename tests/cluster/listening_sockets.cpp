#include "tests/cluster/listening_sockets.hpp"

#include <arpa/inet.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

namespace rlforge::cluster_test {

namespace {

/// The inodes of the sockets among `pid`'s file descriptors ("socket:[123]" links).
std::set<std::string> socket_inodes(pid_t pid) {
  std::set<std::string> out;
  std::error_code ec;
  auto dir = "/proc/" + std::to_string(pid) + "/fd";
  for (std::filesystem::directory_iterator i{dir, ec}, end; !ec && i != end; i.increment(ec)) {
    auto target = std::filesystem::read_symlink(i->path(), ec);
    if (ec) {
      ec.clear(); // a descriptor closed while we read
      continue;
    }
    auto t = target.string();
    if (t.rfind("socket:[", 0) == 0 && t.back() == ']')
      out.insert(t.substr(8, t.size() - 9));
  }
  return out;
}

/// A /proc/net/tcp{,6} local address: hex words in host byte order, then ":" and the hex port.
listening_socket parse_local(const std::string& local, bool v6) {
  listening_socket s;
  auto colon = local.find(':');
  auto hex = local.substr(0, colon);
  s.port = static_cast<uint16_t>(std::stoul(local.substr(colon + 1), nullptr, 16));
  unsigned char raw[16] = {};
  const size_t words = v6 ? 4 : 1;
  for (size_t w = 0; w < words; ++w) {
    auto word = static_cast<uint32_t>(std::stoul(hex.substr(w * 8, 8), nullptr, 16));
    for (size_t b = 0; b < 4; ++b) // the kernel prints each 32-bit word in host (little) order
      raw[w * 4 + b] = static_cast<unsigned char>(word >> (8 * b));
  }
  char text[INET6_ADDRSTRLEN] = {};
  inet_ntop(v6 ? AF_INET6 : AF_INET, raw, text, sizeof(text));
  s.address = text;
  s.wildcard = true;
  for (size_t i = 0; i < words * 4; ++i)
    if (raw[i] != 0)
      s.wildcard = false;
  return s;
}

} // namespace

std::vector<listening_socket> listening_sockets(pid_t pid) {
  auto inodes = socket_inodes(pid);
  std::vector<listening_socket> out;
  for (bool v6 : {false, true}) {
    std::ifstream in{"/proc/" + std::to_string(pid) + "/net/" + (v6 ? "tcp6" : "tcp")};
    std::string line;
    std::getline(in, line); // header
    while (std::getline(in, line)) {
      std::istringstream fields{line};
      std::string slot, local, remote, state, queues, timer, retransmits, uid, timeout, inode;
      fields >> slot >> local >> remote >> state >> queues >> timer >> retransmits >> uid >>
        timeout >> inode;
      if (state == "0A" && inodes.count(inode)) // 0A: TCP_LISTEN
        out.push_back(parse_local(local, v6));
    }
  }
  return out;
}

std::string describe(const std::vector<listening_socket>& sockets) {
  std::string out;
  for (auto& s : sockets) {
    auto address = s.address.find(':') == std::string::npos ? s.address : "[" + s.address + "]";
    out += (out.empty() ? "" : ", ") + address + ":" + std::to_string(s.port);
  }
  return out.empty() ? "none" : out;
}

} // namespace rlforge::cluster_test
