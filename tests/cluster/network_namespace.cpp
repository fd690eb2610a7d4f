#include "tests/cluster/network_namespace.hpp"

#include <unistd.h>

#include <cstdlib>

namespace rlforge::cluster_test {

namespace {

int run(const std::string& cmd) {
  return std::system((cmd + " >/dev/null 2>&1").c_str());
}

} // namespace

network_namespace::network_namespace(int index) {
  auto id = std::to_string(::getpid() % 100000) + "x" + std::to_string(index);
  name = "rlfns" + id;
  host_if = "rlfh" + id;
  auto subnet = "10." + std::to_string(213 + index) + "." + std::to_string(::getpid() % 250) + ".";
  host_ip = subnet + "1";
  node_ip = subnet + "2";
  auto node_if = "rlfn" + id;
  created = run("ip netns add " + name) == 0;
  ok = created && run("ip link add " + host_if + " type veth peer name " + node_if) == 0 &&
       run("ip link set " + node_if + " netns " + name) == 0 &&
       run("ip addr add " + host_ip + "/24 dev " + host_if) == 0 &&
       run("ip link set " + host_if + " up") == 0 &&
       run("ip netns exec " + name + " ip addr add " + node_ip + "/24 dev " + node_if) == 0 &&
       run("ip netns exec " + name + " ip link set " + node_if + " up") == 0 &&
       run("ip netns exec " + name + " ip link set lo up") == 0;
}

network_namespace::~network_namespace() {
  run("ip link del " + host_if);
  run("ip netns del " + name);
}

std::string missing_requirement() {
  if (::geteuid() != 0)
    return "root (creating a network namespace needs CAP_SYS_ADMIN)";
  if (run("ip -V") != 0)
    return "the ip command (iproute2)";
  return {};
}

} // namespace rlforge::cluster_test
