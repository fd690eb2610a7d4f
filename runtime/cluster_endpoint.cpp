#include "runtime/cluster_endpoint.hpp"

#include <caf/sec.hpp>

#include "runtime/errc.hpp"

namespace rlforge::runtime {

caf::expected<endpoint> parse_endpoint(const std::string& text) {
  auto bad = [&](const std::string& why) {
    return make_error(errc::invalid_argument,
                      "'" + text + "' is not HOST:PORT (" + why + ")");
  };
  std::string host, port;
  if (!text.empty() && text.front() == '[') {
    auto close = text.find(']');
    if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':')
      return bad("an IPv6 literal is written [ADDR]:PORT");
    host = text.substr(1, close - 1);
    port = text.substr(close + 2);
  } else {
    auto colon = text.rfind(':');
    if (colon == std::string::npos)
      return bad("no port");
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
    if (host.find(':') != std::string::npos)
      return bad("write an IPv6 address as [ADDR]:PORT");
  }
  if (host.empty())
    return bad("empty host");
  if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos)
    return bad("the port must be a number in 1..65535");
  auto n = std::stoul(port);
  if (n < 1 || n > 65535)
    return bad("the port must be a number in 1..65535");
  return endpoint{host, static_cast<uint16_t>(n)};
}

std::string to_string(const endpoint& x) {
  auto host = x.host.find(':') != std::string::npos ? "[" + x.host + "]" : x.host;
  return host + ":" + std::to_string(x.port);
}

bool is_loopback(const std::string& address) {
  return address == "localhost" || address == "::1" || address.rfind("127.", 0) == 0;
}

caf::error connection_error(const caf::actor_system& sys, const caf::error& err,
                            const std::string& what) {
  if (err.category() == errc_category)
    return err;
  std::string why;
  if (err == caf::sec::cannot_connect_to_node)
    why = "nothing answers there (wrong address or port, the process is not running, or a "
          "firewall)";
  else if (err == caf::sec::disconnect_during_handshake)
    why = "the connection was closed during the handshake: the peer refused this process's "
          "TLS certificate, or one side uses TLS and the other does not (use the cluster's "
          "--tls DIR on both)";
  else if (err == caf::sec::unexpected_actor_messaging_interface)
    why = "it speaks another protocol (another rlforge build): " + sys.render(err);
  else if (err == caf::sec::no_actor_published_at_port)
    why = "nothing of rlforge is published on that port";
  else
    why = sys.render(err);
  return make_error(errc::io_error, "cannot connect to " + what + ": " + why);
}

} // namespace rlforge::runtime
